"""Where the held-out losses of a signal router come from: per elastic cell, the rows on each set, what full attention
and elastic score on them, and the signal's spread.

    python studies/signal_router/set_split.py results/heldout_eval_h100_2026-12-07.json > results/set_split.md

Reads an eval document (one eval.json, or heldout_report.py's merged one) whose elastic cells carry ``row_sets``,
``row_signals`` and ``row_accuracy`` (`elastic-attention eval` of a signal router), and its full cells'
``row_accuracy``. A report of measured rows; nothing here chooses anything.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def split_rows(results: list[dict]) -> list[dict]:
    """One dict per (elastic cell, set index) with rows on that set: task, length, set, rows, full and elastic mean
    accuracy on those rows; and per cell the signal's minimum and median."""
    full = {(row["task"], row["length"]): row["row_accuracy"] for row in results if row["mode"] == "full"}
    lines = []
    for cell in results:
        if cell["mode"] != "elastic" or (cell["task"], cell["length"]) not in full:
            continue
        sets, scores, reference = cell["row_sets"], cell["row_accuracy"], full[(cell["task"], cell["length"])]
        for chosen in sorted(set(sets)):
            rows = [index for index, value in enumerate(sets) if value == chosen]
            lines.append({"task": cell["task"], "length": cell["length"], "set": chosen, "rows": len(rows),
                          "full": sum(reference[i] for i in rows) / len(rows),
                          "elastic": sum(scores[i] for i in rows) / len(rows),
                          "signal_min": min(cell["row_signals"]),
                          "signal_median": statistics.median(cell["row_signals"])})
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("eval", help="an eval document with a signal router's elastic cells")
    args = parser.parse_args()
    lines = split_rows(json.loads(Path(args.eval).read_text())["results"])
    print("| task | length | set (0 = floor) | rows | full on them | elastic on them | cell's signal min / median |")
    print("|---|---|---|---|---|---|---|")
    for line in lines:
        print(f"| {line['task']} | {line['length']} | {line['set']} | {line['rows']} | {line['full']:.2f} | "
              f"{line['elastic']:.2f} | {line['signal_min']:.3f} / {line['signal_median']:.3f} |")


if __name__ == "__main__":
    main()
