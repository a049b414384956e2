"""Which `GemvOptions` make `grouped_linear` fastest on this GPU for a decoder layer's projections at a small batch
(``--rows``, 1 by default), and is it faster than cuBLAS there?

Builds the projections of ``--layers`` decoder layers of the given shape (default: Llama-3.1-8B; random bf16
weights, enough layers that no weight stays in L2 between two reads) and times one layer's projections (q, k, v;
o; gate, up; down) for ``--rows`` rows of input, cycling through the layers, as cuBLAS runs them
(``torch.nn.functional.linear`` per weight) and as `grouped_linear` runs them with each candidate (q/k/v and
gate/up in one launch each; one row: the CUDA-core kernel's candidates, more: the tensor-core kernel's): ``--steps``
layers captured as one CUDA graph and replayed, so no host time counts.
Every candidate's outputs are checked against cuBLAS's. Rows give microseconds per layer and the bandwidth reached
(weight bytes over time) next to the copy bandwidth of the same run; ``groups`` times each group alone, by cuBLAS
and by the fastest candidate. "fastest" is what `grouped_gemv.DEFAULT_OPTIONS` (one row) or `FEW_ROWS_OPTIONS`
(more) should hold for this GPU.

  python3 studies/kernel_tuning/gemv_sweep.py --out /tmp/gemv_sweep.json
  python3 studies/kernel_tuning/gemv_sweep.py --rows 8 --hidden 1536 --intermediate 8960 --heads 12 --kv-heads 2 \
      --out /tmp/gemv_sweep_qwen1.5b_rows8.json      # Qwen2.5-1.5B's shape at batch 8
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from pathlib import Path

import torch
import torch.nn.functional as F

from elastic_attention.bench.timing import copy_bandwidth, run_header, timed, write_result
from elastic_attention.integration.decode_graph import capture_graph
from elastic_attention.kernels.grouped_gemv import GemvOptions, grouped_linear

#: Candidates for one row of input (the CUDA-core kernel).
CANDIDATES = [GemvOptions(rows, cols, warps, stages) for rows, cols, warps, stages in
              itertools.product((2, 4, 8), (512, 1024, 2048), (2, 4, 8), (1, 3))]

#: Candidates for several rows (the tensor-core kernel: tiles of at least 16).
FEW_ROWS_CANDIDATES = [GemvOptions(rows, cols, warps, stages) for rows, cols, warps, stages in
                       itertools.product((16, 32, 64), (128, 256, 512), (4, 8), (3,))]


def name_of(options: GemvOptions) -> str:
    return f"r{options.block_rows}_c{options.block_cols}_w{options.num_warps}_s{options.num_stages}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=14336)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--rows", type=int, default=1, help="rows of input (a decode step's batch), 1 to 16")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--steps", type=int, default=12, help="layers per captured graph")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    generator = torch.Generator(device).manual_seed(0)

    def weight(rows, cols):
        return torch.randn(rows, cols, device=device, dtype=torch.bfloat16, generator=generator) * cols**-0.5

    h, i = args.hidden, args.intermediate
    q_rows, kv_rows = args.heads * args.head_dim, args.kv_heads * args.head_dim
    layers = [{"qkv": [weight(q_rows, h), weight(kv_rows, h), weight(kv_rows, h)], "o": [weight(h, q_rows)],
               "gate_up": [weight(i, h), weight(i, h)], "down": [weight(h, i)]} for _ in range(args.layers)]
    layer_bytes = sum(w.numel() * w.element_size() for ws in layers[0].values() for w in ws)
    bandwidth = copy_bandwidth(device)
    result = {**run_header(device), "copy_bandwidth_bytes_per_s": bandwidth, "layer_weight_bytes": layer_bytes,
              "shape": vars(args) | {"out": str(args.out)}}
    inputs = {group: torch.randn(args.rows, 1, cols, device=device, dtype=torch.bfloat16, generator=generator)
              for group, cols in (("qkv", h), ("o", q_rows), ("gate_up", h), ("down", i))}

    def cublas(x, ws):
        return [F.linear(x, w) for w in ws]

    def measure(project, groups=tuple(inputs)):
        def run_layers():
            outputs = []
            for step in range(args.steps):
                layer = layers[step % args.layers]
                outputs.extend(out for group in groups for out in project(inputs[group], layer[group]))
            return outputs

        graph, outputs = capture_graph(run_layers, [])
        return timed(graph.replay, device, args.repeats) / args.steps, [out.float() for out in outputs]

    reference_s, reference = measure(cublas)
    rows = [{"candidate": "cublas", "us_per_layer": reference_s * 1e6,
             "bandwidth_fraction": layer_bytes / reference_s / bandwidth}]
    for options in CANDIDATES if args.rows == 1 else FEW_ROWS_CANDIDATES:
        row = {"candidate": name_of(options), "options": dataclasses.asdict(options)}
        try:
            seconds, outputs = measure(lambda x, ws, options=options: grouped_linear(x, ws, None, options))
        except Exception as error:  # a candidate that does not compile or launch is reported, not fatal
            row["error"] = f"{type(error).__name__}: {error}"[:400]
        else:
            row |= {"us_per_layer": seconds * 1e6, "bandwidth_fraction": layer_bytes / seconds / bandwidth,
                    "speedup_vs_cublas": reference_s / seconds,
                    "max_difference_vs_cublas": max(float((a - b).abs().max()) for a, b in zip(outputs, reference))}
        rows.append(row)
        print(row, flush=True)
    best = min((row for row in rows[1:] if "us_per_layer" in row), key=lambda row: row["us_per_layer"])
    options = GemvOptions(**best["options"])
    groups = {}
    for group in inputs:
        group_bytes = sum(w.numel() * w.element_size() for w in layers[0][group])
        cublas_s = measure(cublas, (group,))[0]
        kernel_s = measure(lambda x, ws: grouped_linear(x, ws, None, options), (group,))[0]
        groups[group] = {"weight_bytes": group_bytes, "cublas_us": cublas_s * 1e6, "kernel_us": kernel_s * 1e6,
                         "cublas_bandwidth_fraction": group_bytes / cublas_s / bandwidth,
                         "kernel_bandwidth_fraction": group_bytes / kernel_s / bandwidth}
        print(group, groups[group], flush=True)
    result |= {"results": rows, "groups": groups,
               "fastest": {"candidate": best["candidate"], "options": best["options"],
                           "us_per_layer": best["us_per_layer"], "cublas_us_per_layer": reference_s * 1e6}}
    print(f"cublas {reference_s * 1e6:.1f} us/layer; fastest {best['candidate']} {best['us_per_layer']:.1f} us/layer "
          f"({best['bandwidth_fraction']:.2f} of copy bandwidth)", flush=True)
    write_result(args.out, result)


if __name__ == "__main__":
    main()
