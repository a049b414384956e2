"""Decode steps replayed as CUDA graphs: the bounded cache against the fastest dense decode, each against its
bandwidth bound.

Builds a decoder with random bf16 weights (default: the Llama-3.1-8B shape; nothing is downloaded) and, for each
length, prefills one random prompt of batch 1, repeats the cache along the batch to every ``--batch`` size, and
times ``--steps`` decode steps (median, CUDA events; each step is the model's forward for one new token per
sequence, host work included) of each kind:

- ``bounded``: elastic attention attached (``compile_decode=True, grouped_projections=True``), routing forced to
  ``--msr`` (FA-SSA), the `ElasticCache`; its steps replay a captured graph (`integration.decode_graph`) whose
  decoder layers went through torch.compile (the cache update and attention outside the compiled graphs) and, up
  to `decode_projections.GROUPED_ROWS` sequences, ran their linear projections as grouped Triton launches
  (`integration.decode_projections`), the first step's capture (and compile) left out of the timing;
- ``bounded_cublas_projections`` (at those batch sizes): the same with the projections left to cuBLAS;
- ``bounded_graph_uncompiled``: the same as ``bounded``, nothing compiled;
- ``bounded_eager``: the same cache with its steps run eagerly (``cuda_graphs=False``, the fused kernels);
- ``dense``: the model without elastic attention, its own dynamic cache and SDPA as torch picks it, eagerly;
- ``dense_static_graph``: the model without elastic attention over transformers' `StaticCache` (the dense cache
  copied in after the prefill), its forward captured as a CUDA graph with the same layers compiled and the same
  grouped projections (the cache update and attention outside the compiled graphs, as for ``bounded``), attention
  by the same fused split-K decode kernel over each (sequence, KV head)'s filled entries (`StaticCacheDecodeAttention`):
  one read of the cache per step, no key/value repeated per query head (transformers' SDPA path over a static cache
  repeats them and masks every unfilled slot; under a graph it needs a mask that changes per step);
- ``dense_static_graph_cublas_projections`` (at those batch sizes): the same with the projections left to cuBLAS (what a
  transformers user gets from a static cache and torch.compile);
- ``dense_static_graph_uncompiled``: the same as ``dense_static_graph``, nothing compiled.

Every row carries ``bound_s``: the bytes a step must read (weights, the input embedding left out but one row; the
cache's kept entries) over the copy bandwidth measured in the same run. ``--request LENGTH`` also times a whole
request (one prompt of LENGTH tokens, then ``--new-tokens`` greedy tokens, batch 1, no host sync inside): bounded
(prefill, then compiled graphed steps) against dense at its best settings (SDPA prefill, then compiled graphed steps
over the static cache; and eager steps over its dynamic cache), wall seconds each, compile and capture included.

  elastic-attention bench decode-graphs --lengths 32k,128k --batch 1,8 --request 128k --new-tokens 256 \\
      --out decode_graphs.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache, StaticCache

from elastic_attention import ElasticCache, attach, detach, force_routing
from elastic_attention.help_format import finish_parser
from elastic_attention.integration import set_compile_decode
from elastic_attention.bench.decode import batch_sizes, compile_in_process
from elastic_attention.cache import cache_nbytes
from elastic_attention.bench.model import (
    add_model_arguments,
    build_model,
    elastic_config,
    forced_routing,
    model_fields,
)
from elastic_attention.bench.timing import copy_bandwidth, output_cache, parse_tokens, run_header, timed, write_result
from elastic_attention.cache.triton_decode import DecodeKernelOptions, DecodeSegments, decode_step
from elastic_attention.errors import InputError
from elastic_attention.integration.decode_graph import capture_graph, decode_layers
from elastic_attention.integration.families import decoder_layers, family_of

STATIC_ATTENTION_NAME = "static_cache_decode"
#: SDPA's backends other than cuDNN.
WITHOUT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class StaticCacheDecodeAttention:
    """A decode step's attention over transformers' `StaticCache`, GQA-aware: the fused split-K kernel of
    `cache.triton_decode` over each (sequence, KV head)'s filled entries, lengths on the device.

    Registered with transformers' AttentionInterface under ``static_cache_decode``; ``prepare`` points it at a
    filled cache before the first step (every sequence filled to the same slot; a left-padded sequence's first
    ``pads[b]`` slots are padding, which the segments start after).
    """

    def __init__(self) -> None:
        self.segments: dict[int, DecodeSegments] = {}
        self.capacity = 0
        self.total_entries = 0
        self.options: DecodeKernelOptions | None = None
        self.pads: torch.Tensor | None = None

    def prepare(self, cache: StaticCache, length: int, options: DecodeKernelOptions | None,
                pads: list[int] | None = None, in_place: bool = False) -> None:
        """Address tables over ``cache``'s key/value tensors [B, Hkv, capacity, D], slots 0 .. ``length`` - 1
        filled; sequence b's first ``pads[b]`` slots (left padding; None: none) are left out. ``in_place`` writes
        them into the tables (and pads) this object holds for ``cache`` already, which a captured step reads."""
        batch, num_kv, capacity, _ = cache.layers[0].keys.shape
        skip = list(pads) if pads is not None else [0] * batch
        if len(skip) != batch or not all(0 <= pad < length for pad in skip):
            raise InputError(f"pads must give 0 <= pad < {length} for each of {batch} sequences, got {pads}")
        if in_place and (len(self.segments) != len(cache.layers) or self.capacity != capacity
                         or self.pads is None or self.pads.numel() != batch):
            raise InputError("prepare(in_place=True) rewrites the tables of the same static cache: prepare it first")
        rows = [(b, h) for b in range(batch) for h in range(num_kv)]
        segments, self.options = {}, options
        for index, layer in enumerate(cache.layers):
            keys, values = layer.keys, layer.values
            segments[index] = DecodeSegments.from_columns(
                [keys[b, h, skip[b]].data_ptr() for b, h in rows], [values[b, h, skip[b]].data_ptr() for b, h in rows],
                [0] * len(rows), [length - skip[b] for b, _ in rows], num_kv_heads=num_kv, device=keys.device)
        pads_now = torch.tensor(skip, dtype=torch.long, device=cache.layers[0].keys.device)
        if in_place:
            for index, table in segments.items():
                self.segments[index].copy_(table)
            self.pads.copy_(pads_now)
        else:
            self.segments, self.pads = segments, pads_now
        self.capacity, self.total_entries = capacity, sum(length - skip[b] + 1 for b, _ in rows)

    def device_lengths(self) -> list[torch.Tensor]:
        return [segments.lengths for segments in self.segments.values()]

    @torch.compiler.disable  # as elastic attention's function: a compiled layer calls it untraced
    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        """query [B, Hq, 1, D]; key/value the cache's [B, Hkv, capacity, D] (the step's entry already written at its
        length, which the kernel writes again). Returns ([B, 1, Hq, D], None)."""
        segments = self.segments[module.layer_idx]
        batch = key.shape[0]
        positions = segments.lengths.view(batch, -1)[:, 0] + self.pads  # the step's slot, per sequence
        rows = torch.arange(batch, device=key.device)
        new_keys, new_values = key[rows, :, positions].unsqueeze(2), value[rows, :, positions].unsqueeze(2)
        output = decode_step(query, new_keys, new_values, segments, scaling or query.shape[-1] ** -0.5,
                             sink_tokens=0, local_tokens=1, max_entries=self.capacity,
                             total_entries=self.total_entries, options=self.options)
        return output.transpose(1, 2).contiguous(), None


STATIC_ATTENTION = StaticCacheDecodeAttention()
AttentionInterface.register(STATIC_ATTENTION_NAME, STATIC_ATTENTION)


def read_bytes_per_step(model) -> int:
    """Bytes of weights a decode step reads: every parameter, the input embedding table counted as one row."""
    embedding = model.get_input_embeddings().weight
    total = sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())
    return total - embedding.numel() * embedding.element_size() + embedding.shape[1] * embedding.element_size()


def bounded_read_bytes(cache: ElasticCache) -> int:
    """Bytes of keys and values a decode step of the bounded cache reads: every kept entry once (the host's lengths
    leave the static steps out)."""
    return sum(store.kept_entries(cache.window.ring_size, store.length + cache.static_steps)
               * store.full_keys.shape[2] * 2 * store.full_keys.element_size()
               for layer in cache.layers for store in layer.sequences)


def dense_read_bytes(model, batch: int, length: int) -> int:
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * batch * length * config.num_hidden_layers * config.num_key_value_heads * head_dim * model.dtype.itemsize


#: (kind, CUDA graphs, layers compiled, grouped projections) of the bounded cache's rows.
BOUNDED_KINDS = (("bounded", True, True, True), ("bounded_cublas_projections", True, True, False),
                 ("bounded_graph_uncompiled", True, False, True), ("bounded_eager", False, False, False))
#: (kind, layers compiled, grouped projections) of the dense static-cache graph's rows.
DENSE_GRAPH_KINDS = (("dense_static_graph", True, True), ("dense_static_graph_cublas_projections", True, False),
                     ("dense_static_graph_uncompiled", False, True))


def kinds_at(kinds: tuple, batch: int) -> list:
    """The ``kinds`` measured at ``batch``: the cuBLAS-projection ones up to `decode_projections.GROUPED_ROWS` only
    (at a larger batch the projections are cuBLAS's in every kind)."""
    from elastic_attention.integration.decode_projections import GROUPED_ROWS

    return [kind for kind in kinds if batch <= GROUPED_ROWS or not kind[0].endswith("cublas_projections")]


class Stepper:
    """Decode steps of a model over a cache: one new token per sequence (the greedy one of the last step).

    Args:
        graph_over_static: None, or a `StaticCacheDecodeAttention` whose static cache the steps replay as a
            captured graph (the first step captures).
        compile_layers, group_projections: how that capture runs the decoder layers (`decode_graph.decode_layers`).
        positions: the first step's position per sequence, [B] or [B, 1] (None: ``length`` for every sequence;
            left-padded prompts: each sequence's own token count).
        suppressed_tokens: token ids never chosen (generate's ``min_new_tokens`` suppresses end of sequence so).
    """

    def __init__(self, model, cache, token: torch.Tensor, length: int, graph_over_static=None,
                 compile_layers: bool = False, group_projections: bool = False,
                 positions: torch.Tensor | None = None, suppressed_tokens: list[int] | None = None) -> None:
        self.compile_layers, self.group_projections = compile_layers, group_projections
        self.model, self.cache, self.length = model, cache, length
        batch = token.shape[0]
        self.token = token.clone()
        # the first step's position per sequence [B, 1] (left padding: each sequence's own length); default ``length``
        self.positions = (torch.full((batch, 1), length, dtype=torch.long, device=token.device) if positions is None
                          else positions.clone().view(batch, 1))
        self.suppressed = suppressed_tokens or []  # never chosen (as generate's min_new_tokens does for EOS)
        self.static = graph_over_static
        self.graph = None
        self.logits = None

    def _forward(self):
        return self.model(input_ids=self.token, position_ids=self.positions, past_key_values=self.cache,
                          use_cache=True, logits_to_keep=1).logits

    def restart(self, token: torch.Tensor, length: int, positions: torch.Tensor | None = None) -> None:
        """Go on from another prefill of the same shape over the same cache (refilled): ``token`` [B, 1] and
        ``positions`` as the constructor's, written into the buffers a captured step reads."""
        self.length = length
        self.token.copy_(token)
        self.positions.copy_(torch.full_like(self.positions, length) if positions is None
                             else positions.view_as(self.positions))

    def __call__(self) -> torch.Tensor:
        """One step; returns its logits [B, 1, vocab]; the next step feeds their argmax."""
        if self.static is None:
            logits = self._forward()
        else:
            if self.graph is None:
                layers = self.cache.layers
                state = self.static.device_lengths() + [layer.cumulative_length for layer in layers]
                with decode_layers(decoder_layers_of(self.model), self.compile_layers, self.group_projections):
                    self.graph, self.logits = capture_graph(self._forward, state)
            self.graph.replay()
            logits = self.logits
        if self.suppressed:
            logits[:, -1, self.suppressed] = float("-inf")
        self.token.copy_(logits[:, -1].argmax(-1, keepdim=True))
        self.positions.add_(1)
        return logits


class UntracedStaticCache(StaticCache):
    """transformers' `StaticCache` whose ``update`` a compiled layer calls untraced, as the bounded cache's: traced,
    its list lookup by layer index would compile every layer again."""

    @torch.compiler.disable
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def static_copy(model, dense: DynamicCache, length: int, capacity: int, into: StaticCache | None = None
                ) -> StaticCache:
    """transformers' StaticCache (`UntracedStaticCache`) for ``capacity`` tokens holding the ``length`` entries of
    ``dense``: a new one, or ``into`` (of that capacity) emptied and refilled in place."""
    if into is None:
        static = UntracedStaticCache(config=model.config, max_cache_len=capacity)
    elif into.layers[0].max_cache_len != capacity:
        raise InputError(f"static_copy into a cache of {into.layers[0].max_cache_len} tokens, asked for {capacity}")
    else:
        static = into
        static.reset()
    for index, layer in enumerate(dense.layers):
        static.update(layer.keys[:, :, :length], layer.values[:, :, :length], index)
    return static


def prefill(model, prompt: torch.Tensor, cache=None):
    """(the output of one forward over ``prompt`` [B, L] with ``cache`` (None: the model's own), seconds)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    output = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
    torch.cuda.synchronize()
    return output, time.perf_counter() - start


def decoder_layers_of(model) -> list:
    """The decoder layers of a causal LM."""
    return decoder_layers(model.model, family_of(model)[1])


def measure_bounded(model, prompt, args, bandwidth: float, weights: int) -> list[dict]:
    """Rows of ``bounded``, ``bounded_cublas_projections``, ``bounded_graph_uncompiled`` and ``bounded_eager`` at every
    batch size (the second up to `decode_projections.GROUPED_ROWS` only)."""
    length = prompt.shape[1]
    attach(model, elastic_config(args), backend=args.backend)  # each kind sets how its steps run (BOUNDED_KINDS)
    force_routing(model, forced_routing(args.layers, args.kv_heads, args.msr, args.seed))
    rows = []
    try:
        with torch.inference_mode():
            output, prefill_s = prefill(model, prompt, ElasticCache(model, kernel_options=args.kernel_options))
            cache, token = output_cache(output), output.logits[:, -1:].argmax(-1)
            del output
            batch = 1
            for size in args.batch:
                if size > batch:
                    cache.batch_repeat_interleave(size // batch)
                    token, batch = token.repeat_interleave(size // batch, dim=0), size
                for kind, graphs, compile_them, grouped in kinds_at(BOUNDED_KINDS, size):
                    cache.end_static()  # the next step captures again, with this kind's settings
                    cache.cuda_graphs = graphs
                    set_compile_decode(model, compile_them)
                    model.forward.group_projections = grouped
                    step = Stepper(model, cache, token, cache.get_seq_length())
                    step()  # the graphed kind captures here
                    seconds = timed(step, prompt.device, args.steps, warmup=2)
                    read = bounded_read_bytes(cache)
                    rows.append(row(length, size, kind, seconds, weights, read, cache.nbytes(), bandwidth,
                                    prefill_s=prefill_s, replayed_steps=cache.static_steps,
                                    fused_decode_steps=cache.fused_decode_steps))
                    token = step.token
    except torch.OutOfMemoryError:
        rows.append({"length": length, "batch": args.batch[len(rows) // 3], "kind": "bounded", "out_of_memory": True})
    finally:
        detach(model)
        torch.cuda.empty_cache()
    return rows


def measure_dense(model, prompt, args, bandwidth: float, weights: int) -> list[dict]:
    """Rows of ``dense`` and ``dense_static_graph`` at every batch size (a kind that does not fit: out_of_memory)."""
    length = prompt.shape[1]
    rows = []
    with torch.inference_mode():
        model.set_attn_implementation("sdpa")
        output, prefill_s = prefill(model, prompt)
        dense, token = output_cache(output), output.logits[:, -1:].argmax(-1)
        del output
        batch = 1
        for size in args.batch:
            try:
                if size > batch:
                    dense.batch_repeat_interleave(size // batch)
                    token, batch = token.repeat_interleave(size // batch, dim=0), size
                step = Stepper(model, dense, token, length)
                default_s = timed(step, prompt.device, args.steps, warmup=2)
                with sdpa_kernel(WITHOUT_CUDNN):  # cuDNN plans a graph per key length: host time every step
                    without_cudnn_s = timed(step, prompt.device, args.steps, warmup=2)
                read = dense_read_bytes(model, size, length)
                rows.append(row(length, size, "dense", min(default_s, without_cudnn_s), weights, read,
                                cache_nbytes(dense), bandwidth, prefill_s=prefill_s, step_s_default_sdpa=default_s,
                                step_s_sdpa_without_cudnn=without_cudnn_s))
            except torch.OutOfMemoryError:
                rows.append({"length": length, "batch": size, "kind": "dense", "out_of_memory": True})
            for kind, compile_them, grouped in kinds_at(DENSE_GRAPH_KINDS, size):
                try:
                    static = static_copy(model, dense, length, length + args.steps + 8)
                    STATIC_ATTENTION.prepare(static, length, args.kernel_options)
                    model.set_attn_implementation(STATIC_ATTENTION_NAME)
                    step = Stepper(model, static, token, length, graph_over_static=STATIC_ATTENTION,
                                   compile_layers=compile_them, group_projections=grouped)
                    step()
                    seconds = timed(step, prompt.device, args.steps, warmup=2)
                    read = dense_read_bytes(model, size, length)
                    rows.append(row(length, size, kind, seconds, weights, read, cache_nbytes(static), bandwidth,
                                    attention="fused split-K GQA kernel over the static cache"))
                except torch.OutOfMemoryError:
                    rows.append({"length": length, "batch": size, "kind": kind, "out_of_memory": True})
                finally:
                    model.set_attn_implementation("sdpa")
                    static = step = None
                    STATIC_ATTENTION.segments = {}
                    torch.cuda.empty_cache()
    del dense
    torch.cuda.empty_cache()
    return rows


def row(length: int, batch: int, kind: str, step_s: float, weights: int, read: int, held: int, bandwidth: float,
        **extra) -> dict:
    bound = (weights + read) / bandwidth
    result = {"length": length, "batch": batch, "kind": kind, "step_s": step_s, "bound_s": bound,
              "step_over_bound": step_s / bound, "cache_bytes": held, "cache_read_bytes": read,
              "weight_read_bytes": weights, "tokens_per_s": batch / step_s, **extra}
    print(result, flush=True)
    return result


def measure_request(model, args, weights: int) -> dict:
    """Wall seconds of one request (prompt of ``args.request`` tokens, then ``args.new_tokens`` greedy tokens)."""
    length, new_tokens = args.request, args.new_tokens
    generator = torch.Generator(args.device).manual_seed(length + 1)
    prompt = torch.randint(0, args.vocab, (1, length), device=args.device, generator=generator)
    result = {"length": length, "new_tokens": new_tokens}

    def decode(stepper) -> None:
        for _ in range(new_tokens - 1):
            stepper()

    with torch.inference_mode():
        attach(model, elastic_config(args), backend=args.backend, compile_decode=True, grouped_projections=True)
        force_routing(model, forced_routing(args.layers, args.kv_heads, args.msr, args.seed))
        try:
            start = time.perf_counter()
            output, _ = prefill(model, prompt, ElasticCache(model, kernel_options=args.kernel_options))
            decode(Stepper(model, output_cache(output), output.logits[:, -1:].argmax(-1), length))
            torch.cuda.synchronize()
            result["bounded_s"] = time.perf_counter() - start
            del output
        finally:
            detach(model)
            torch.cuda.empty_cache()
        model.set_attn_implementation("sdpa")
        start = time.perf_counter()
        output, _ = prefill(model, prompt)
        token = output.logits[:, -1:].argmax(-1)
        static = static_copy(model, output_cache(output), length, length + new_tokens + 8)
        del output
        STATIC_ATTENTION.prepare(static, length, args.kernel_options)
        model.set_attn_implementation(STATIC_ATTENTION_NAME)
        decode(Stepper(model, static, token, length, graph_over_static=STATIC_ATTENTION, compile_layers=True,
                       group_projections=True))
        torch.cuda.synchronize()
        result["dense_static_graph_s"] = time.perf_counter() - start
        model.set_attn_implementation("sdpa")
        del static
        STATIC_ATTENTION.segments = {}
        torch.cuda.empty_cache()
        start = time.perf_counter()
        output, _ = prefill(model, prompt)
        decode(Stepper(model, output_cache(output), output.logits[:, -1:].argmax(-1), length))
        torch.cuda.synchronize()
        result["dense_s"] = time.perf_counter() - start
        del output
        torch.cuda.empty_cache()
    result["dense_best_s"] = min(result["dense_static_graph_s"], result["dense_s"])
    result["speedup_vs_dense_best"] = result["dense_best_s"] / result["bounded_s"]
    print(result, flush=True)
    return result


def run(args) -> dict:
    """Measure every kind at every length (and the request); the results file is rewritten after each length, so a
    run cut short keeps what it measured."""
    device = torch.device(args.device)
    if device.type != "cuda":
        raise SystemExit("bench decode-graphs needs a CUDA device (CUDA graphs)")
    compile_in_process()
    bandwidth = copy_bandwidth(device)
    model = build_model(args, device, max(args.lengths + [args.request or 0]) + args.new_tokens + 512)
    weights = read_bytes_per_step(model)
    rows = []
    result = {
        **run_header(device),
        "model": model_fields(args),
        "elastic": {"backend": args.backend, "msr": args.msr, "block_size": args.block_size, "sink": args.sink,
                    "local": args.local},
        "copy_bandwidth_bytes_per_s": bandwidth,
        "kernel_options": None if args.kernel_options is None else vars(args.kernel_options),
        "baselines": {
            "dense": "the model without elastic attention: its dynamic cache, SDPA as torch picks it or without "
                     "cuDNN (the faster), eager steps",
            "dense_static_graph": "the model without elastic attention over transformers' StaticCache, its forward "
                                  "captured as a CUDA graph (decoder layers through torch.compile, the grouped "
                                  "projections of the bounded kind), attention by the fused split-K GQA "
                                  "decode kernel",
            "dense_static_graph_cublas_projections": "the same with cuBLAS projections (at the grouped projections' "
                                                     "batch sizes)",
        },
        "results": rows,
        "request": None,
    }
    for length in args.lengths:
        generator = torch.Generator(device).manual_seed(length)
        prompt = torch.randint(0, args.vocab, (1, length), device=device, generator=generator)
        rows += measure_bounded(model, prompt, args, bandwidth, weights)
        rows += measure_dense(model, prompt, args, bandwidth, weights)
        compare(rows)
        write_result(args.out, result)
    if args.request:
        result["request"] = measure_request(model, args, weights)
        write_result(args.out, result)
    return result


def compare(rows: list[dict]) -> None:
    """Each bounded row's speedup over the other kinds at the same (length, batch)."""
    for current in rows:
        if current["kind"] != "bounded" or "step_s" not in current:
            continue
        for other in rows:
            if other["kind"] != "bounded" and "step_s" in other and (other["length"], other["batch"]) == (
                    current["length"], current["batch"]):
                current[f"speedup_vs_{other['kind']}"] = other["step_s"] / current["step_s"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="elastic-attention bench decode-graphs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=parse_tokens, default=parse_tokens("32k,128k"))
    parser.add_argument("--batch", type=batch_sizes, default=[1, 8])
    parser.add_argument("--backend", default="auto", help="prefill backend of the bounded kinds")
    parser.add_argument("--msr", type=float, default=0.7)
    add_model_arguments(parser)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--request", type=lambda text: parse_tokens(text)[0], default=0,
                        help="also time one request of this many prompt tokens (0: none)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--kernel-options", type=lambda text: DecodeKernelOptions(**__import__("json").loads(text)),
                        default=None,
                        help="fused decode kernel options as JSON (see studies/kernel_tuning/decode_kernel_sweep.py)")
    parser.add_argument("--out", type=Path, required=True)
    finish_parser(parser, "elastic-attention bench decode-graphs --lengths 32k,128k --batch 1,8 "
                          "--out decode_graphs.json")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
