"""Issue 18's table and bars from a merged ``eval.json`` of the real model (modes full, elastic, static,
static@0.7 and sparse; every row carries its ``kind``).

    python scripts/real_model_bars.py benchmarks/results/real_model_eval.json [--lengths 8192,16384]

Prints a markdown table (accuracy per mode, elastic's and the static hybrids' MSR, elastic's share of full
attention's accuracy) and, at the given lengths (default: every length in the file), the bars: elastic keeps
>= 97% of full attention's accuracy on every sensitive task and >= 99% on every robust one; MSR(robust) -
MSR(sensitive) >= 0.2 (elastic's mean MSR over each kind's cells); elastic's average MSR >= 0.6; the static
hybrid at elastic's average MSR loses >= 5 points on at least one sensitive (task, length) where elastic does not.
A cell that is missing is shown as "-" and leaves the bars that need it unmeasured.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def table(results: list[dict]) -> str:
    """One markdown row per (task, length): accuracy of every mode, MSRs in brackets, elastic's share of full."""
    cells = {(r["mode"], r["task"], r["length"]): r for r in results}
    keys = list(dict.fromkeys((r["task"], r["length"]) for r in results))
    kinds = {r["task"]: r.get("kind", "?") for r in results}
    lines = ["| task | kind | length | full | elastic (MSR) | kept | static (MSR) | static@0.7 | all SSA |",
             "|---|---|---|---|---|---|---|---|---|"]
    for task, length in sorted(keys, key=lambda key: (kinds[key[0]] != "sensitive", keys.index(key))):
        def shown(mode: str, with_msr: bool = False) -> str:
            cell = cells.get((mode, task, length))
            if cell is None:
                return "-"
            return f"{cell['accuracy']:.3f}" + (f" ({cell['msr']:.2f})" if with_msr else "")

        full, elastic = cells.get(("full", task, length)), cells.get(("elastic", task, length))
        kept = f"{elastic['accuracy'] / full['accuracy']:.0%}" if full and elastic and full["accuracy"] else "-"
        lines.append(f"| {task} | {kinds[task]} | {length // 1024}K | {shown('full')} | {shown('elastic', True)} | "
                     f"{kept} | {shown('static', True)} | {shown('static@0.7')} | {shown('sparse')} |")
    return "\n".join(lines)


def bars(results: list[dict], lengths: list[int]) -> list[str]:
    """The four bars at ``lengths``, each as one line with the measured values and met / missed."""
    cells = {(r["mode"], r["task"], r["length"]): r for r in results}
    kinds = {r["task"]: r.get("kind") for r in results}
    pairs = [(task, length) for task in kinds for length in lengths
             if ("full", task, length) in cells and ("elastic", task, length) in cells]

    def accuracy(mode: str, task: str, length: int) -> float:
        return cells[(mode, task, length)]["accuracy"]

    lines = []
    for kind, share in (("sensitive", 0.97), ("robust", 0.99)):
        kept = {f"{task}@{length // 1024}K": accuracy("elastic", task, length) / accuracy("full", task, length)
                for task, length in pairs if kinds[task] == kind and accuracy("full", task, length) > 0}
        if not kept:
            lines.append(f"elastic keeps >= {share:.0%} of full on every {kind} task: no cells")
            continue
        worst = min(kept, key=kept.get)
        below = sorted(f"{cell} {value:.0%}" for cell, value in kept.items() if value < share)
        lines.append(f"elastic keeps >= {share:.0%} of full on every {kind} task: {'missed' if below else 'met'} "
                     f"(worst {worst} {kept[worst]:.0%}; below: {', '.join(below) or 'none'})")
    msr = {kind: [cells[("elastic", task, length)]["msr"] for task, length in pairs if kinds[task] == kind]
           for kind in ("sensitive", "robust")}
    if msr["sensitive"] and msr["robust"]:
        mean = {kind: sum(values) / len(values) for kind, values in msr.items()}
        gap = mean["robust"] - mean["sensitive"]
        lines.append(f"MSR(robust) - MSR(sensitive) >= 0.2: {'met' if gap >= 0.2 else 'missed'} "
                     f"({mean['robust']:.3f} - {mean['sensitive']:.3f} = {gap:.3f})")
        everything = msr["sensitive"] + msr["robust"]
        average = sum(everything) / len(everything)
        lines.append(f"average MSR >= 0.6: {'met' if average >= 0.6 else 'missed'} ({average:.3f})")
    losses, measured = [], False
    for task, length in pairs:
        static = cells.get(("static", task, length))
        if kinds[task] != "sensitive" or static is None:
            continue
        measured = True
        full = accuracy("full", task, length)
        elastic_loss, static_loss = full - accuracy("elastic", task, length), full - static["accuracy"]
        if static_loss >= 0.05 and elastic_loss < 0.05:
            losses.append(f"{task}@{length // 1024}K (static -{static_loss:.2f}, elastic -{max(elastic_loss, 0):.2f})")
    verdict = ("met: " + ", ".join(losses)) if losses else "missed" if measured else "not measured (no static cells)"
    lines.append(f"static at elastic's MSR loses >= 5 points on a sensitive task where elastic does not: {verdict}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("eval_json", type=Path)
    parser.add_argument("--lengths", help="comma list of lengths in tokens for the bars (default: every length)")
    args = parser.parse_args()
    results = json.loads(args.eval_json.read_text(encoding="utf-8"))["results"]
    lengths = ([int(x) for x in args.lengths.split(",")] if args.lengths
               else sorted({r["length"] for r in results}))
    print(table(results))
    print()
    for line in bars(results, lengths):
        print(f"- {line}")


if __name__ == "__main__":
    main()
