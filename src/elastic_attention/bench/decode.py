"""Decode with the bounded cache against full caches: KV bytes and step latency.

Builds a decoder with random bf16 weights from a config (default: the Llama-3.1-8B shape; nothing is downloaded)
and, for each length, prefills one random prompt of batch 1 with each cache kind:

- ``bounded``: elastic attention attached with routing forced to ``--msr`` (FA-SSA) and `ElasticCache` (its decode
  steps fused on a GPU with Triton: two launches per layer, see `cache.triton_decode`);
- ``bounded_torch``: the same cache with its per-sequence torch decode step (``fused_decode=False``);
- ``full``: the same routing with the model's own full cache (the paper's decode: SSA heads masked, nothing freed);
- ``dense``: the unmodified model (elastic attention detached) with its own cache and attention implementation.

Each prefilled cache is then repeated along the batch (``Cache.batch_repeat_interleave``) to every ``--batch`` size
in turn, so a batch-8 cache at 128K needs no batch-8 prefill; at each size it records the cache bytes and the median
time of ``--steps`` decode steps. A cache that does not fit is recorded as ``out_of_memory``. The bounded and full
caches must give the same next-token logits at batch 1 (``--tolerance``, relative to the largest logit: in bf16 the
two differ by kernel rounding). Decode steps run with torch's cuDNN SDPA left out (it plans a graph per key length,
milliseconds of host time per step); the dense model is timed also with torch's default choice.

``--prefill-chunk N`` feeds the prompt to the bounded cache in chunks of N tokens (the first chunk routes; later
chunks attend by the token rule, see `ElasticCache`), so prompts whose one-pass activations would not fit can be
measured: the longest context of item 4. Each row records the prefill's seconds and peak memory.

  elastic-attention bench decode --lengths 32k,128k --batch 1,8 --out decode.json
  elastic-attention bench decode --lengths 1m --batch 1 --caches bounded --prefill-chunk 64k --steps 5 \\
      --out decode_1m.json
  elastic-attention bench decode --device cpu --layers 2 --hidden 128 --heads 4 --kv-heads 2 --intermediate 256 \\
      --vocab 500 --lengths 300 --batch 1,2 --block-size 64 --sink 64 --local 128 --out /tmp/decode.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from elastic_attention import ElasticCache, attach, detach, force_routing
from elastic_attention.cache import cache_nbytes
from elastic_attention.cache.token_attention import single_query_kernels
from elastic_attention.help_format import finish_parser
from elastic_attention.integration.attach import is_attached, runtime_of
from elastic_attention.bench.model import (
    add_model_arguments,
    build_model,
    elastic_config,
    forced_routing,
    model_fields,
)
from elastic_attention.bench.timing import output_cache, parse_tokens, run_header, timed, write_result

CACHE_KINDS = ("bounded", "bounded_torch", "full", "dense")


def batch_sizes(text: str) -> list[int]:
    """Ascending batch sizes, each a multiple of the previous one (caches grow by repetition)."""
    sizes = [int(b) for b in text.split(",")]
    if sizes[0] < 1 or any(b % a or b <= a for a, b in zip(sizes, sizes[1:])):
        raise argparse.ArgumentTypeError(f"--batch must ascend, each a multiple of the one before; got {text}")
    return sizes


def prefill(model, prompt: torch.Tensor, chunk: int, device: torch.device, cache: ElasticCache | None = None):
    """The model's output for ``prompt`` [1, L] with a cache: one pass, or chunks of ``chunk`` tokens into an
    `ElasticCache` (``main`` allows chunks for the bounded caches only).

    Args:
        cache: the `ElasticCache` to fill (None: the model chooses its cache).

    Returns:
        (the last forward's output, with its ``past_key_values``; seconds; peak GPU memory in GiB or None).
    """
    length = prompt.shape[1]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    if not chunk or chunk >= length:
        output = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
    else:
        cache = cache if cache is not None else ElasticCache(model)
        for begin in range(0, length, chunk):
            end = min(length, begin + chunk)
            output = model(input_ids=prompt[:, begin:end], attention_mask=torch.ones(1, end, dtype=torch.long,
                                                                                      device=device),
                           past_key_values=cache, use_cache=True, logits_to_keep=1)
            print(f"prefill: {end} of {length} tokens after {time.perf_counter() - start:.1f} s", flush=True)
    peak = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) / 2**30
    return output, time.perf_counter() - start, peak


def compile_in_process() -> None:
    """Compile in this process. Inductor's compile workers, started by FlexAttention's first compile, take the host's
    cores for seconds afterwards; every CPU op with a thread pool then crawls, and whichever cache decodes first pays
    for it (decode steps several times slower for seconds; none with one OpenMP thread)."""
    from torch._inductor import config as inductor_config

    inductor_config.compile_threads = 1


def prepare_kind(model, kind: str, args) -> ElasticCache | None:
    """Set ``model`` up for one cache kind (`CACHE_KINDS`): elastic attention attached with routing forced to
    ``args.msr`` unless ``dense``. Returns the `ElasticCache` to prefill for the bounded kinds, else None (the model
    chooses its cache)."""
    if kind not in CACHE_KINDS:
        raise ValueError(f"unknown cache kind {kind!r}; choose from {', '.join(CACHE_KINDS)}")
    if kind == "dense":
        return None
    attach(model, elastic_config(args), backend=args.backend, cache="full" if kind == "full" else "bounded")
    force_routing(model, forced_routing(args.layers, args.kv_heads, args.msr, args.seed))
    return ElasticCache(model, fused_decode=kind == "bounded") if kind.startswith("bounded") else None


def measure_kind(model, kind: str, prompt: torch.Tensor, args, device: torch.device) -> tuple[list[dict], torch.Tensor]:
    """Prefill ``prompt`` [1, L] with one cache kind, then time decode steps at every batch size.

    Returns:
        (one row per batch size, the batch-1 next-token logits [1, 1, vocab] float32).
    """
    cache = prepare_kind(model, kind, args)
    length = prompt.shape[1]
    rows, first_logits, batch = [], None, 1
    state = {}
    try:
        with torch.inference_mode():
            output, prefill_s, prefill_peak = prefill(model, prompt, args.prefill_chunk, device, cache)
            del cache
            state.update(cache=output_cache(output), length=length, token=output.logits[:, -1:].argmax(-1))
            del output

            def step():
                state["length"] += 1
                rows_now = state["token"].shape[0]
                mask = torch.ones(rows_now, state["length"], dtype=torch.long, device=device)
                return model(input_ids=state["token"], attention_mask=mask, past_key_values=state["cache"],
                             use_cache=True, logits_to_keep=1)

            for size in args.batch:
                row = {"length": length, "batch": size, "cache": kind, "prefill_s": prefill_s,
                       "prefill_peak_memory_gib": prefill_peak, "prefill_chunk": args.prefill_chunk}
                rows.append(row)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                try:
                    if size > batch:
                        state["cache"].batch_repeat_interleave(size // batch)
                        if kind == "full":  # the model's own cache does not tell the runtime
                            runtime_of(model).select_sequences(torch.arange(batch).repeat_interleave(size // batch))
                        state["token"] = state["token"].repeat_interleave(size // batch, dim=0)
                        batch = size
                    logits = step().logits.float()
                    if first_logits is None:
                        first_logits = logits
                    row["cache_bytes"] = cache_nbytes(state["cache"])
                    with single_query_kernels():
                        row["decode_step_s"] = timed(step, device, args.steps, warmup=1)
                    if isinstance(state["cache"], ElasticCache):  # which decode path the steps took, not assumed
                        row["fused_decode_steps"] = state["cache"].fused_decode_steps
                    if kind == "dense":  # also as the model runs by default (torch may pick cuDNN)
                        row["decode_step_s_default_sdpa"] = timed(step, device, args.steps, warmup=1)
                except torch.OutOfMemoryError:
                    row["out_of_memory"] = True
                    print(row, flush=True)
                    break
                if device.type == "cuda":
                    row["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
                print(row, flush=True)
    except torch.OutOfMemoryError:
        rows.append({"length": length, "batch": 1, "cache": kind, "out_of_memory": True, "during": "prefill"})
        print(rows[-1], flush=True)
    finally:
        state.clear()
        if is_attached(model):
            detach(model)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows, first_logits


def run(args) -> dict:
    device = torch.device(args.device)
    compile_in_process()
    model = build_model(args, device, max(args.lengths))
    rows = []
    for length in args.lengths:
        generator = torch.Generator(device).manual_seed(length)
        prompt = torch.randint(0, args.vocab, (1, length), device=device, generator=generator)
        by_kind, logits = {}, {}
        for kind in args.caches:
            by_kind[kind], logits[kind] = measure_kind(model, kind, prompt, args, device)
            rows += by_kind[kind]
        if logits.get("bounded") is not None and logits.get("full") is not None:
            difference = float((logits["bounded"] - logits["full"]).abs().max())
            scale = float(logits["full"].abs().max())
            if difference > args.tolerance * scale:
                raise SystemExit(f"bounded and full caches disagree by {difference} (largest logit {scale}) at "
                                 f"length {length}")
            by_kind["bounded"][0].update(max_logit_difference=difference, largest_logit=scale,
                                         same_next_token=bool((logits["bounded"].argmax(-1) ==
                                                               logits["full"].argmax(-1)).all()))
        for position, bounded in enumerate(by_kind.get("bounded", [])):
            for kind in ("bounded_torch", "full", "dense"):
                other = by_kind.get(kind, [])
                if position < len(other) and "decode_step_s" in bounded and "decode_step_s" in other[position]:
                    bounded[f"bytes_vs_{kind}"] = bounded["cache_bytes"] / other[position]["cache_bytes"]
                    bounded[f"speedup_vs_{kind}"] = other[position]["decode_step_s"] / bounded["decode_step_s"]
    return {
        **run_header(device),
        "model": model_fields(args),
        "elastic": {"backend": args.backend, "msr": args.msr, "block_size": args.block_size, "sink": args.sink,
                    "local": args.local},
        "baselines": {"full": "the same model and routing with the model's own full cache, same process",
                      "dense": "the model without elastic attention, its own cache and attention, same process"},
        "compile_threads": 1,
        "results": rows,
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="elastic-attention bench decode",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=parse_tokens, default=parse_tokens("32k,128k"))
    parser.add_argument("--batch", type=batch_sizes, default=[1, 8])
    parser.add_argument("--caches", type=lambda t: t.split(","), default=list(CACHE_KINDS),
                        help=f"cache kinds to measure, from {','.join(CACHE_KINDS)}")
    parser.add_argument("--backend", default="auto", help="prefill backend")
    parser.add_argument("--msr", type=float, default=0.7)
    add_model_arguments(parser)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prefill-chunk", type=lambda text: parse_tokens(text)[0], default=0,
                        help="prefill the bounded cache in chunks of this many tokens (0: one pass)")
    parser.add_argument("--tolerance", type=float, default=0.1,
                        help="largest next-token logit difference allowed, relative to the largest logit")
    parser.add_argument("--out", type=Path, required=True)
    finish_parser(parser, 'elastic-attention bench decode --lengths 32k,128k --batch 1,8 --out decode.json')
    return parser.parse_args(argv)


def main(argv=None) -> None:
    arguments = parse_args(argv)
    if arguments.prefill_chunk and not set(arguments.caches) <= {"bounded", "bounded_torch"}:
        raise SystemExit("--prefill-chunk needs --caches bounded (or bounded_torch): the full and dense caches attend "
                         "later chunks by plain torch or by materialized masks")
    unknown = set(arguments.caches) - set(CACHE_KINDS)
    if unknown:
        raise SystemExit(f"unknown cache kinds {sorted(unknown)}; choose from {','.join(CACHE_KINDS)}")
    write_result(arguments.out, run(arguments))


if __name__ == "__main__":
    main()
