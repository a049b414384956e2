"""End-to-end prefill of a decoder through Hugging Face: elastic attention against dense models.

The model is built from a config with random bf16 weights (default: the Llama-3.1-8B shape), so nothing is
downloaded. For each length it times one prefill (``logits_to_keep=1``, no cache) of:
  - ``sdpa``: the model with torch SDPA attention, cuDNN kernel;
  - ``fa4_dense``: the model with dense causal flash-attn-4 (registered through AttentionInterface);
  - ``elastic-<configuration>``: the model with elastic attention attached (backend ``--backend``), routing forced
    to ``--msr`` (the same random head choice for every configuration), block tables and XA estimates included.
It records the median seconds, the peak GPU memory of each prefill, and for elastic runs the measured MSR, ESR and
speedup over each dense model of the same length and run (``speedup_vs_<mode>``). Before timing, the elastic model's
last hidden state is checked against the same routing on the reference backend. Runs merge into one table with
`scripts/merge_bench_results.py prefill`.

  elastic-attention bench prefill --lengths 8k,32k,128k --out prefill.json
  elastic-attention bench prefill --device cpu --layers 2 --hidden 256 --heads 4 --kv-heads 2 --intermediate 512 \\
      --vocab 1000 --lengths 512 --configurations fa-ssa --modes sdpa --backend reference --out /tmp/prefill.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from elastic_attention import ElasticConfig, attach, detach, force_routing, routing_report
from elastic_attention.bench.model import (
    add_model_arguments,
    build_model,
    elastic_config,
    forced_routing,
    model_fields,
)
from elastic_attention.bench.merge_runs import runs_lines
from elastic_attention.bench.timing import parse_tokens, run_header, timed, write_result
from elastic_attention.help_format import finish_parser
from elastic_attention.io import atomic_write_text

FA4_DENSE = "fa4_dense"
ELASTIC_PREFIX = "elastic-"


def register_fa4_dense() -> None:
    """Dense causal flash-attn-4 as a transformers attention implementation (the fastest dense baseline)."""
    from flash_attn.cute import flash_attn_func
    from transformers import AttentionInterface

    def fa4_dense(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        output, _ = flash_attn_func(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), softmax_scale=scaling, causal=True
        )
        return output, None

    AttentionInterface.register(FA4_DENSE, fa4_dense)


def run(args) -> dict:
    device = torch.device(args.device)
    model = build_model(args, device, max(args.lengths))
    if FA4_DENSE in args.modes:
        register_fa4_dense()
    routing = forced_routing(args.layers, args.kv_heads, args.msr, args.seed)
    rows = []
    for length in args.lengths:
        generator = torch.Generator(device).manual_seed(length)
        input_ids = torch.randint(0, args.vocab, (1, length), device=device, generator=generator)

        def prefill():
            with torch.inference_mode():
                return model(input_ids=input_ids, use_cache=False, logits_to_keep=1)

        for mode in args.modes:
            model.set_attn_implementation(mode)
            rows.append(measure(prefill, device, args, {"length": length, "model": mode}))
        for configuration in args.configurations:
            config = elastic_config(args, configuration)
            if length <= args.check_up_to:
                check_against_reference(model, input_ids, config, routing, args.backend)
            attach(model, config, backend=args.backend)
            force_routing(model, routing)
            row = measure(prefill, device, args, {"length": length, "model": f"{ELASTIC_PREFIX}{configuration}"})
            report = routing_report(model)
            row.update(msr=float(report.msr.mean()), esr_mean=float(report.esr_mean.mean()))
            detach(model)
            rows.append(row)
    return {
        **run_header(device),
        "model": model_fields(args),
        "elastic": {"backend": args.backend, "msr": args.msr, "block_size": args.block_size, "sink": args.sink,
                    "local": args.local},
        "baselines": "sdpa (cuDNN) and fa4_dense models, same weights, same inputs, same process",
        "results": with_speedups(rows),
    }


def with_speedups(rows: list[dict]) -> list[dict]:
    """The rows, each elastic row with ``speedup_vs_<mode>``: the seconds of every dense mode measured at its length
    among ``rows`` (one run's) over its own seconds."""
    dense = [row for row in rows if not row["model"].startswith(ELASTIC_PREFIX)]
    return [row if not row["model"].startswith(ELASTIC_PREFIX) else
            {**row, **{f"speedup_vs_{base['model']}": base["seconds"] / row["seconds"]
                       for base in dense if base["length"] == row["length"]}}
            for row in rows]


def markdown(result: dict) -> str:
    """The results as one markdown table: a row per length and model, elastic rows with their speedups over the
    dense models of their own run."""
    several_runs = len(result.get("runs") or []) > 1
    modes = list(dict.fromkeys(row["model"] for row in result["results"]
                               if not row["model"].startswith(ELASTIC_PREFIX)))
    lines = runs_lines(result, "Prefill benchmark") + [""]
    lines.append("| length | model | seconds | " + "".join(f"speedup vs {mode} | " for mode in modes)
                 + "MSR | ESR | peak memory (GiB) |" + (" run |" if several_runs else ""))
    lines.append("|---" * (6 + len(modes) + several_runs) + "|")
    for row in result["results"]:
        speedups = "".join(f"{row[f'speedup_vs_{mode}']:.2f}x | " if f"speedup_vs_{mode}" in row else "- | "
                           for mode in modes)
        msr, esr = (f"{row[key]:.2f}" if key in row else "-" for key in ("msr", "esr_mean"))
        peak = f"{row['peak_memory_gib']:.1f}" if "peak_memory_gib" in row else "-"
        lines.append(f"| {row['length']} | {row['model']} | {row['seconds']:.3f} | {speedups}{msr} | {esr} | {peak} |"
                     + (f" {row['run']} |" if several_runs else ""))
    return "\n".join(lines) + "\n"


def measure(prefill, device: torch.device, args, row: dict) -> dict:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
            seconds = timed(prefill, device, args.repeats, warmup=1)
        row["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    else:
        seconds = timed(prefill, device, args.repeats, warmup=1)
    row["seconds"] = seconds
    print(row, flush=True)
    return row


def check_against_reference(model, input_ids, config: ElasticConfig, routing, backend: str) -> None:
    """The last hidden state with ``backend`` and with the reference backend agree (cosine > 0.99 per position)."""
    states = []
    for name in (backend, "reference"):
        attach(model, config, backend=name)
        force_routing(model, routing)
        with torch.inference_mode():
            output = model.model(input_ids=input_ids, use_cache=False)
        states.append(output.last_hidden_state[0].float())
        detach(model)
    cosine = torch.nn.functional.cosine_similarity(states[0], states[1], dim=-1)
    if float(cosine.min()) < 0.99:
        raise SystemExit(f"{backend} disagrees with the reference: min cosine {float(cosine.min()):.4f}")
    print({"check": backend, "length": input_ids.shape[1], "min_cosine": float(cosine.min())}, flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="elastic-attention bench prefill",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=parse_tokens, default=parse_tokens("8k,32k,128k"))
    parser.add_argument("--modes", type=lambda t: [m for m in t.split(",") if m], default=["sdpa", FA4_DENSE],
                        help="dense baselines (attention implementations)")
    parser.add_argument("--configurations", type=lambda t: [m for m in t.split(",") if m],
                        default=["fa-ssa", "fa-xa", "xa-ssa"])
    parser.add_argument("--backend", default="fa4")
    parser.add_argument("--msr", type=float, default=0.7)
    add_model_arguments(parser)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--check-up-to", type=int, default=8192, help="check against the reference up to")
    parser.add_argument("--out", type=Path, required=True)
    finish_parser(parser, 'elastic-attention bench prefill --lengths 8k,32k,128k --out prefill.json')
    return parser.parse_args(argv)


def main(argv=None) -> None:
    arguments = parse_args(argv)
    result = run(arguments)
    write_result(arguments.out, result)
    atomic_write_text(arguments.out.with_suffix(".md"), markdown(result))


if __name__ == "__main__":
    main()
