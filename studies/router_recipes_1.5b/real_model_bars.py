"""The real model's table and bars from a merged ``eval.json`` (modes full and elastic, and any of static, heads,
static@0.7 and sparse; every row carries its ``kind``): issue 18's on the 0.5B, issue 40's on the 1.5B.

    python studies/router_recipes_1.5b/real_model_bars.py benchmarks/results/real_model_1.5b_eval.json [--lengths 8192,16384]

Prints a markdown table (accuracy per mode present, elastic's and each hybrid's MSR, elastic's share of full
attention's accuracy) and, at the given lengths (default: every length in the file), the bars: elastic keeps
>= 97% of full attention's accuracy on every sensitive task and >= 99% on every robust one; MSR(robust) -
MSR(sensitive) >= 0.2 (elastic's mean MSR over each kind's cells); elastic's average MSR >= 0.6; with static cells,
the static hybrid at elastic's average MSR loses >= 5 points on at least one sensitive (task, length) where elastic
does not; with heads cells (the joint searched head set at elastic's average MSR), elastic's mean retention over
the tasks (each task weighs the same; retention = accuracy / full attention's) is >= 2 points above the set's at
each length. A cell that is missing is shown as "-" and leaves the bars that need it unmeasured.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


#: Columns after full and elastic, in this order, when the results have the mode (those with an MSR show it).
OTHER_MODES = (("static", True), ("heads", True), ("static@0.7", False), ("sparse", False))
TITLES = {"static": "static (MSR)", "heads": "heads (MSR)", "static@0.7": "static@0.7", "sparse": "all SSA"}


def table(results: list[dict]) -> str:
    """One markdown row per (task, length): accuracy of every mode, MSRs in brackets, elastic's share of full."""
    cells = {(r["mode"], r["task"], r["length"]): r for r in results}
    keys = list(dict.fromkeys((r["task"], r["length"]) for r in results))
    kinds = {r["task"]: r.get("kind", "?") for r in results}
    present = {r["mode"] for r in results}
    others = [(mode, with_msr) for mode, with_msr in OTHER_MODES if mode in present]
    lines = ["| task | kind | length | full | elastic (MSR) | kept | " + " | ".join(TITLES[m] for m, _ in others) + " |",
             "|---|---|---|---|---|---|" + "---|" * len(others)]
    for task, length in sorted(keys, key=lambda key: (kinds[key[0]] != "sensitive", keys.index(key))):
        def shown(mode: str, with_msr: bool = False) -> str:
            cell = cells.get((mode, task, length))
            if cell is None:
                return "-"
            return f"{cell['accuracy']:.3f}" + (f" ({cell['msr']:.2f})" if with_msr else "")

        full, elastic = cells.get(("full", task, length)), cells.get(("elastic", task, length))
        kept = f"{elastic['accuracy'] / full['accuracy']:.0%}" if full and elastic and full["accuracy"] else "-"
        lines.append(f"| {task} | {kinds[task]} | {length // 1024}K | {shown('full')} | {shown('elastic', True)} | "
                     f"{kept} | " + " | ".join(shown(mode, with_msr) for mode, with_msr in others) + " |")
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
    lines += heads_bar(results, lengths)
    return lines


def heads_bar(results: list[dict], lengths: list[int]) -> list[str]:
    """At each length with heads cells: elastic's mean retention over the tasks against the joint searched set's at
    elastic's average MSR (the ``heads`` mode); met when elastic's is >= 2 points above."""
    from elastic_attention.evaluation.frontier import point

    lines = []
    for length in lengths:
        elastic, heads = point(results, "elastic", length), point(results, "heads", length)
        if elastic is None or heads is None:
            if any(r["mode"] == "heads" and r["length"] == length for r in results):
                lines.append(f"elastic's mean retention >= the searched set's + 2 points at {length // 1024}K: "
                             "not measured (a task lacks a full, elastic or heads cell)")
            continue
        margin = elastic.retention - heads.retention
        lines.append(f"elastic's mean retention >= the searched set's + 2 points at {length // 1024}K: "
                     f"{'met' if margin >= 0.02 else 'missed'} (elastic {elastic.retention:.1%} at MSR "
                     f"{elastic.msr:.3f}, heads {heads.retention:.1%} at MSR {heads.msr:.3f}: {100 * margin:+.1f} "
                     "points)")
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
