"""Which flex_attention kernel options make the flex backend fastest on this GPU, for one head_dim and block size?

Times the flex backend's kernel on one hybrid FA-SSA layer (the layer benchmark's shape and routing: the first
round(MSR x KV heads) heads on SSA) for each candidate set of kernel options, next to dense SDPA (the faster of
cuDNN and flash) in the same run; "fastest" is the candidate of least total time over every point. Each candidate
is first checked against the reference backend at 4K tokens; one that fails to compile or to match is reported with
its error and skipped. The fastest candidate is what `backends.flex.KERNEL_OPTIONS` should hold for this GPU
generation and shape.

  python3 studies/kernel_tuning/flex_kernel_sweep.py --lengths 32k,128k --msr 0.25,0.5,0.75 --out /tmp/flex_sweep.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from elastic_attention.backends import ReferenceBackend
from elastic_attention.backends.flex import FlexBackend, kernel_options_for
from elastic_attention.bench.model import add_pattern_arguments, elastic_config
from elastic_attention.bench.timing import dense_baselines, parse_tokens, run_header, timed, write_result
from elastic_attention.patterns import MODE_CODES, BlockTableBuilder, SequenceLayout

# torch's default on Hopper for bf16 and head_dim 128 is BLOCK_M 128, BLOCK_N 64, 3 stages, 8 warps.
CANDIDATES = {
    "torch_default": None,
    "m128_n128_s2_w8": {"BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 2, "num_warps": 8},
    "m128_n64_s4_w8": {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 4, "num_warps": 8},
    "m128_n64_s3_w8_tma": {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3, "num_warps": 8, "USE_TMA": True},
    "m128_n128_s2_w8_tma": {"BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 2, "num_warps": 8, "USE_TMA": True},
    "m64_n128_s3_w4": {"BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 3, "num_warps": 4},
}


def hybrid_inputs(length: int, msr: float, args, config, device: torch.device):
    """Random bf16 query/key/value [1, H, T, D] and the block tables of a layer with that share of SSA heads."""
    generator = torch.Generator(device).manual_seed(length)
    query = torch.randn((1, args.heads, length, args.head_dim), device=device, dtype=torch.bfloat16,
                        generator=generator)
    key = torch.randn((1, args.kv_heads, length, args.head_dim), device=device, dtype=torch.bfloat16,
                      generator=generator)
    value = torch.randn_like(key)
    layout = SequenceLayout.dense(1, length)
    sparse_heads = round(msr * args.kv_heads)
    modes = torch.tensor([[MODE_CODES["ssa"]] * sparse_heads + [MODE_CODES["full"]] * (args.kv_heads - sparse_heads)],
                         device=device)
    scale = args.head_dim**-0.5
    tables = BlockTableBuilder(layout, config, device).build(modes, args.heads, query=query, key=key, scale=scale)[0]
    return query, key, value, layout, tables, scale


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=parse_tokens, default=parse_tokens("32k,128k"))
    parser.add_argument("--msr", type=lambda t: [float(x) for x in t.split(",")], default=[0.25, 0.5, 0.75])
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    add_pattern_arguments(parser)
    parser.add_argument("--candidates", type=lambda t: t.split(","), default=list(CANDIDATES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    config = elastic_config(args, "fa-ssa")
    check = hybrid_inputs(4096, 0.5, args, config, device)
    expected = ReferenceBackend().attend(*check)
    dense = {}
    for length in args.lengths:
        query, key, value, *_ = hybrid_inputs(length, 0.0, args, config, device)
        dense[length] = dense_baselines(query, key, value, device, args.repeats)
    rows = []
    for name in args.candidates:
        backend = FlexBackend(kernel_options=CANDIDATES[name])
        try:
            error = float((backend.attend(*check).float() - expected.float()).abs().max())
        except Exception as failure:  # a tile that does not fit shared memory or the block: report and go on
            rows.append({"candidate": name, "error": f"{type(failure).__name__}: {str(failure)[:300]}"})
            print(json.dumps(rows[-1]), flush=True)
            continue
        for length in args.lengths:
            for msr in args.msr:
                inputs = hybrid_inputs(length, msr, args, config, device)
                seconds = timed(lambda: backend.attend(*inputs), device, args.repeats)
                rows.append({"candidate": name, "kernel_options": CANDIDATES[name], "length": length, "msr": msr,
                             "flex_kernel_s": seconds, "max_error_4k": error, **dense[length],
                             "flex_over_dense_sdpa": seconds / dense[length]["dense_sdpa_s"]})
                print(json.dumps(rows[-1]), flush=True)
    totals: dict[str, float] = {}
    for row in rows:
        if "flex_kernel_s" in row:
            totals[row["candidate"]] = totals.get(row["candidate"], 0.0) + row["flex_kernel_s"]
    if not totals:
        raise SystemExit("no candidate ran; see the errors above")
    fastest = min(totals, key=totals.get)
    write_result(args.out, {
        **run_header(device),
        "shape": {"heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
                  "block_size": args.block_size, "dtype": "torch.bfloat16"},
        "current_default": kernel_options_for(device, args.head_dim, args.block_size),
        "baseline": "dense causal SDPA in the same run (cuDNN and flash timed, dense_sdpa_s the faster)",
        "total_s_by_candidate": totals,
        "fastest": {"candidate": fastest, "kernel_options": CANDIDATES[fastest], "total_s": totals[fastest]},
        "results": rows,
    })
    print(json.dumps({"fastest": fastest, "totals": totals}, indent=1))


if __name__ == "__main__":
    main()
