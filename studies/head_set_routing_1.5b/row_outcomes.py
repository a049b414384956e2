"""How much could a choice among the measured modes keep (at an MSR floor), what would a head-set router score
without running it, and which rows does elastic lose?

Reads a merged ``eval.json`` (`elastic-attention eval` / `eval-merge`), rebuilds the rows of every cell (same suite,
seed and tokenizer as the evaluation) and scores each stored prediction again; a cell whose scores do not average to
its stored accuracy is refused (wrong tokenizer, seed or file). Then, at each length:

- **ceiling**: the mean retention over the tasks (equal weight; retention = accuracy / full attention's, as the
  Pareto plot counts it) if every row took the best score of any mode measured on it (full, all-SSA, elastic, static,
  heads, ...). No router choosing per row among those modes keeps more, at any MSR.
- **full or all-SSA per row**: the same with the choice limited to full attention and all-SSA, all-SSA wherever it
  scores as well: its retention and its average MSR (the share of rows on all-SSA, averaged over the tasks).
- **choice under an MSR floor** (``--oracle-modes``, ``--msr-floors``): the most any choice among the given modes
  (each of one MSR: full attention, all-SSA, the sets of a head-set router) keeps at each average-MSR floor, per row
  and per task (one mode for all of a task's rows): an upper bound from the choice's linear relaxation, and a choice
  that exists near it (`oracle_frontier`). What a head-set router over those sets could reach at best, on these rows.
- **a router's score without running it** (``--predict CHOICES --set-modes ...``): each row scored as the mode
  measured with the set the router chose there (`predicted_rows`), the cells' accuracy and MSR and the mean
  retention; with ``--measured`` beside the router's own elastic cells on the same rows. Together with
  ``set_losses_file`` (training without the backbone) a router recipe can be tried on a CPU.
- **elastic's losses**: per task, the rows on which full attention scores higher than elastic; with ``--choices``
  (the JSON of `studies/head_set_routing_1.5b/head_set_choices.py` for the same rows, seed and lengths) the MSR of the set elastic ran on
  each of them. ``--losses-of MODES`` lists the same rows for other modes (e.g. the searched path's sets).

    python studies/head_set_routing_1.5b/row_outcomes.py benchmarks/results/real_model_1.5b_eval.json \
        --model artifacts/qwen2.5-coder-1.5b-instruct --lengths 8192,16384 \
        --choices studies/head_set_routing_1.5b/results/real_model_1.5b_head_set_choices_expected_h100_2026-12-05.json
    python studies/head_set_routing_1.5b/row_outcomes.py benchmarks/results/real_model_1.5b_frontier.json \
        --model artifacts/qwen2.5-coder-1.5b-instruct --oracle-modes heads@0.4,heads@0.5,heads@0.6,heads@0.8,sparse \
        --msr-floors 0.6,0.7,0.8 --predict CHOICES --set-modes heads@0.4,heads@0.5,heads@0.6,heads@0.8,sparse \
        --measured benchmarks/results/real_model_1.5b_eval.json

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


def oracle_frontier(scores: dict, length: int, mode_msrs: dict[str, float], floors: Sequence[float],
                    per_task: bool = False) -> list[dict]:
    """The best any per-row choice among the modes of ``mode_msrs`` (mode -> its MSR, the same on every row) can keep
    at each average-MSR floor: maximize the mean retention over the tasks (each task's retention the sum of its rows'
    scores over full attention's, as `best_of_rows`) subject to an average MSR (over the tasks, of each task's mean
    over its rows) of at least the floor. With ``per_task`` the choice is one mode per task (all of a task's rows
    alike: a router that tells the tasks apart and nothing finer, with no row-level pick of whichever mode happened
    to score best).

    This is a multiple-choice knapsack; its linear relaxation bounds it from above, and by duality the bound is
    ``min over lambda >= 0 of sum over rows of max over modes (value + lambda * msr share) - lambda * floor``, a
    convex piecewise-linear function whose minimum lies at 0 or where some row's best mode changes. At the minimizing
    lambda, the rows' best modes with ties to the lower MSR stay under the floor (or meet it) and with ties to the
    higher MSR reach it; moving tied rows from the one to the other until the floor is reached gives a per-row choice
    that exists, within a row's worth of the bound.

    Returns:
        One dict per floor: ``msr_floor``, ``bound`` (no per-row choice among the modes keeps more at that floor),
        ``reached`` (the retention of that choice) and ``reached_msr`` (its average MSR). Tasks whose full
        attention scores 0 on every row are left out (no retention).

    Raises:
        ValueError: a mode without a cell for one of the tasks, or a floor above every mode's MSR.
    """
    import torch

    modes = list(mode_msrs)
    tasks = [task for (mode, task, at) in scores if mode == "full" and at == length
             and sum(scores[("full", task, length)]) > 0]
    missing = [f"{mode} {task}" for task in tasks for mode in modes if (mode, task, length) not in scores]
    if missing:
        raise ValueError(f"no cell at {length} tokens for {', '.join(missing)}: leave those modes out (or evaluate "
                         "them), so that every task counts")
    values, shares = [], []  # per row: [modes] retention it adds, MSR share it adds
    for task in tasks:
        full = sum(scores[("full", task, length)])
        rows = len(scores[("full", task, length)])
        per_mode = [scores[(mode, task, length)] for mode in modes]
        if per_task:
            per_mode, rows = [[sum(row_scores)] for row_scores in per_mode], 1
        for row in range(rows):
            values.append([per_mode[m][row] / (full * len(tasks)) for m in range(len(modes))])
            shares.append([mode_msrs[mode] / (rows * len(tasks)) for mode in modes])
    value = torch.tensor(values, dtype=torch.float64)
    share = torch.tensor(shares, dtype=torch.float64)
    # every lambda where a row's best mode can change: value[a] + l share[a] = value[b] + l share[b]
    gaps_v = value[:, :, None] - value[:, None, :]
    gaps_s = share[:, None, :] - share[:, :, None]
    crossing = gaps_v / gaps_s
    candidates = torch.cat([torch.zeros(1, dtype=torch.float64),
                            crossing[(gaps_s != 0) & (crossing > 0)].unique()])
    if any(floor > max(mode_msrs.values()) for floor in floors):
        raise ValueError(f"an MSR floor of {max(floors)} is above every mode's MSR: no choice reaches it")
    envelope = torch.cat([(value[None] + chunk[:, None, None] * share[None]).amax(-1).sum(-1)
                          for chunk in candidates.split(1024)])  # [candidates]: sum over rows of the best mode
    results = []
    for floor in floors:
        totals = envelope - candidates * floor
        best = int(totals.argmin())
        scored = value + float(candidates[best]) * share
        tie = 1e-12 * share / share.amax().clamp(min=1e-300)  # above float64 rounding, below any real difference
        low, high = (scored - tie).argmax(-1), (scored + tie).argmax(-1)  # ties to the lower / higher MSR
        chosen = low.clone()
        rows = torch.arange(len(value))
        reached_msr = float(share[rows, chosen].sum())
        gains = share[rows, high] - share[rows, low]  # rows tied at lambda: each trades value for MSR at its rate
        for row in gains.argsort(descending=True).tolist():
            if reached_msr >= floor - 1e-12 or gains[row] <= 0:
                break
            chosen[row] = high[row]
            reached_msr += float(gains[row])
        results.append({"msr_floor": floor, "bound": float(totals[best]), "reached": float(value[rows, chosen].sum()),
                        "reached_msr": reached_msr})
    return results


def predicted_rows(scores: dict, choices: dict, set_modes: Sequence[str], length: int,
                   mode: str = "predicted") -> list[dict]:
    """What a head-set router would score without running it: one eval row per task at ``length`` (mode ``mode``)
    whose rows each take the score that the mode measured with the router's chosen set got on that row. ``choices``:
    `studies/head_set_routing_1.5b/head_set_choices.py`'s JSON (the router's logits per row, its sets' MSRs); ``set_modes[c]``: the mode
    measured with set c (e.g. ``heads@0.4`` for the set at MSR 0.393 of the same path). Only the rows every set's
    cell has (the first ones: rows are drawn alike for any count) are counted; MSR is the chosen sets' mean."""
    if len(set_modes) != len(choices["set_msrs"]):
        raise ValueError(f"--set-modes names {len(set_modes)} modes, the router has {len(choices['set_msrs'])} sets")
    rows = []
    for task in dict.fromkeys(task for (_, task, at) in scores if at == length):
        logits = choices["logits"].get(f"{task}@{length}")
        per_set = [scores.get((set_mode, task, length)) for set_mode in set_modes]
        if logits is None or any(values is None for values in per_set):
            continue
        count = min(len(logits), *(len(values) for values in per_set))
        chosen = chosen_sets(logits[:count])
        rows.append({"mode": mode, "task": task, "length": length, "samples": count,
                     "accuracy": sum(per_set[c][r] for r, c in enumerate(chosen)) / count,
                     "msr": sum(choices["set_msrs"][c] for c in chosen) / count})
    return rows


