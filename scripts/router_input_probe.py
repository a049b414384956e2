"""Can a router at layer L tell a prompt's kind from what it sees? Takes the router's input (the layer's pre-RoPE keys,
boundary-pooled exactly as the router pools them) for rows of every task of a suite, fits a logistic regression
(sensitive = 1, robust = 0) on the tasks not held out, and prints per task the share of rows it assigns to their
own kind: held-out tasks show whether the input carries the kind or only the training tasks' surface. A head-set
router decides at the first routed layer (layer 0 by default), so this says what it can learn there.

    python scripts/router_input_probe.py --model artifacts/qwen2.5-coder-1.5b-instruct --suite code \
        --held-out multivalue,recent_definition --lengths 4k,8k --rows 20

Each forward stops at layer L (nothing after the router's input is computed). --out writes the table as JSON with
the date, device, command and model.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch


class _Captured(Exception):
    """Raised by the router's pre-hook once it holds its input: the rest of the forward is not needed."""


def pooled_router_input(model, router, input_ids: torch.Tensor) -> torch.Tensor:
    """[N, Hkv, D] float32 on the CPU: what ``router`` (a router of ``model``'s attached runtime) reads for the
    prompts ``input_ids`` [N, T], its layer's boundary-pooled pre-RoPE keys. The forward stops there."""
    seen: list[torch.Tensor] = []

    def capture(module, args):
        seen.append(args[0].detach().float().cpu())
        raise _Captured

    hook = router.register_forward_pre_hook(capture)
    try:
        with torch.no_grad():
            model(input_ids=input_ids.to(next(model.parameters()).device), use_cache=False, logits_to_keep=1)
    except _Captured:
        pass
    finally:
        hook.remove()
    if not seen:
        raise RuntimeError("the forward never reached the router: is it a router of this model?")
    return seen[0]


def router_inputs(model, tokenizer, suite: str, tasks: Sequence[str], lengths: Sequence[int], rows: int, layer: int,
                  seed: int = 0) -> tuple[torch.Tensor, list[str]]:
    """([M, Hkv * D] the pooled keys layer ``layer``'s router reads, one row per prompt; each prompt's task)."""
    import elastic_attention as ea
    from elastic_attention.chat import render_prompt
    from elastic_attention.evaluation.suites import get_suite

    ea.attach(model, ea.ElasticConfig(routed_layers=(layer,)), backend="reference")
    (router,) = ea.routers_of(model).values()
    features, names = [], []
    try:
        for length in lengths:
            for task in tasks:
                for row in get_suite(suite).generate(task, length, seed, rows, tokenizer):
                    ids = tokenizer(render_prompt(tokenizer, row.prompt), return_tensors="pt", add_special_tokens=False)
                    features.append(pooled_router_input(model, router, ids.input_ids)[0].flatten())
                    names.append(task)
    finally:
        ea.detach(model)
    return torch.stack(features), names


def kind_table(features: torch.Tensor, names: list[str], kinds: dict[str, str], held_out: set[str],
               steps: int = 500) -> list[dict]:
    """Fit a logistic regression (standardized inputs, L2 1e-3, Adam) on the rows of tasks not in ``held_out``; per
    task, the share of its rows predicted as its kind."""
    label = torch.tensor([kinds[name] == "sensitive" for name in names], dtype=torch.float32)
    train = torch.tensor([name not in held_out for name in names])
    mean, scale = features[train].mean(0), features[train].std(0) + 1e-6
    standardized = (features - mean) / scale
    weight = torch.zeros(features.shape[1], requires_grad=True)
    bias = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        logits = standardized[train] @ weight + bias
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, label[train]) + 1e-3 * weight.square().sum()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        predicted = ((standardized @ weight + bias) > 0).float()
    table = []
    for task in dict.fromkeys(names):
        rows = [index for index, name in enumerate(names) if name == task]
        table.append({"task": task, "kind": kinds[task], "held_out": task in held_out, "rows": len(rows),
                      "predicted_as_its_kind": float((predicted[rows] == label[rows]).float().mean())})
    return table


def main(argv: Sequence[str] | None = None) -> list[dict]:
    from elastic_attention.bench.timing import run_header
    from elastic_attention.cli import parse_length
    from elastic_attention.evaluation.pipeline import load_backbone
    from elastic_attention.evaluation.suites import get_suite
    from elastic_attention.io import atomic_write_text

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="folder of the backbone and its tokenizer")
    parser.add_argument("--suite", default="code", choices=["synthetic", "code"])
    parser.add_argument("--held-out", default="", help="comma list of tasks the regression does not see")
    parser.add_argument("--lengths", type=lambda text: [parse_length(t) for t in text.split(",")], default=[4096])
    parser.add_argument("--rows", type=int, default=20, help="rows per task and length")
    parser.add_argument("--layer", type=int, default=0, help="the layer whose router input is probed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    suite = get_suite(args.suite)
    held_out = {task for task in args.held_out.split(",") if task}
    suite.resolve(sorted(held_out))  # unknown names are refused
    model, tokenizer = load_backbone(args.model, args.device, "float32")
    features, names = router_inputs(model, tokenizer, args.suite, suite.tasks, args.lengths, args.rows, args.layer,
                                    args.seed)
    table = kind_table(features, names, {task: suite.kind(task) for task in suite.tasks}, held_out)
    for record in table:
        print(f"{record['task']:20s} {record['kind']:9s} {'held out' if record['held_out'] else 'trained':8s} "
              f"predicted as its kind: {record['predicted_as_its_kind']:.2f} ({record['rows']} rows)")
    if args.out is not None:
        document = {**run_header(next(model.parameters()).device), "model": args.model, "layer": args.layer,
                    "lengths": args.lengths, "held_out": sorted(held_out), "results": table}
        atomic_write_text(args.out, json.dumps(document, indent=2))
    return table


if __name__ == "__main__":
    main()
