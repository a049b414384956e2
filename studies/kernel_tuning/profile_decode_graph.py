"""Where does the time of a replayed decode step go? The kernels of one captured step of `bench decode-graphs`
(``bounded``: elastic attention, its decoder layers compiled; ``dense_static_graph``: the plain model over
transformers' StaticCache), grouped (matrix products, the decode attention kernels, Inductor's fused kernels, the
rest), per step, against the step's time (CUDA events) and its bandwidth bound; the difference between the step's time
and the sum of its kernels is the time between kernels.

  python studies/kernel_tuning/profile_decode_graph.py --length 131072 --batch 1 [--kinds bounded,dense_static_graph]

``--model FOLDER --router ADAPTER`` profiles a real model instead, on `bench request`'s prompts (``--task``, left
padded to ``--batch``) and in its own loop (`bench.request.own_loop_steps`): ``elastic`` (the router's routing, the
bounded cache, captured compiled steps as `bench request` runs them) against ``dense_static_graph`` (the dense
prefill, then the captured static-cache step); ``--length`` is then the prompt length. Each kind also reports its step
with a synchronization after every step (``synchronized``: the request's clock stamps each token so), whose excess
over the step is host time the GPU waits for, and its first step as the request times it, in a second run after a
first that compiles (from the first token, synchronized, to the end of the first step: the static storage and,
for the dense step, which this script does not keep between runs, the captured graph; the elastic run replays the
step its first run captured, as the attached model keeps it, and as `bench request`'s timed calls do on both sides),
split into its phases
(`FirstStepPhases`: the static storage, the eager run before the capture, the allocator's ``empty_cache`` that
``torch.cuda.graph`` calls, the capture, the first replay, and the rest).

  python studies/kernel_tuning/profile_decode_graph.py --model /tmp/qwen2.5-coder-1.5b-instruct \
      --router src/elastic_attention/assets/routers/qwen2.5-coder-1.5b-instruct --task next_line --length 32768 --batch 8

``--blas`` (torch's preferred BLAS library) and ``--exact-bf16-reductions`` (no reduced-precision reductions in
bf16 matrix products) ask whether cuBLAS's choice of GEMV kernels can be bettered for the captured step;
``--cublas-projections`` profiles the steps with cuBLAS projections in place of the grouped Triton launches.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from elastic_attention import ElasticCache, attach, detach, force_routing
from elastic_attention.bench.decode import compile_in_process
from elastic_attention.bench.decode_graphs import (
    STATIC_ATTENTION,
    STATIC_ATTENTION_NAME,
    Stepper,
    bounded_read_bytes,
    dense_read_bytes,
    prefill,
    read_bytes_per_step,
    static_copy,
)
from elastic_attention.bench.model import add_model_arguments, build_model, elastic_config, forced_routing
from elastic_attention.bench.timing import copy_bandwidth, timed

#: Kernel-name fragments of each group (the first group that matches).
GROUPS = {
    "decode attention (step, merge)": ("step_kernel", "merge_kernel", "write_kernel"),
    "matrix products": ("gemv", "grouped_rows", "gemm", "nvjet", "cutlass", "sm90", "splitk", "cublas"),
    "Inductor fused kernels": ("triton_",),
}


def group_of(name: str) -> str:
    lowered = name.lower()
    return next((group for group, parts in GROUPS.items() if any(part in lowered for part in parts)), "other")


def profile_steps(step, steps: int) -> tuple[dict, list]:
    """(per group: (microseconds per step, kernels per step); the 12 kernels of most time: (name, us per step,
    launches per step)) over ``steps`` replayed steps."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    groups = collections.defaultdict(lambda: [0.0, 0])
    kernels = collections.defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        duration = event.time_range.elapsed_us()
        for table, key in ((groups, group_of(event.name)), (kernels, event.name)):
            table[key][0] += duration / steps
            table[key][1] += 1 / steps
    top = sorted(kernels.items(), key=lambda item: -item[1][0])[:12]
    return dict(groups), [(name[:90], us, count) for name, (us, count) in top]