def compare_prediction(scores: dict, choices: dict, set_modes: Sequence[str], length: int, full: list[dict],
                       measured: dict | None) -> dict:
    """Print and return `predicted_rows` at ``length`` per task and as mean retention (over full attention's cells
    ``full``), beside the router's measured elastic cells on the same rows when ``measured`` (`row_scores` of them)
    has them."""
    from elastic_attention.evaluation.frontier import point

    predicted = predicted_rows(scores, choices, set_modes, length)
    unpredicted = [cell["task"] for cell in full if cell["length"] == length
                   and cell["task"] not in {row["task"] for row in predicted}]
    same_rows = []
    for row in predicted:
        values = (measured or {}).get(("elastic", row["task"], length))
        if values is not None and len(values) >= row["samples"]:
            same_rows.append({**row, "mode": "measured", "accuracy": sum(values[: row["samples"]]) / row["samples"]})
    kept = point([*predicted, *full], "predicted", length)
    kept_measured = point([*same_rows, *full], "measured", length) if len(same_rows) == len(predicted) else None
    by_task = {row["task"]: row for row in same_rows}
    print(f"  predicted from the chosen sets' cells ({', '.join(set_modes)}):")
    for row in predicted:
        other = by_task.get(row["task"])
        print(f"    {row['task']}: {row['accuracy']:.3f} at MSR {row['msr']:.3f} over {row['samples']} rows"
              + (f"; measured elastic on those rows {other['accuracy']:.3f}" if other else ""))
    if unpredicted:
        print(f"    not predicted (no choices for it, or a set's cell missing): {', '.join(unpredicted)}; no mean "
              "retention over the tasks")
    if kept is not None:
        print(f"    mean retention {kept.retention:.1%} at MSR {kept.msr:.3f}"
              + (f"; measured {kept_measured.retention:.1%}" if kept_measured else ""))
    return {"cells": predicted, "measured_cells": same_rows, "not_predicted": unpredicted,
            "retention": kept.retention if kept else None, "msr": kept.msr if kept else None,
            "measured_retention": kept_measured.retention if kept_measured else None}


