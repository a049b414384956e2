"""Can a router at layer L tell a prompt's kind from what it sees? Takes the router's input (the layer's pre-RoPE keys,
boundary-pooled exactly as the router pools them) for rows of every task of a suite, fits a logistic regression
(sensitive = 1, robust = 0) on the tasks not held out, and prints per task the share of rows it assigns to their
own kind: held-out tasks show whether the input carries the kind or only the training tasks' surface. A head-set
router decides at the first routed layer (layer 0 by default), so this says what it can learn there.

    python studies/head_set_routing_1.5b/router_input_probe.py --model artifacts/qwen2.5-coder-1.5b-instruct --suite code \
        --held-out multivalue,recent_definition --lengths 4k,8k --rows 20 --layers 0,2 --unseen-seed 7

--tasks and --positive ask the same of any split of tasks instead of the two kinds, e.g. whether one sensitive task
can be told from the others (`--tasks passkey,multikey,find_definition --positive multikey`).

Each forward stops at layer L (nothing after the router's input is computed). With --unseen-seed each fit is also
scored on rows drawn with that seed, which it never saw. --out writes the table as JSON with the date, device,
command and model.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch


def pooled_router_input(model, router, input_ids: torch.Tensor) -> torch.Tensor:
    """[N, Hkv, D] float32 on the CPU: what ``router`` (a router of ``model``'s attached runtime) reads for the
    prompts ``input_ids`` [N, T], its layer's boundary-pooled pre-RoPE keys. The forward stops there."""
    from elastic_attention.integration.routing import read_router_input

    device = next(model.parameters()).device
    return read_router_input(router, lambda: model(input_ids=input_ids.to(device), use_cache=False, logits_to_keep=1))


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
               steps: int = 500, unseen: tuple[torch.Tensor, list[str]] | None = None,
               positive: str = "sensitive") -> list[dict]:
    """Fit a logistic regression (standardized inputs, L2 1e-3, Adam; label 1 where ``kinds[task] == positive``) on
    the rows of tasks not in ``held_out``; per task, the share of its rows predicted as its kind. ``unseen``
    (features, names of other rows of the same tasks, e.g. drawn with another seed) adds each task's share among
    those rows: what the fit does on prompts it never saw."""
    label = torch.tensor([kinds[name] == positive for name in names], dtype=torch.float32)
    train = torch.tensor([name not in held_out for name in names])
    mean, scale = features[train].mean(0), features[train].std(0) + 1e-6
    weight = torch.zeros(features.shape[1], requires_grad=True)
    bias = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=0.01)
    standardized = (features - mean) / scale
    for _ in range(steps):
        optimizer.zero_grad()
        logits = standardized[train] @ weight + bias
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, label[train]) + 1e-3 * weight.square().sum()
        loss.backward()
        optimizer.step()

    def shares(rows_features: torch.Tensor, rows_names: list[str]) -> dict[str, tuple[float, int]]:
        with torch.no_grad():
            predicted = ((((rows_features - mean) / scale) @ weight + bias) > 0).float()
        truth = torch.tensor([kinds[name] == positive for name in rows_names], dtype=torch.float32)
        return {task: (float((predicted[rows] == truth[rows]).float().mean()), len(rows))
                for task in dict.fromkeys(rows_names)
                for rows in [[index for index, name in enumerate(rows_names) if name == task]]}

    seen_shares = shares(features, names)
    unseen_shares = shares(*unseen) if unseen is not None else {}
    table = []
    for task, (share, count) in seen_shares.items():
        record = {"task": task, "kind": kinds[task], "held_out": task in held_out, "rows": count,
                  "predicted_as_its_kind": share}
        if task in unseen_shares:
            record["predicted_as_its_kind_unseen_rows"], record["unseen_rows"] = unseen_shares[task]
        table.append(record)
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
    parser.add_argument("--tasks", default="", help="comma list of the tasks probed (default: every task of the suite)")
    parser.add_argument("--positive", default="",
                        help="comma list of the tasks on one side (default: the two sides are the suite's kinds)")
    parser.add_argument("--lengths", type=lambda text: [parse_length(t) for t in text.split(",")], default=[4096])
    parser.add_argument("--rows", type=int, default=20, help="rows per task and length")
    parser.add_argument("--layers", type=lambda text: [int(t) for t in text.split(",")], default=[0],
                        help="comma list of the layers whose router input is probed, one fit each")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--unseen-seed", type=int, default=None,
                        help="also draw the rows with this seed and report each fit's shares on them")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.unseen_seed is not None and args.unseen_seed == args.seed:
        parser.error("--unseen-seed equals --seed: the unseen rows would be the fitted ones")
    suite = get_suite(args.suite)
    def task_list(text: str) -> list[str]:  # unknown names are refused
        names = [name for name in text.split(",") if name]
        return suite.resolve(names) if names else []

    held_out, positive = set(task_list(args.held_out)), set(task_list(args.positive))
    tasks = task_list(args.tasks) if args.tasks else list(suite.tasks)
    if not positive <= set(tasks) or not held_out <= set(tasks):
        parser.error(f"--positive and --held-out name tasks outside --tasks {','.join(tasks)}: add them there")
    if positive and not set(tasks) - positive:
        parser.error("--positive names every probed task: the regression needs rows on both sides")
    model, tokenizer = load_backbone(args.model, args.device, "float32")
    kinds = ({task: "positive" if task in positive else "other" for task in tasks} if positive
             else {task: suite.kind(task) for task in tasks})
    positive_kind = "positive" if positive else "sensitive"
    table = []
    for layer in args.layers:
        features, names = router_inputs(model, tokenizer, args.suite, tasks, args.lengths, args.rows, layer, args.seed)
        unseen = None if args.unseen_seed is None else router_inputs(
            model, tokenizer, args.suite, tasks, args.lengths, args.rows, layer, args.unseen_seed)
        for record in kind_table(features, names, kinds, held_out, unseen=unseen, positive=positive_kind):
            table.append({"layer": layer, **record})
            print(f"layer {layer:2d} {record['task']:20s} {record['kind']:9s} "
                  f"{'held out' if record['held_out'] else 'trained':8s} predicted as its kind: "
                  f"{record['predicted_as_its_kind']:.2f} ({record['rows']} rows)"
                  + (f", on unseen rows {record['predicted_as_its_kind_unseen_rows']:.2f}"
                     if "unseen_rows" in record else ""))
    if args.out is not None:
        document = {**run_header(next(model.parameters()).device), "model": args.model, "layers": args.layers,
                    "lengths": args.lengths, "seed": args.seed, "unseen_seed": args.unseen_seed,
                    "held_out": sorted(held_out), "positive": sorted(positive) or "sensitive", "results": table}
        atomic_write_text(args.out, json.dumps(document, indent=2))
    return table


if __name__ == "__main__":
    main()
