"""Time the XA estimate of one layer on a GPU: antidiagonal scores with float32 products against TF32 products
(exact for bf16 states), and the mass selection, for every query head of a layer (the worst case, MSR 0 of FA-XA).

  python scripts/xa_estimate_timing.py --lengths 32768,131072 --heads 32 --out xa_estimate.json
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
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--stride", type=int, default=16)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    exact_tf32 = xattention._tf32_products
    rows = []
    for length in args.lengths:
        generator = torch.Generator(device).manual_seed(length)
        query, key = (torch.randn(args.heads, length, args.head_dim, device=device, generator=generator,
                                  dtype=torch.bfloat16) for _ in range(2))

        def scores():
            return xattention.antidiagonal_block_scores(query, key, block_size=args.block_size, stride=args.stride)

        row = {"length": length, "heads": args.heads}
        for name, products in (("float32", lambda exact: contextlib.nullcontext()), ("tf32", exact_tf32)):
            xattention._tf32_products = products
            row[f"scores_{name}_s"] = timed(scores, device, args.repeats)
        xattention._tf32_products = exact_tf32
        estimated = scores()
        row["selection_s"] = timed(lambda: xattention.select_blocks_by_mass(estimated, args.threshold), device,
                                   args.repeats)
        print(json.dumps(row), flush=True)
        rows.append(row)
        del query, key, estimated
    with open(args.out, "w") as handle:
        json.dump({**run_header(device), "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