def mode_msrs_of(results: Sequence[dict], modes: Sequence[str], length: int) -> dict[str, float]:
    """mode -> its MSR at ``length``, for modes whose cells all have one MSR (full attention, all-SSA, a head set).

    Raises:
        ValueError: a mode with no cell at ``length``, or whose cells' MSRs differ by more than 1e-6.
    """
    found = {}
    for mode in modes:
        msrs = [cell["msr"] for cell in results if cell["mode"] == mode and cell["length"] == length]
        if not msrs:
            raise ValueError(f"no {mode} cell at {length} tokens")
        if max(msrs) - min(msrs) > 1e-6:
            raise ValueError(f"the {mode} cells at {length} tokens have MSRs from {min(msrs):.4f} to {max(msrs):.4f}: "
                             "the per-row choice takes modes of one MSR each")
        found[mode] = sum(msrs) / len(msrs)
    return found


def losses_against_full(scores: dict, task: str, length: int, mode: str = "elastic") -> list[int]:
    """The rows (indices) of ``task`` at ``length`` on which full attention scores higher than ``mode``."""
    full, other = scores[("full", task, length)], scores[(mode, task, length)]
    return [index for index, (f, e) in enumerate(zip(full, other)) if f > e]


def mode_losses(scores: dict, modes: Sequence[str], length: int) -> dict[str, dict[str, list[int]]]:
    """mode -> task -> the rows full attention scores higher on (`losses_against_full`), for every task measured with
    both at ``length``."""
    tasks = dict.fromkeys(task for _, task, at in scores if at == length and ("full", task, length) in scores)
    return {mode: {task: losses_against_full(scores, task, length, mode)
                   for task in tasks if (mode, task, length) in scores}
            for mode in modes}


def chosen_msrs(choices: dict, task: str, length: int, rows: int | None = None) -> list[float] | None:
    """The MSR of the set the router chose (argmax) for each row, from `studies/head_set_routing_1.5b/head_set_choices.py`'s JSON; None
    when it has no logits for the cell.

    Raises:
        ValueError: ``rows`` given and the choices hold another number of rows for the cell.
    """
    logits = choices["logits"].get(f"{task}@{length}")
    if logits is None:
        return None
    if rows is not None and len(logits) != rows:
        raise ValueError(f"the evaluation has {rows} rows of {task} at {length} tokens, the choices {len(logits)}: "
                         "run studies/head_set_routing_1.5b/head_set_choices.py with the evaluation's --rows and --seed")
    return [choices["set_msrs"][c] for c in chosen_sets(logits)]


def chosen_sets(logits: Sequence[Sequence[float]]) -> list[int]:
    """The set each row's logits choose (argmax; the first of equal ones)."""
    return [max(range(len(row)), key=row.__getitem__) for row in logits]


