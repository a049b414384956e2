"""Timing helpers shared by the benchmarks: CUDA-event medians, dense baselines, the header of a results file."""

from __future__ import annotations

import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from elastic_attention.units import parse_length
from elastic_attention.errors import InputError
from elastic_attention.io import atomic_write_text


def timed(function, device: torch.device, repeats: int, warmup: int = 2) -> float:
    """Median seconds of ``function()`` over ``repeats`` runs after ``warmup`` (CUDA events on a GPU)."""
    for _ in range(warmup):
        function()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            function()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / 1000)
        else:
            began = time.perf_counter()
            function()
            samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def dense_baselines(query, key, value, device: torch.device, repeats: int) -> dict:
    """Seconds of dense causal attention.

    On CUDA: SDPA's cuDNN and flash backends, each timed (``dense_cudnn_s``, ``dense_flash_s``; a backend that
    refuses the shape is left out), ``dense_sdpa_s`` the faster of them, and flash-attn-4 when installed
    (``dense_fa4_s``). Elsewhere: SDPA as torch dispatches it (``dense_sdpa_s``).
    """
    def sdpa():
        return F.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)

    result = {}
    if device.type == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends = {"dense_cudnn_s": SDPBackend.CUDNN_ATTENTION, "dense_flash_s": SDPBackend.FLASH_ATTENTION}
        for name, backend in backends.items():
            try:
                with sdpa_kernel([backend]):
                    result[name] = timed(sdpa, device, repeats)
            except RuntimeError:  # "No available kernel": this backend does not take the shape or dtype
                continue
        result["dense_sdpa_s"] = min(result.values()) if result else timed(sdpa, device, repeats)
        from elastic_attention.backends.fa4 import fa4_available

        if fa4_available()[0]:
            from flash_attn.cute import flash_attn_func

            q, k, v = (t.transpose(1, 2) for t in (query, key, value))
            result["dense_fa4_s"] = timed(lambda: flash_attn_func(q, k, v, causal=True), device, repeats)
    else:
        result["dense_sdpa_s"] = timed(sdpa, device, repeats)
    return result


def copy_bandwidth(device: torch.device, gib: float = 2.0, repeats: int = 10) -> float:
    """Bytes per second a device-to-device copy of ``gib`` GiB moves (bytes read plus bytes written), the median of
    ``repeats``: the bandwidth bound of a memory-bound step."""
    source = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    seconds = timed(lambda: target.copy_(source), device, repeats)
    return 2 * source.numel() / seconds


def parse_tokens(text: str) -> list[int]:
    """``"8k,32k,1000,1m"`` -> [8192, 32768, 1000, 1048576] (each read by `units.parse_length`)."""
    return [parse_length(part) for part in text.split(",")]


def run_header(device: torch.device) -> dict:
    """Date, device (on a CPU also its processor), versions and command of a benchmark run."""
    header = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
    }
    if device.type == "cpu":
        header["processor"] = processor_name()
    return header


def processor_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_result(path: Path, result: dict) -> None:
    """Write ``result`` as indented JSON, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(result, indent=2))


class TokenClock:
    """A logits processor that stamps the time of each generated token (after synchronizing the device)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.stamps, self.started = device, [], 0.0

    def start(self) -> None:
        self.stamps = []
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.started = time.perf_counter()

    def __call__(self, input_ids, scores):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.stamps.append(time.perf_counter() - self.started)
        return scores

    def timings(self, batch: int) -> dict:
        """``ttft_s`` (the first stamp), ``decode_s`` (first stamp to last), ``decode_tokens_per_s`` (``batch`` x
        the tokens after the first, over ``decode_s``), and what the decode time is made of: ``first_step_s`` (first
        stamp to second: the first decode step, which also sets up what the later steps reuse, such as a captured
        graph and its static storage) and ``median_step_s`` (the median of the later steps; None before a third
        token), with ``steady_decode_tokens_per_s`` (``batch`` over it)."""
        decode_s = self.stamps[-1] - self.stamps[0]
        steps = [later - earlier for earlier, later in zip(self.stamps[1:], self.stamps[2:])]
        median_step_s = statistics.median(steps) if steps else None
        return {"ttft_s": self.stamps[0], "decode_s": decode_s,
                "decode_tokens_per_s": batch * (len(self.stamps) - 1) / decode_s if decode_s > 0 else float("nan"),
                "first_step_s": self.stamps[1] - self.stamps[0] if len(self.stamps) > 1 else None,
                "median_step_s": median_step_s,
                "steady_decode_tokens_per_s": batch / median_step_s if median_step_s else None}


