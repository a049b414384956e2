"""Where does the time of a replayed decode step go? The kernels of one captured step of `bench decode-graphs`
(``bounded``: elastic attention, its decoder layers compiled; ``dense_static_graph``: the plain model over
transformers' StaticCache), grouped (matrix products, the decode attention kernels, Inductor's fused kernels, the
rest), per step, against the step's time (CUDA events) and its bandwidth bound; the difference between the step's time
and the sum of its kernels is the time between kernels.

  python scripts/profile_decode_graph.py --length 131072 --batch 1 [--kinds bounded,dense_static_graph]

``--blas`` (torch's preferred BLAS library) and ``--exact-bf16-reductions`` (no reduced-precision reductions in
bf16 matrix products) ask whether cuBLAS's choice of GEMV kernels can be bettered for the captured step;
``--cublas-projections`` profiles the steps with cuBLAS projections in place of the grouped Triton launches.
"""

from __future__ import annotations

import argparse
import collections

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
    "matrix products": ("gemv", "gemm", "nvjet", "cutlass", "sm90", "splitk", "cublas"),
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


def report(kind: str, step, args, bound_s: float) -> None:
    step_s = timed(step, torch.device(args.device), args.steps, warmup=2)
    groups, top = profile_steps(step, args.profile_steps)
    kernel_us = sum(us for us, _ in groups.values())
    print(f"== {kind}, length {args.length}, batch {args.batch}: step {step_s * 1e3:.3f} ms, bound {bound_s * 1e3:.3f} "
          f"ms ({step_s / bound_s:.2f}x); kernels {kernel_us / 1e3:.3f} ms, between kernels "
          f"{step_s * 1e3 - kernel_us / 1e3:.3f} ms", flush=True)
    for group, (us, count) in sorted(groups.items(), key=lambda item: -item[1][0]):
        print(f"   {group:34s} {us / 1e3:7.3f} ms  {count:6.0f} kernels")
    for name, us, count in top:
        print(f"   {us:9.1f} us {count:5.0f}x  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--length", type=int, default=131072)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--msr", type=float, default=0.7)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--kinds", default="bounded,dense_static_graph")
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
    args.kernel_options = None
    device = torch.device(args.device)
    compile_in_process()
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
