"""How sure are an adapter's routers? Per task, on the evaluation's rows: the MSR of the argmax routing (what
inference uses), the share of (layer, KV head) decisions whose logit margin |FA - SA| is below 1 and below 2, and the
MSR that training's hard Gumbel sampling would give in expectation (mean sigmoid(SA - FA)). A router whose expected
MSR equals its argmax MSR, with few small margins, is evaluated on the routings it was trained on.

    python studies/router_recipes_0.5b/router_margins.py --model artifacts/qwen2.5-coder-0.5b-instruct \
        --router src/elastic_attention/assets/routers/qwen2.5-coder-0.5b-instruct --tasks all --length 4k --samples 2

Prints one line per task; --out writes them as JSON with the date, device, command, model and router.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence

import torch


def margin_table(model, tokenizer, tasks: Sequence[str], length: int, samples: int, seed: int = 0) -> list[dict]:
    """One record per task: argmax MSR, shares of |margin| < 1 and < 2, expected MSR under Gumbel sampling, over
    ``samples`` rows of the task at ``length`` (the rows of `elastic-attention eval` for the same seed)."""
    from elastic_attention.chat import render_prompt
    from elastic_attention.evaluation.suites import suite_of
    from elastic_attention.integration import routers_of

    from elastic_attention.router import HeadSetRouter

    if any(isinstance(router, HeadSetRouter) for router in routers_of(model).values()):
        raise SystemExit("this adapter's router chooses one head set per prompt (head_set_choices): the margins here "
                         "are between a KV head's two classes, which it does not have")
    margins: dict[int, torch.Tensor] = {}

    def record(index):
        def hook(router, inputs, output):
            logits = router.logits(inputs[0]).detach()
            margin = logits[..., 1] - logits[..., 0]
            pinned = router.pinned_heads()  # always sparse, whatever their logits
            margins[index] = (margin if pinned is None else margin.masked_fill(pinned, -math.inf)).cpu()  # [batch, Hkv]
        return hook

    handles = [router.register_forward_hook(record(index)) for index, router in routers_of(model).items()]
    device = next(model.parameters()).device
    table = []
    try:
        for task in tasks:
            collected = []
            for row in suite_of(task).generate(task, length, seed, samples, tokenizer):
                ids = tokenizer(render_prompt(tokenizer, row.prompt), return_tensors="pt", add_special_tokens=False)
                margins.clear()
                with torch.no_grad():
                    model(input_ids=ids.input_ids.to(device), use_cache=False, logits_to_keep=1)
                collected.append(torch.stack([margins[index][0] for index in sorted(margins)]))  # [layers, Hkv]
            margin = torch.stack(collected).double()
            table.append({"task": task, "length": length, "samples": samples,
                          "msr": float((margin < 0).double().mean()),
                          "margin_below_1": float((margin.abs() < 1).double().mean()),
                          "margin_below_2": float((margin.abs() < 2).double().mean()),
                          "expected_msr_sampled": float(torch.sigmoid(-margin).mean())})
    finally:
        for handle in handles:
            handle.remove()
    return table


def main(argv: Sequence[str] | None = None) -> list[dict]:
    from elastic_attention.adapters import load_router
    from elastic_attention.bench.timing import run_header
    from elastic_attention.cli import parse_length
    from elastic_attention.evaluation.pipeline import load_backbone, resolve_tasks
    from elastic_attention.io import atomic_write_text

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="folder of the backbone and its tokenizer")
    parser.add_argument("--router", required=True, help="router adapter folder")
    parser.add_argument("--suite", default="code", choices=["synthetic", "code"])
    parser.add_argument("--tasks", default="all", help="comma list of task names, or all / sensitive / robust")
    parser.add_argument("--length", type=parse_length, required=True, help="prompt length, e.g. 4k")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--out", help="JSON file for the table")
    args = parser.parse_args(argv)

    model, tokenizer = load_backbone(args.model, device=args.device, dtype=args.dtype)
    load_router(model, args.router)
    tasks = resolve_tasks([name.strip() for name in args.tasks.split(",") if name.strip()], args.suite)
    table = margin_table(model, tokenizer, tasks, args.length, args.samples, args.seed)
    for entry in table:
        print(f"{entry['task']:18} MSR {entry['msr']:.2f}  |margin| < 1: {entry['margin_below_1']:.2f}  "
              f"< 2: {entry['margin_below_2']:.2f}  expected MSR when sampled {entry['expected_msr_sampled']:.2f}")
    if args.out:
        header = run_header(next(model.parameters()).device)
        atomic_write_text(args.out, json.dumps({**header, "model": args.model, "router": args.router, "table": table},
                                               indent=1))
    return table


if __name__ == "__main__":
    main(sys.argv[1:])
