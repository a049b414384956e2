"""Time the XA estimate of one layer on a GPU, for every query head of a layer (the worst case, MSR 0 of FA-XA):
the torch rule's antidiagonal scores with float32 products and with TF32 products (exact for bf16 states), the
one-pass Triton estimate (`backends.triton_xattention`, checked against the TF32 scores first), and the mass selection.

  python scripts/xa_estimate_timing.py --lengths 32768,131072 --heads 32 --kv-heads 8 --out xa_estimate.json
  python scripts/xa_estimate_timing.py --sweep ...   # also time each of SWEEP's launch settings of the Triton estimate
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch

from elastic_attention.backends.triton_xattention import EstimateLaunch, antidiagonal_block_scores_triton
from elastic_attention.bench.timing import run_header, timed
from elastic_attention.patterns import xattention

#: Launch settings the sweep tries: (tile_rows, max_heads_per_program, block_k, num_warps, num_stages).
SWEEP = [(64, 4, 64, 4, 3), (64, 4, 64, 8, 3), (64, 4, 128, 8, 3), (64, 2, 64, 4, 3), (64, 1, 64, 4, 3),
         (128, 2, 64, 8, 3), (128, 1, 64, 8, 3), (32, 4, 64, 4, 3), (64, 4, 64, 8, 2), (128, 4, 64, 8, 2)]


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
    parser.add_argument("--sweep", action="store_true", help="time every launch setting of SWEEP too")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    exact_tf32 = xattention._tf32_products
    rows = []
    for length in args.lengths:
        generator = torch.Generator(device).manual_seed(length)
        query, key = (torch.randn(heads, length, args.head_dim, device=device, generator=generator,
                                  dtype=torch.bfloat16) for heads in (args.heads, args.kv_heads))

        def scores():
            return xattention.antidiagonal_block_scores(query, key, block_size=args.block_size, stride=args.stride)

        row = {"length": length, "heads": args.heads, "kv_heads": args.kv_heads}
        for name, products in (("float32", lambda exact: contextlib.nullcontext()), ("tf32", exact_tf32)):
            xattention._tf32_products = products
            row[f"scores_{name}_s"] = timed(scores, device, args.repeats)
        xattention._tf32_products = exact_tf32
        estimated = scores()

        def triton_scores():
            return antidiagonal_block_scores_triton(query, key, block_size=args.block_size, stride=args.stride)

        row["triton_max_abs_difference"] = float((triton_scores() - estimated).abs().max())
        row["scores_triton_s"] = timed(triton_scores, device, args.repeats)
        for setting in SWEEP if args.sweep else []:
            launch = EstimateLaunch(*setting)
            try:
                swept = antidiagonal_block_scores_triton(query, key, block_size=args.block_size, stride=args.stride,
                                                         launch=launch)
                assert float((swept - estimated).abs().max()) < 1e-4, setting
                row[f"scores_triton_{'_'.join(map(str, setting))}_s"] = timed(
                    lambda: antidiagonal_block_scores_triton(query, key, block_size=args.block_size,
                                                             stride=args.stride, launch=launch), device, args.repeats)
            except Exception as error:  # a setting the compiler rejects (shared memory, registers) is recorded
                row[f"scores_triton_{'_'.join(map(str, setting))}_error"] = repr(error)[:200]
        row["selection_s"] = timed(lambda: xattention.select_blocks_by_mass(estimated, args.threshold), device,
                                   args.repeats)
        print(json.dumps(row), flush=True)
        rows.append(row)
        del query, key, estimated
    with open(args.out, "w") as handle:
        json.dump({**run_header(device), "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