def timed_generate(model, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int, pad_id: int, *,
                   exact: bool = True, **generate_kwargs) -> dict:
    """One greedy `generate` after ``ids`` [B, S] (``mask`` [B, S], left padding), timed by a `TokenClock`.

    Args:
        new_tokens: tokens to generate; with ``exact`` every one of them (end of sequence suppressed), else up to the
            model's end-of-sequence token.
        generate_kwargs: more arguments of `generate` (``cache_implementation="static"``, ...).

    Returns:
        ``ttft_s`` (seconds to the first token: routing, prefill and its sampling), ``decode_s`` (seconds from the
        first token to the last), ``decode_tokens_per_s`` (B x further tokens over ``decode_s``), ``first_step_s``,
        ``median_step_s`` and ``steady_decode_tokens_per_s`` (`TokenClock.timings`),
        ``peak_memory_bytes`` (CUDA; None elsewhere), ``kv_cache_bytes`` (what the cache holds at the end),
        ``tokens`` ([B, generated] on the CPU) and, when ``output_logits=True`` is passed on, ``logits`` ([B,
        generated, vocab] on the model's device: each step's scores before any logits processor).
    """
    from elastic_attention.cache import cache_nbytes

    clock = TokenClock(ids.device)
    cuda = ids.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(ids.device)
    clock.start()
    with torch.no_grad():
        output = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens if exact else None, do_sample=False, pad_token_id=pad_id,
                                logits_processor=[clock], return_dict_in_generate=True, **generate_kwargs)
    return {
        **clock.timings(ids.shape[0]),
        "peak_memory_bytes": torch.cuda.max_memory_allocated(ids.device) if cuda else None,
        "kv_cache_bytes": cache_nbytes(output_cache(output)),
        "tokens": output.sequences[:, ids.shape[1]:].cpu(),
        **({"logits": torch.stack(output.logits, dim=1)} if generate_kwargs.get("output_logits") else {}),
    }


def output_cache(output):
    """The cache a model's forward or `generate` returned: its ``cache`` field where transformers has renamed
    ``past_key_values`` to ``cache`` (reading the old name there logs a deprecation warning), else
    ``past_key_values``."""
    return output.cache if "cache" in getattr(output, "__dataclass_fields__", {}) else output.past_key_values


#: The fields of `TokenClock.timings`: `warm_then_timed` reports each as its median over the timed calls.
TIMING_FIELDS = ("ttft_s", "decode_s", "decode_tokens_per_s", "first_step_s", "median_step_s",
                 "steady_decode_tokens_per_s")


def warm_then_timed(model, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int, pad_id: int,
                    generate=timed_generate, timed_calls: int = 1, **generate_kwargs) -> dict:
    """A first ``generate`` call (`timed_generate`, or a function of its arguments and results), which compiles and
    captures what the setup needs, then ``timed_calls`` identical ones.

    Returns:
        The last call's result, with each of `TIMING_FIELDS` the median over the timed calls (each field on its
        own) and ``peak_memory_bytes`` their largest; ``timed_calls``; ``tokens_same_in_every_call`` (whether every
        timed call generated the last one's tokens); ``first_call_s``, the first call's time from its start to its
        last token.
    """
    if timed_calls < 1:
        raise InputError(f"timed_calls must be at least 1, got {timed_calls}")
    first = generate(model, ids, mask, new_tokens, pad_id, **generate_kwargs)
    calls = [generate(model, ids, mask, new_tokens, pad_id, **generate_kwargs) for _ in range(timed_calls)]
    measured = dict(calls[-1])
    for field in TIMING_FIELDS:
        values = [call[field] for call in calls]
        if None not in values:
            measured[field] = statistics.median(values)
    if None not in (peaks := [call["peak_memory_bytes"] for call in calls]):
        measured["peak_memory_bytes"] = max(peaks)
    return {**measured, "timed_calls": timed_calls,
            "tokens_same_in_every_call": all(torch.equal(call["tokens"], measured["tokens"]) for call in calls),
            "first_call_s": first["ttft_s"] + first["decode_s"]}