def main(argv: Sequence[str] | None = None) -> dict:
    from transformers import AutoTokenizer

    from elastic_attention.evaluation.frontier import point

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("eval_json", type=Path)
    parser.add_argument("--model", required=True, help="the evaluated model's folder (only its tokenizer is read)")
    parser.add_argument("--lengths", help="comma list of lengths in tokens (default: every length in the file)")
    parser.add_argument("--seed", type=int, help="the evaluation's seed (default: the file's `seed`)")
    parser.add_argument("--choices", type=Path, help="studies/head_set_routing_1.5b/head_set_choices.py's JSON for the same rows")
    parser.add_argument("--oracle-modes", help="comma list of modes of one MSR each (e.g. full,heads@0.4,...,sparse): "
                                               "the best per-row choice among them at each --msr-floors")
    parser.add_argument("--msr-floors", default="0.5,0.6,0.7", help="average-MSR floors of --oracle-modes")
    parser.add_argument("--predict", type=Path, help="studies/head_set_routing_1.5b/head_set_choices.py's JSON: score each row with the mode "
                                                     "of the set the router chose there (--set-modes)")
    parser.add_argument("--set-modes", help="comma list: the mode measured with each of the router's sets, in order")
    parser.add_argument("--measured", type=Path, help="with --predict: an eval.json holding the router's own elastic "
                                                      "cells (same seed), to compare on the same rows")
    parser.add_argument("--losses-of", help="comma list of other modes (e.g. heads@0.1,heads@0.2): the rows of each "
                                            "task on which full attention scores higher, as for elastic")
    parser.add_argument("--out", type=Path, help="JSON file for what is printed (with date and command)")
    args = parser.parse_args(argv)
    if bool(args.predict) != bool(args.set_modes) or (args.measured and not args.predict):
        parser.error("--predict and --set-modes go together (and --measured with them)")
    document = json.loads(args.eval_json.read_text(encoding="utf-8"))
    seed = args.seed if args.seed is not None else document.get("seed")
    if seed is None:
        parser.error(f"{args.eval_json} records no seed: pass the evaluation's --seed")
    results = document["results"]
    lengths = ([int(x) for x in args.lengths.split(",")] if args.lengths
               else sorted({r["length"] for r in results}))
    results = [r for r in results if r["length"] in lengths]
    choices = json.loads(args.choices.read_text(encoding="utf-8")) if args.choices else None
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    scores = row_scores(results, tokenizer, seed)
    router_scores = None
    if args.measured:
        cells = [cell for cell in json.loads(args.measured.read_text(encoding="utf-8"))["results"]
                 if cell["mode"] == "elastic" and cell["length"] in lengths]
        router_scores = row_scores(cells, tokenizer, seed)
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
            lost = losses_against_full(scores, task, length)
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
        if args.losses_of:
            found = mode_losses(scores, args.losses_of.split(","), length)
            for task in dict.fromkeys(task for rows in found.values() for task in rows):
                print(f"  below full on {task}: "
                      + "; ".join(f"{mode} {rows[task]}" for mode, rows in found.items() if task in rows))
            summary["lengths"][length]["losses"] = found
        if args.oracle_modes:
            mode_msrs = mode_msrs_of(results, args.oracle_modes.split(","), length)
            floors = [float(x) for x in args.msr_floors.split(",")]
            alone = [point([*results, *full], mode, length) for mode in mode_msrs]
            print(f"  choice among {', '.join(mode_msrs)} (each alone: "
                  + ", ".join(f"{p.mode} {p.retention:.1%}" for p in alone if p is not None) + "):")
            found = {}
            for per, per_task in (("row", False), ("task", True)):
                found[per] = oracle_frontier(scores, length, mode_msrs, floors, per_task=per_task)
                for at in found[per]:
                    print(f"    per {per}, average MSR >= {at['msr_floor']:.2f}: at most {at['bound']:.1%} (a choice "
                          f"reaching {at['reached']:.1%} at MSR {at['reached_msr']:.3f})")
            summary["lengths"][length]["oracle"] = {"modes": mode_msrs, "per_row": found["row"],
                                                    "per_task": found["task"]}
        if args.predict:
            summary["lengths"][length]["predicted"] = compare_prediction(
                scores, json.loads(args.predict.read_text(encoding="utf-8")), args.set_modes.split(","), length,
                full, router_scores)
    if args.out is not None:
        import torch

        from elastic_attention.bench.timing import run_header
        from elastic_attention.io import atomic_write_text

        summary = {**run_header(torch.device("cpu")), **summary}
        atomic_write_text(args.out, json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
