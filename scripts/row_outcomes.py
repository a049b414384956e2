"""How much could any per-row choice among the measured modes keep, and which rows does elastic lose?

Reads a merged ``eval.json`` (`elastic-attention eval` / `eval-merge`), rebuilds the rows of every cell (same suite,
seed and tokenizer as the evaluation) and scores each stored prediction again; a cell whose scores do not average to
its stored accuracy is refused (wrong tokenizer, seed or file). Then, at each length:

- **ceiling**: the mean retention over the tasks (equal weight; retention = accuracy / full attention's, as the
  Pareto plot counts it) if every row took the best score of any mode measured on it (full, all-SSA, elastic, static,
  heads, ...). No router choosing per row among those modes keeps more, at any MSR.
- **full or all-SSA per row**: the same with the choice limited to full attention and all-SSA, all-SSA wherever it
  scores as well: its retention and its average MSR (the share of rows on all-SSA, averaged over the tasks).
- **elastic's losses**: per task, the rows on which full attention scores higher than elastic; with ``--choices``
  (the JSON of `scripts/head_set_choices.py` for the same rows, seed and lengths) the MSR of the set elastic ran on
  each of them.

    python scripts/row_outcomes.py benchmarks/results/real_model_1.5b_eval.json \
        --model artifacts/qwen2.5-coder-1.5b-instruct --lengths 8192,16384 \
        --choices benchmarks/results/real_model_1.5b_head_set_choices_expected_h100_2026-12-05.json

Needs only the tokenizer of ``--model`` (no weights are loaded); about 8 s a cell at 16K on a CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

#: Mode names of the rows this script makes for `elastic_attention.evaluation.frontier.point`.
CEILING, FULL_OR_SPARSE = "best of measured", "full or all-SSA"


def row_scores(results: Sequence[dict], tokenizer, seed: int) -> dict[tuple[str, str, int], list[float]]:
    """``{(mode, task, length): [score of each row]}`` for every cell of ``results``, its rows generated once per
    (task, length).

    Raises:
        ValueError: a cell whose prediction count differs from its ``samples``, or whose scores' mean is not its
            stored ``accuracy``.
    """
    from elastic_attention.evaluation.suites import suite_of

    by_rows = defaultdict(list)
    for cell in results:
        by_rows[(cell["task"], cell["length"], cell["samples"])].append(cell)
    scores = {}
    for (task, length, samples), cells in by_rows.items():
        suite = suite_of(task)
        rows = suite.generate(task, length, seed, samples, tokenizer)
        for cell in cells:
            where = f"{cell['mode']} {task} at {length} tokens"
            if len(cell["predictions"]) != samples:
                raise ValueError(f"{where}: {len(cell['predictions'])} predictions for {samples} samples")
            values = [suite.score(prediction, row).accuracy for prediction, row in zip(cell["predictions"], rows)]
            if abs(sum(values) / samples - cell["accuracy"]) > 1e-9:
                raise ValueError(f"{where}: the rows rebuilt here score {sum(values) / samples:.4f}, the file says "
                                 f"{cell['accuracy']:.4f}: pass the evaluation's --seed and its model's tokenizer")
            scores[(cell["mode"], task, length)] = values
    return scores


def best_of_rows(scores: dict, length: int, modes: Sequence[str] | None = None) -> list[dict]:
    """One eval row per task at ``length`` whose accuracy is the mean over rows of the best score among ``modes``
    (default: every mode measured on that task and length), mode `CEILING`; MSR is not defined (nan)."""
    by_task = defaultdict(dict)
    for (mode, task, at), values in scores.items():
        if at == length and (modes is None or mode in modes):
            by_task[task][mode] = values
    rows = []
    for task, per_mode in by_task.items():
        best = [max(values) for values in zip(*per_mode.values())]
        rows.append({"mode": CEILING, "task": task, "length": length, "accuracy": sum(best) / len(best),
                     "msr": float("nan")})
    return rows


def full_or_sparse_rows(scores: dict, length: int) -> list[dict]:
    """One eval row per task at ``length`` that has both cells, mode `FULL_OR_SPARSE`: each row on all-SSA when it
    scores at least full attention's there, else on full attention; MSR = the share of rows on all-SSA."""
    rows = []
    for (mode, task, at), full in scores.items():
        sparse = scores.get(("sparse", task, at))
        if mode != "full" or at != length or sparse is None:
            continue
        on_sparse = [s >= f for f, s in zip(full, sparse)]
        rows.append({"mode": FULL_OR_SPARSE, "task": task, "length": length,
                     "accuracy": sum(s if o else f for f, s, o in zip(full, sparse, on_sparse)) / len(full),
                     "msr": sum(on_sparse) / len(on_sparse)})
    return rows