def synchronized_step_seconds(step, steps: int) -> float:
    """Median wall seconds of ``step()`` followed by a synchronization, as a loop that stamps every token runs it."""
    samples = []
    for _ in range(steps):
        torch.cuda.synchronize()
        began = time.perf_counter()
        step()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


class FirstStepPhases:
    """Host seconds (synchronized before and after) of the phases of a first decode step, recorded while the block
    of `recording` runs: ``static storage`` (`ElasticCache.begin_static`, or the dense setup's `static_copy`),
    ``eager run`` (what `capture_graph` spends before its capture: the warm-up step on a side stream), ``empty_cache``
    (``torch.cuda.graph`` releases the allocator's cached blocks before it captures), ``capture`` (from
    ``capture_begin`` to ``capture_end``: the forward recorded, the graph instantiated) and ``first replay``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)

    @contextlib.contextmanager
    def recording(self):
        import elastic_attention.bench.decode_graphs as decode_graphs_module
        import elastic_attention.integration.decode_graph as decode_graph_module
        from elastic_attention.cache.bounded import ElasticCache as Cache

        graph_class, stamps, replays = torch.cuda.CUDAGraph, {}, []

        def timed_call(original, phase):
            def call(*args, **kwargs):
                torch.cuda.synchronize()
                start = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    torch.cuda.synchronize()
                    self.seconds[phase] += time.perf_counter() - start
            return call

        def capture_begin(graph, *args, **kwargs):  # synchronized by torch.cuda.graph just before
            stamps["capture"] = time.perf_counter()
            return originals["capture_begin"](graph, *args, **kwargs)

        def capture_end(graph):  # no synchronization while capturing: only after it
            result = originals["capture_end"](graph)
            torch.cuda.synchronize()
            self.seconds["capture"] += time.perf_counter() - stamps.pop("capture")
            return result

        def replay(graph):
            if replays:
                return originals["replay"](graph)
            replays.append(graph)
            return timed_call(originals["replay"], "first replay")(graph)

        def capture_graph(run, device_state):
            before = dict(self.seconds)
            torch.cuda.synchronize()
            start = time.perf_counter()
            result = originals["capture_graph"](run, device_state)
            torch.cuda.synchronize()
            inside = sum(self.seconds[name] - before.get(name, 0.0) for name in ("empty_cache", "capture"))
            self.seconds["eager run"] += time.perf_counter() - start - inside
            return result

        originals = {"capture_begin": graph_class.capture_begin, "capture_end": graph_class.capture_end,
                     "replay": graph_class.replay, "capture_graph": decode_graph_module.capture_graph}
        patches = [(graph_class, "capture_begin", capture_begin), (graph_class, "capture_end", capture_end),
                   (graph_class, "replay", replay), (decode_graph_module, "capture_graph", capture_graph),
                   (decode_graphs_module, "capture_graph", capture_graph),
                   (torch.cuda, "empty_cache", timed_call(torch.cuda.empty_cache, "empty_cache")),
                   (Cache, "begin_static", timed_call(Cache.begin_static, "static storage")),
                   (decode_graphs_module, "static_copy", timed_call(decode_graphs_module.static_copy,
                                                                    "static storage"))]
        saved = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in patches]  # None: inherited
        try:
            for owner, name, replacement in patches:
                setattr(owner, name, replacement)
            yield self
        finally:
            for owner, name, original in saved:
                if original is None:
                    delattr(owner, name)
                else:
                    setattr(owner, name, original)

    def line(self, first_step_s: float) -> str:
        """The phases in ms, and the rest of ``first_step_s``."""
        rest = first_step_s - sum(self.seconds.values())
        parts = [f"{name} {seconds * 1e3:.1f}" for name, seconds in self.seconds.items()]
        return "   first step (ms): " + ", ".join(parts + [f"rest {rest * 1e3:.1f}"])


def report(kind: str, step, args, bound_s: float, first_step_s: float | None = None,
           phases: FirstStepPhases | None = None) -> None:
    step_s = timed(step, torch.device(args.device), args.steps, warmup=2)
    synchronized_s = synchronized_step_seconds(step, args.steps)
    groups, top = profile_steps(step, args.profile_steps)
    kernel_us = sum(us for us, _ in groups.values())
    first = "" if first_step_s is None else f"first step {first_step_s * 1e3:.1f} ms, "
    print(f"== {kind}, length {args.length}, batch {args.batch}: {first}step {step_s * 1e3:.3f} ms (synchronized "
          f"{synchronized_s * 1e3:.3f} ms), bound {bound_s * 1e3:.3f} ms ({step_s / bound_s:.2f}x); kernels "
          f"{kernel_us / 1e3:.3f} ms, between kernels {step_s * 1e3 - kernel_us / 1e3:.3f} ms", flush=True)
    if phases is not None and first_step_s is not None:
        print(phases.line(first_step_s))
    for group, (us, count) in sorted(groups.items(), key=lambda item: -item[1][0]):
        print(f"   {group:34s} {us / 1e3:7.3f} ms  {count:6.0f} kernels")
    for name, us, count in top:
        print(f"   {us:9.1f} us {count:5.0f}x  {name}")


def profile_real_model(args) -> None:
    """The ``elastic`` and ``dense_static_graph`` steps of a real model on `bench request`'s prompts."""
    import elastic_attention as ea
    from elastic_attention.bench.request import (
        adapter_config,
        dense_setups,
        left_padded,
        own_loop_steps,
        prompt_batches,
    )
    from elastic_attention.evaluation.pipeline import load_backbone

    device = torch.device(args.device)
    bandwidth = copy_bandwidth(device)
    model, tokenizer = load_backbone(args.model, args.device, None)
    weights = read_bytes_per_step(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts = prompt_batches(tokenizer, "code", {"prompt": args.task}, args.length, args.rows, args.seed)["prompt"]
    ids, mask = left_padded(prompts, args.batch, pad_id, device)
    new_tokens = 2 + 2 * args.steps + 2 + args.profile_steps + 8  # every step below, with room
    kinds = args.kinds.split(",")
    print(f"{args.task} at {args.length} tokens ({int(mask.sum(1).max())} in the longest row), batch {args.batch}",
          flush=True)
    marks = []  # host seconds at the first token and after the first step (synchronized), as bench request stamps

    def mark():
        torch.cuda.synchronize()
        marks.append(time.perf_counter())

    if "elastic" in kinds:
        ea.attach(model, adapter_config(model, args.router), compile_decode=True)
        ea.load_router(model, args.router)
        try:
            with own_loop_steps(model, ids, mask, new_tokens, elastic=True) as step:
                step()  # compiles the captured step's layers (a process does once)
            marks.clear()
            phases = FirstStepPhases()
            with phases.recording():  # the prefill records nothing: its phases begin after the first token
                with own_loop_steps(model, ids, mask, new_tokens, elastic=True, first_token_done=mark) as step:
                    step()
                    mark()
            with own_loop_steps(model, ids, mask, new_tokens, elastic=True) as step:
                step()
                msr = float(ea.routing_report(model).msr.mean())
                report(f"elastic (MSR {msr:.2f})", step, args, (weights + bounded_read_bytes(step.cache)) / bandwidth,
                       marks[1] - marks[0], phases)
        finally:
            ea.detach(model)
        torch.cuda.empty_cache()
    if "dense_static_graph" in kinds:
        setups, _ = dense_setups(model, device)
        model.set_attn_implementation("flash_attention_4" if any(name == "flash_attention_4" for name, _, _ in setups)
                                      else "sdpa")
        with own_loop_steps(model, ids, mask, new_tokens) as step:
            step()  # compiles, as above
        marks.clear()
        phases = FirstStepPhases()
        with phases.recording():
            with own_loop_steps(model, ids, mask, new_tokens, first_token_done=mark) as step:
                step()
                mark()
        with own_loop_steps(model, ids, mask, new_tokens) as step:
            step()
            bound_s = (weights + dense_read_bytes(model, args.batch, int(mask.sum(1).max()))) / bandwidth
            report("dense_static_graph", step, args, bound_s, marks[1] - marks[0], phases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--length", type=int, default=131072)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--msr", type=float, default=0.7)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--kinds", default=None,
                        help="bounded,dense_static_graph (random weights) or elastic,dense_static_graph (--model)")
    parser.add_argument("--model", help="a real model's folder: profile it on bench request's prompts")
    parser.add_argument("--router", help="with --model: the router adapter's folder")
    parser.add_argument("--task", default="next_line", help="with --model: the code suite's task of the prompts")
    parser.add_argument("--rows", type=int, default=4, help="with --model: prompt rows, cycled to fill the batch")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--blas", choices=["cublas", "cublaslt"], help="torch.backends.cuda.preferred_blas_library")
    parser.add_argument("--exact-bf16-reductions", action="store_true",
                        help="torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False")
    parser.add_argument("--cublas-projections", action="store_true",
                        help="leave the projections of batch 1 to cuBLAS (attach(..., grouped_projections=False))")
    args = parser.parse_args()
    if args.blas:
        torch.backends.cuda.preferred_blas_library(args.blas)
    if args.exact_bf16_reductions:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    print(f"blas {torch.backends.cuda.preferred_blas_library()}, bf16 reduced-precision reductions "
          f"{torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction}", flush=True)
    if args.model and not args.router:
        parser.error("--model needs --router (the adapter whose routing the elastic step runs)")
    args.kinds = args.kinds or ("elastic,dense_static_graph" if args.model else "bounded,dense_static_graph")
    args.kernel_options = None
    device = torch.device(args.device)
    compile_in_process()
    if args.model:
        profile_real_model(args)
        return
    bandwidth = copy_bandwidth(device)
    model = build_model(args, device, args.length + args.steps * 4 + 512)
    weights = read_bytes_per_step(model)
    prompt = torch.randint(0, args.vocab, (1, args.length), device=device,
                           generator=torch.Generator(device).manual_seed(args.seed))
    kinds = args.kinds.split(",")
    with torch.inference_mode():
        if "bounded" in kinds:
            attach(model, elastic_config(args), backend=args.backend, compile_decode=True,
                   grouped_projections=not args.cublas_projections)
            force_routing(model, forced_routing(args.layers, args.kv_heads, args.msr, args.seed))
            output, _ = prefill(model, prompt, ElasticCache(model))
            cache, token = output.past_key_values, output.logits[:, -1:].argmax(-1)
            del output
            if args.batch > 1:
                cache.batch_repeat_interleave(args.batch)
                token = token.repeat_interleave(args.batch, dim=0)
            step = Stepper(model, cache, token, cache.get_seq_length())
            step()
            report("bounded", step, args, (weights + bounded_read_bytes(cache)) / bandwidth)
            del cache, step
            detach(model)
            torch.cuda.empty_cache()
        if "dense_static_graph" in kinds:
            model.set_attn_implementation("sdpa")
            output, _ = prefill(model, prompt)
            token = output.logits[:, -1:].argmax(-1)
            dense = output.past_key_values
            del output
            if args.batch > 1:
                dense.batch_repeat_interleave(args.batch)
                token = token.repeat_interleave(args.batch, dim=0)
            static = static_copy(model, dense, args.length, args.length + args.steps * 4 + 64)
            del dense
            STATIC_ATTENTION.prepare(static, args.length, None)
            model.set_attn_implementation(STATIC_ATTENTION_NAME)
            step = Stepper(model, static, token, args.length, graph_over_static=STATIC_ATTENTION,
                           compile_layers=True, group_projections=not args.cublas_projections)
            step()
            bound_s = (weights + dense_read_bytes(model, args.batch, args.length)) / bandwidth
            report("dense_static_graph", step, args, bound_s)


if __name__ == "__main__":
    main()
