"""How well could a head-set router sort unseen prompts if it were told each training prompt's right set? Fits the
project's `HeadSetRouter` (same network, per-head standardization) by cross-entropy to a fixed set per task on the
router inputs of a training run's packs (its ``set_losses.safetensors``), then scores the rows kept by
`studies/head_set_routing_1.5b/head_set_choices.py --inputs`: per task and length, the share of rows on each set. No objective a router
is trained with can sort those rows better than its inputs and training rows allow, so this is a ceiling on the
routing itself, not on the sparsity objective; a router trained with the objective that falls short of it on the
same rows loses to the objective, one that matches it loses to the inputs or the rows.

    python studies/head_set_routing_1.5b/task_label_router.py \\
        --set-losses studies/router_recipes_1.5b/results/real_model_1.5b_set_losses_per_task_2026-12-06.safetensors \\
        --inputs studies/head_set_routing_1.5b/results/real_model_1.5b_eval_router_inputs_cpu_2026-12-06.safetensors \\
        --sets multikey=0,passkey=1,find_definition=1,next_line=2,recent_fact=2,pattern=2 --out choices.json

--train-inputs adds the rows of other kept inputs files (`head_set_choices.py --inputs`, drawn with a seed apart from
the evaluation's) to the training rows: whether more rows would sort the evaluation rows better, before any GPU
computes their losses. --hold-out leaves a task's training rows out of the fit: where would its rows go if it had
not been trained? --out writes the choices as `studies/head_set_routing_1.5b/head_set_choices.py` does (``set_msrs`` and each row's
``logits`` per ``task@length``), so `studies/head_set_routing_1.5b/row_outcomes.py --predict` scores them with the cells each set was
measured in.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from head_set_choices import load_kept_inputs, spans_label  # noqa: E402


def training_rows(set_losses: Path) -> tuple[torch.Tensor, list[str], list[float], str | None]:
    """([M, Hkv, D] float32 router inputs of every sample of every saved pack, each sample's task, the sets' MSRs,
    the spans the inputs were pooled over as kept inputs files name them (``"40 + 30"``; None: not recorded))."""
    from safetensors import safe_open

    with safe_open(str(set_losses), "pt") as handle:
        metadata = handle.metadata() or {}
        tasks = json.loads(metadata["tasks"])
        inputs, names = [], []
        for index in sorted(tasks, key=int):
            inputs.append(handle.get_tensor(f"{index}.router_input"))
            names += tasks[index]
    pooling = metadata.get("router_pooling")
    pooled = None if pooling is None else spans_label(json.loads(pooling))
    return torch.cat(inputs).float(), names, json.loads(metadata["set_msrs"]), pooled


def set_of_each_task(text: str, choices: int) -> dict[str, int]:
    """``"multikey=0,passkey=1"`` -> {task: set index}, every index below ``choices``.

    Raises:
        ValueError: an entry that is not task=INDEX with INDEX below ``choices``.
    """
    target = {}
    for item in text.split(","):
        task, _, index = item.partition("=")
        if not task or not index.isdigit() or not int(index) < choices:
            raise ValueError(f"--sets entry {item!r}: give task=INDEX with INDEX below {choices} (the number of sets)")
        target[task] = int(index)
    return target


def drawn_alike(first: dict, second: dict) -> list[str]:
    """The cells of ``first`` whose task, length and seed a cell of ``second`` shares: the same prompts."""
    drawn = {tuple(key.split("@")[:3]) for key in second}
    return [key for key in first if tuple(key.split("@")[:3]) in drawn]


def fit(inputs: torch.Tensor, labels: torch.Tensor, choices: int, steps: int, seed: int, width: int = 4):
    """A standardizing `HeadSetRouter` fitted to ``labels`` ([M] set indices) on ``inputs`` [M, Hkv, D]: Adam at
    1e-3, batches of 12 rows drawn with ``seed``."""
    from elastic_attention.router import HeadSetRouter

    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    router = HeadSetRouter(inputs.shape[2], width, inputs.shape[1], choices, routed_layers=1, standardize=True)
    router.set_feature_statistics(inputs)
    optimizer = torch.optim.Adam(router.parameters(), lr=1e-3)
    for _ in range(steps):
        batch = torch.randint(0, len(inputs), (12,), generator=generator)
        loss = torch.nn.functional.cross_entropy(router.choice_logits(inputs[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return router.eval()


def main(argv: Sequence[str] | None = None) -> dict:
    from elastic_attention.bench.timing import run_header
    from elastic_attention.io import atomic_write_text

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set-losses", type=Path, required=True, help="a training run's set_losses.safetensors")
    parser.add_argument("--inputs", type=Path, required=True, help="studies/head_set_routing_1.5b/head_set_choices.py's --inputs file")
    parser.add_argument("--train-inputs", type=Path, action="append", default=[],
                        help="a kept inputs file whose rows join the training rows (repeatable)")
    parser.add_argument("--sets", required=True, help="comma list task=set index for every task of the training rows")
    parser.add_argument("--hold-out", default="",
                        help="comma list of tasks whose training rows are left out: where would they go unseen?")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="JSON file for the choices (head_set_choices.py's format)")
    args = parser.parse_args(argv)

    inputs, names, set_msrs, pooled = training_rows(args.set_losses)
    evaluation, written = load_kept_inputs(args.inputs)
    if pooled is None or "pooling" not in written:
        parser.error(f"{args.set_losses if pooled is None else args.inputs} does not record the spans its router "
                     "inputs were pooled over (written before they were recorded): compute them again")
    if written["pooling"] != pooled:
        parser.error(f"{args.inputs} holds router inputs pooled over {written['pooling']} tokens, the set losses over "
                     f"{pooled}: score rows pooled as the training rows were")
    more = [inputs]
    for path in args.train_inputs:
        cells, theirs = load_kept_inputs(path)
        if theirs != written:
            parser.error(f"{path} holds router inputs of {theirs}, {args.inputs} of {written}: another model, layer, "
                         "dtype or pooling")
        shared = drawn_alike(cells, evaluation)
        if shared:
            parser.error(f"{path} holds evaluation rows ({', '.join(shared)}): draw training rows with another seed")
        for key, rows in cells.items():
            if rows.shape[1:] != inputs.shape[1:]:
                parser.error(f"{path} holds router inputs of shape {list(rows.shape[1:])}, the set losses "
                             f"{list(inputs.shape[1:])}: another model or router layer")
            more.append(rows)
            names += [key.split("@")[0]] * len(rows)
    inputs = torch.cat(more)
    held_out = {task for task in args.hold_out.split(",") if task}
    unknown = sorted(held_out - set(names))
    if unknown:
        parser.error(f"--hold-out names {unknown}, which have no training rows (tasks there: {sorted(set(names))})")
    kept = torch.tensor([name not in held_out for name in names])
    inputs, names = inputs[kept], [name for name in names if name not in held_out]
    try:
        target = set_of_each_task(args.sets, len(set_msrs))
    except ValueError as error:
        parser.error(str(error))
    missing = sorted(set(names) - set(target))
    if missing:
        parser.error(f"--sets gives no set for the training rows' tasks {missing}: add task=INDEX for each")
    labels = torch.tensor([target[name] for name in names])
    router = fit(inputs, labels, len(set_msrs), args.steps, args.seed)
    with torch.no_grad():
        trained = (router.choice_logits(inputs).argmax(-1) == labels).float().mean()
    print(f"{len(names)} training rows, {float(trained):.1%} on their task's set after {args.steps} steps; "
          f"sets (MSR): {', '.join(f'{msr:.3f}' for msr in set_msrs)}")

    logits = {}
    for key, rows in evaluation.items():
        task, length = key.split("@")[:2]
        with torch.no_grad():
            row_logits = router.choice_logits(rows).double()
        logits[f"{task}@{length}"] = row_logits.tolist()
        shares = torch.bincount(row_logits.argmax(-1), minlength=len(set_msrs)).double() / len(row_logits)
        print(f"  {task:18} {length:>6}  {' '.join(f'{share:.2f}' for share in shares.tolist())}")
    document = {**run_header(torch.device("cpu")), "set_losses": str(args.set_losses), "inputs": str(args.inputs),
                "train_inputs": [str(path) for path in args.train_inputs],
                "sets": target, "held_out": sorted(held_out), "steps": args.steps, "seed": args.seed,
                "set_msrs": set_msrs,
                "training_rows_on_their_set": float(trained), "logits": logits}
    if args.out is not None:
        atomic_write_text(args.out, json.dumps(document, indent=1))
    return document


if __name__ == "__main__":
    main(sys.argv[1:])
