"""Choose the floor set on validation rows only, by a rule fixed before they are measured.

    python studies/signal_router/select_floor.py --scores results/broad_validation_scores.json \
        --eval floor_val/eval.json code_val/eval.json --candidates 0.3 0.4 0.5 --out floor.json

The candidates are points of the joint search path (modes ``heads@MSR`` of `elastic-attention eval`). A validation
cell (task, length) counts when full attention scores at least --floor-full there. The floor is the sparsest
candidate that keeps, on the counted cells, a mean retention (its accuracy over full attention's) of at least
--mean and no cell below --cell; none passing: the densest candidate, flagged. Writes every candidate's retentions
and the choice to --out, and prints the chosen MSR.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from select_router import read_scores


def cell_means(scores: dict) -> dict:
    """(task, length) -> mode -> mean score over the cell's rows that have it."""
    sums: dict = defaultdict(lambda: defaultdict(list))
    for (task, length, _), modes in scores.items():
        for mode, value in modes.items():
            sums[(task, length)][mode].append(value)
    return {cell: {mode: sum(values) / len(values) for mode, values in modes.items()} for cell, modes in sums.items()}


def choose_floor(cells: dict, candidates: list[float], floor_full: float, mean_bar: float, cell_bar: float) -> dict:
    """The rule of the module docstring on ``cells`` (`cell_means`' output)."""
    report = []
    for msr in sorted(candidates):
        mode = f"heads@{msr:g}"
        counted = {cell: modes[mode] / modes["full"] for cell, modes in cells.items()
                   if mode in modes and "full" in modes and modes["full"] >= floor_full}
        if not counted:
            raise SystemExit(f"no validation cell has both full (>= {floor_full}) and {mode} scores")
        mean = sum(counted.values()) / len(counted)
        worst = min(counted, key=counted.get)
        report.append({"msr": msr, "cells": len(counted), "mean_retention": mean, "worst_cell": "@".join(map(str, worst)),
                       "worst_retention": counted[worst], "passes": mean >= mean_bar and counted[worst] >= cell_bar,
                       "retention": {"@".join(map(str, cell)): value for cell, value in sorted(counted.items())}})
    passing = [item for item in report if item["passes"]]
    chosen = max(passing, key=lambda item: item["msr"]) if passing else min(report, key=lambda item: item["msr"])
    return {"chosen_msr": chosen["msr"], "none_passed": not passing, "candidates": report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scores", help='JSON {"task|length|index": {mode: score}} of validation rows')
    parser.add_argument("--eval", nargs="*", default=[], help="eval.json files of validation rows (row_accuracy)")
    parser.add_argument("--candidates", type=float, nargs="+", required=True, help="MSRs of the path's points")
    parser.add_argument("--floor-full", type=float, default=0.5)
    parser.add_argument("--mean", type=float, default=0.97)
    parser.add_argument("--cell", type=float, default=0.9)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = choose_floor(cell_means(read_scores(args.scores, args.eval)), args.candidates, args.floor_full,
                          args.mean, args.cell)
    rule = __doc__.split("\n\n")[1].replace("\n", " ")
    Path(args.out).write_text(json.dumps({"rule": rule, "mean": args.mean, "cell": args.cell,
                                          "floor_full": args.floor_full, **result}, indent=1))
    if result["none_passed"]:
        print(f"no candidate keeps the validation cells: the densest, MSR {result['chosen_msr']:g}", file=sys.stderr)
    print(result["chosen_msr"])


if __name__ == "__main__":
    main()