def elastic_losses(scores: dict, task: str, length: int) -> list[int]:
    """The rows (indices) of ``task`` at ``length`` on which full attention scores higher than elastic."""
    full, elastic = scores[("full", task, length)], scores[("elastic", task, length)]
    return [index for index, (f, e) in enumerate(zip(full, elastic)) if f > e]


def chosen_msrs(choices: dict, task: str, length: int, rows: int | None = None) -> list[float] | None:
    """The MSR of the set the router chose (argmax) for each row, from `scripts/head_set_choices.py`'s JSON; None
    when it has no logits for the cell.

    Raises:
        ValueError: ``rows`` given and the choices hold another number of rows for the cell.
    """
    logits = choices["logits"].get(f"{task}@{length}")
    if logits is None:
        return None
    if rows is not None and len(logits) != rows:
        raise ValueError(f"the evaluation has {rows} rows of {task} at {length} tokens, the choices {len(logits)}: "
                         "run scripts/head_set_choices.py with the evaluation's --rows and --seed")
    return [choices["set_msrs"][max(range(len(row)), key=row.__getitem__)] for row in logits]


def main(argv: Sequence[str] | None = None) -> dict:
    from transformers import AutoTokenizer

    from elastic_attention.evaluation.frontier import point

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("eval_json", type=Path)
    parser.add_argument("--model", required=True, help="the evaluated model's folder (only its tokenizer is read)")
    parser.add_argument("--lengths", help="comma list of lengths in tokens (default: every length in the file)")
    parser.add_argument("--seed", type=int, help="the evaluation's seed (default: the file's `seed`)")
    parser.add_argument("--choices", type=Path, help="scripts/head_set_choices.py's JSON for the same rows")
    parser.add_argument("--out", type=Path, help="JSON file for what is printed (with date and command)")
    args = parser.parse_args(argv)
    document = json.loads(args.eval_json.read_text(encoding="utf-8"))
    seed = args.seed if args.seed is not None else document.get("seed")
    if seed is None:
        parser.error(f"{args.eval_json} records no seed: pass the evaluation's --seed")
    results = document["results"]
    lengths = ([int(x) for x in args.lengths.split(",")] if args.lengths
               else sorted({r["length"] for r in results}))
    results = [r for r in results if r["length"] in lengths]
    choices = json.loads(args.choices.read_text(encoding="utf-8")) if args.choices else None
    scores = row_scores(results, AutoTokenizer.from_pretrained(args.model), seed)
    full = [r for r in results if r["mode"] == "full"]
    summary = {"eval_json": str(args.eval_json), "seed": seed, "lengths": {}}
    for length in lengths:
        ceiling = point([*best_of_rows(scores, length), *full], CEILING, length)
        either = point([*full_or_sparse_rows(scores, length), *full], FULL_OR_SPARSE, length)
        measured = sorted({mode for mode, _, at in scores if at == length})
        print(f"{length} tokens: modes measured: {', '.join(measured)}")
        if ceiling is not None:
            print(f"  ceiling (best measured mode per row): mean retention {ceiling.retention:.1%}")
        if either is not None:
            print(f"  full or all-SSA per row: mean retention {either.retention:.1%} at average MSR {either.msr:.3f}")
        losses = {}
        for task in dict.fromkeys(r["task"] for r in results if r["length"] == length):
            if ("elastic", task, length) not in scores or ("full", task, length) not in scores:
                continue
            lost = elastic_losses(scores, task, length)
            msrs = chosen_msrs(choices, task, length, len(scores[("full", task, length)])) if choices else None
            on_sets = [f"{msrs[i]:.3f}" for i in lost] if msrs else []
            losses[task] = {"rows": lost, "chosen_set_msr": on_sets}
            if lost:
                print(f"  elastic below full on {task}: {len(lost)} rows"
                      + (f" (chosen sets' MSR: {', '.join(on_sets)})" if on_sets else ""))
        summary["lengths"][length] = {
            "ceiling_retention": ceiling.retention if ceiling else None,
            "full_or_sparse": {"retention": either.retention, "msr": either.msr} if either else None,
            "elastic_losses": losses}
    if args.out is not None:
        import torch

        from elastic_attention.bench.timing import run_header
        from elastic_attention.io import atomic_write_text

        summary = {**run_header(torch.device("cpu")), **summary}
        atomic_write_text(args.out, json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
