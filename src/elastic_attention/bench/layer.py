"""One hybrid attention layer: backends against dense attention and the ideal.

For each length and MSR (the share of KV heads routed to SSA), it times the routing work of one layer (router on
pooled keys, block tables, XA estimate) and the attention kernel of each backend (``flex``: its full KV heads through
SDPA, the rest through flex; ``flex_one_launch``: every head in one flex launch), next to dense causal attention in
the same run (SDPA: on CUDA the faster of its cuDNN and flash backends; FA4 when installed); "ideal" is the dense
time (FA4, else SDPA) multiplied by the fraction of causal blocks the hybrid layer attends. "total" is routing timed alone plus
the kernel timed alone (the host's launch latency of the routing counted in full); "pipelined" is the time per layer
of ``--pipelined-layers`` layers run back to back (routing, then attention, as in a forward pass, where the host
queues one layer's routing while the GPU still runs the previous attention). Every backend is checked against the
reference backend before it is timed. Results go to a JSON file with the date, device and command.

  elastic-attention bench layer --lengths 8k,32k,128k --msr 0.25,0.5,0.75,1.0 --out layer.json
  elastic-attention bench layer --device cpu --lengths 512 --heads 4 --kv-heads 2 --head-dim 32 --repeats 2 \\
      --out /tmp/layer.json                                                      (a smoke run on a CPU)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from elastic_attention import AttentionRouter
from elastic_attention.backends import ReferenceBackend, get_backend
from elastic_attention.bench.model import add_pattern_arguments, elastic_config
from elastic_attention.bench.timing import dense_baselines, parse_tokens, run_header, timed, write_result
from elastic_attention.help_format import finish_parser
from elastic_attention.patterns import MODE_CODES, BlockTableBuilder, SequenceLayout
from elastic_attention.router import boundary_pool


def attended_block_fraction(tables, length: int) -> float:
    """Attended (query block, key block) pairs over causal pairs, over all heads."""
    blocks = (length - 1) // tables.block_size + 1
    return float(tables.kv_block_count.sum()) / (tables.kv_block_count.shape[1] * blocks * (blocks + 1) / 2)


def run(args) -> dict:
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = elastic_config(args, args.configuration)
    retrieval, sparse = MODE_CODES[config.retrieval_mode], MODE_CODES[config.sparse_mode]
    router = AttentionRouter(args.head_dim).to(device).eval()
    backends = {name: layer_backend(name, args.flex_kernel_options) for name in args.backends}
    rows = []
    for length in args.lengths:
        generator = torch.Generator(device).manual_seed(length)
        shape = (1, args.heads, length, args.head_dim)
        query = torch.randn(shape, device=device, dtype=dtype, generator=generator)
        key = torch.randn((1, args.kv_heads, length, args.head_dim), device=device, dtype=dtype, generator=generator)
        value = torch.randn_like(key)
        layout = SequenceLayout.dense(1, length)
        scale = args.head_dim**-0.5
        dense = dense_baselines(query, key, value, device, args.repeats)
        for msr in args.msr:
            sparse_heads = round(msr * args.kv_heads)
            modes = torch.tensor([[sparse] * sparse_heads + [retrieval] * (args.kv_heads - sparse_heads)],
                                 device=device)

            # In a forward pass one builder serves every layer; its construction is timed apart, per forward.
            builder = BlockTableBuilder(layout, config, device)

            def routing():
                pooled = boundary_pool(key.transpose(1, 2), layout, config.pool_first, config.pool_last)
                router(pooled)
                return builder.build(modes, args.heads, query=query, key=key, scale=scale)[0]

            tables = routing()
            routing_seconds = timed(routing, device, args.repeats)
            builder_seconds = timed(lambda: BlockTableBuilder(layout, config, device), device, args.repeats)
            fraction = attended_block_fraction(tables, length)
            ideal_base = dense.get("dense_fa4_s", dense["dense_sdpa_s"])
            row = {"length": length, "msr": msr, **dense, "ideal_s": ideal_base * fraction,
                   "attended_block_fraction": fraction, "routing_and_tables_s": routing_seconds,
                   "patterns_per_forward_s": builder_seconds}
            for name, backend in backends.items():
                if length <= args.check_up_to:
                    expected = ReferenceBackend().attend(query, key, value, layout, tables, scale)
                    actual = backend.attend(query, key, value, layout, tables, scale)
                    error = float((actual.float() - expected.float()).abs().max())
                    if error > args.tolerance:
                        raise SystemExit(f"{name} differs from the reference by {error} at length {length}")
                    row[f"{name}_max_error"] = error
                kernel = timed(lambda: backend.attend(query, key, value, layout, tables, scale), device, args.repeats)

                def layers(backend=backend):
                    for _ in range(args.pipelined_layers):
                        backend.attend(query, key, value, layout, routing(), scale)

                pipelined = timed(layers, device, args.repeats) / args.pipelined_layers
                row[f"{name}_kernel_s"] = kernel
                row[f"{name}_total_s"] = kernel + routing_seconds
                row[f"{name}_total_over_ideal"] = (kernel + routing_seconds) / row["ideal_s"]
                row[f"{name}_routing_share"] = routing_seconds / (kernel + routing_seconds)
                row[f"{name}_pipelined_s"] = pipelined
                row[f"{name}_pipelined_over_ideal"] = pipelined / row["ideal_s"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {
        **run_header(device),
        "shape": {"heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "dtype": str(dtype)},
        "config": config.to_dict(),
        "flex_kernel_options": flex_options_used(args, device),
        "baseline": "dense causal attention in the same run: torch SDPA (on CUDA the faster of its cuDNN and flash "
                    "backends, each timed) and flash-attn-4 when installed; ideal = dense FA4 time (else SDPA) x "
                    "fraction of causal blocks attended",
        "results": rows,
    }


def layer_backend(name: str, flex_kernel_options: dict | None):
    """The backend called ``name``, or ``flex_one_launch``: flex with every head in its one launch (no SDPA for the
    dense heads); both flex kinds take ``flex_kernel_options`` when given."""
    if name not in ("flex", "flex_one_launch"):
        return get_backend(name)
    from elastic_attention.backends.flex import FlexBackend

    return FlexBackend(kernel_options=flex_kernel_options, dense_heads="sdpa" if name == "flex" else "flex")


def flex_options_used(args, device: torch.device) -> dict | None:
    """The kernel options the flex backend ran with: ``--flex-kernel-options``, else its per-GPU choice."""
    if args.flex_kernel_options is not None:
        return args.flex_kernel_options
    from elastic_attention.backends.flex import kernel_options_for

    return kernel_options_for(device, args.head_dim, args.block_size)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="elastic-attention bench layer",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=parse_tokens, default=parse_tokens("8k,32k,128k"))
    parser.add_argument("--msr", type=lambda t: [float(x) for x in t.split(",")], default=[0.25, 0.5, 0.75, 1.0])
    parser.add_argument("--backends", type=lambda t: t.split(","), default=["fa4", "flex"],
                        help="comma-separated: fa4, flex, flex_one_launch, cpu, reference")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--configuration", default="fa-ssa", choices=["fa-ssa", "fa-xa", "xa-ssa"])
    add_pattern_arguments(parser)
    parser.add_argument("--flex-kernel-options", type=json.loads, default=None,
                        help="flex_attention kernel options as JSON, instead of the backend's per-GPU choice "
                             "(studies/kernel_tuning/flex_kernel_sweep.py finds them)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--pipelined-layers", type=int, default=8, help="layers per timing of the pipelined layer")
    parser.add_argument("--check-up-to", type=int, default=8192, help="check backends against the reference up to")
    parser.add_argument("--tolerance", type=float, default=3e-2)
    parser.add_argument("--out", type=Path, required=True)
    finish_parser(parser, "elastic-attention bench layer --lengths 8k,32k --msr 0.5,1.0 --backends flex --out layer.json\n"
                          "elastic-attention bench layer --device cpu --lengths 1k --msr 0.5 --backends cpu,reference "
                          "--heads 4 --kv-heads 2 --out /tmp/layer.json")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    arguments = parse_args(argv)
    write_result(arguments.out, run(arguments))


if __name__ == "__main__":
    main()
