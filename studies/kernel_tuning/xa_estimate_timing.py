"""Time the XA estimate of one layer on a GPU, for every query head of a layer (the worst case, MSR 0 of FA-XA): the
antidiagonal scores of bf16 states with float32 copies multiplied in float32 ("float32") and in TF32 ("tf32", exact
for bf16 values), and multiplied in bf16 into float32 results ("bf16", the default since 2026-11-30), checked against
each other; then the mass selection.

  python studies/kernel_tuning/xa_estimate_timing.py --lengths 32768,131072 --heads 32 --kv-heads 8 --out xa_estimate.json
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch

from elastic_attention.bench.timing import run_header, timed
from elastic_attention.patterns import xattention


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=lambda t: [int(x) for x in t.split(",")], default=[32768, 131072])
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--stride", type=int, default=16)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    half_on_gpu = xattention._half_on_gpu
    float_copies = {"float32": contextlib.nullcontext, "tf32": xattention._tf32_products}
    rows = []
    for length in args.lengths:
        generator = torch.Generator(device).manual_seed(length)
        query, key = (torch.randn(heads, length, args.head_dim, device=device, generator=generator,
                                  dtype=torch.bfloat16) for heads in (args.heads, args.kv_heads))

        def scores():
            return xattention.antidiagonal_block_scores(query, key, block_size=args.block_size, stride=args.stride)

        row = {"length": length, "heads": args.heads, "kv_heads": args.kv_heads}
        results = {}
        for name, products in float_copies.items():
            xattention._half_on_gpu = lambda query, key: False  # the float32 copies of the states
            with products():
                results[name] = scores()
                row[f"scores_{name}_s"] = timed(scores, device, args.repeats)
        xattention._half_on_gpu = half_on_gpu
        results["bf16"] = scores()
        row["scores_bf16_s"] = timed(scores, device, args.repeats)
        row["max_abs_difference_to_float32"] = {name: float((result - results["float32"]).abs().max())
                                                for name, result in results.items()}
        row["selection_s"] = timed(lambda: xattention.select_blocks_by_mass(results["bf16"], args.threshold), device,
                                   args.repeats)
        print(json.dumps(row), flush=True)
        rows.append(row)
        del query, key, results
    with open(args.out, "w") as handle:
        json.dump({**run_header(device), "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
