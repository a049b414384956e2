"""How much sparsity can one fixed head set buy before a task falls, and where do the router runs sit against it?
Reads the eval.json files of a static frontier (`benchmarks/device.sh frontier`: full, all-SSA, the joint searched
set's points ``heads@MSR`` and the retrieval-score static hybrid's ``static@MSR``) and of router runs (their
``elastic`` cells), and writes:

- a markdown table per length: each frontier point's MSR, its retention on every task (accuracy / full attention's)
  and the mean over the tasks (each task weighs the same);
- the sensitive target: the highest MSR at which the joint searched set keeps >= ``--share`` of full attention on
  every sensitive task (or each of ``--target-tasks``) at ``--target-length``, with the points below it that miss;
- with ``--by-kind heads@0.5,sparse``, what routing by task kind alone would give (each sensitive task on the first
  mode, each robust one on the second: the best a router choosing between the two could do), against the searched
  set at the same MSR;
- with ``--by-task heads@0.1,...,sparse``, the sparsest choice per task among those modes that keeps every task at
  issue 40's retention bars (sensitive >= 97% of full attention, robust >= 99%; full attention where no mode does):
  the most average MSR a router choosing per task among them could buy at the bars, against the searched set there;
- with ``--plot``, the Pareto plot (mean retention against average MSR; the curves, the by-kind point and each
  router run's point, against the run's own full-attention cells where its file has them).

    python scripts/frontier_report.py benchmarks/results/real_model_1.5b_frontier.json \
        --router fifth=runs/eval.json --plot pareto.png --out frontier.md
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path


def frontier_tables(rows: list[dict], lengths: Sequence[int]) -> str:
    """One markdown table per length: full, all-SSA and every frontier point, retention per task and mean. A point
    measured on some tasks only shows those, and no mean."""
    from elastic_attention.evaluation.frontier import CURVES, point

    tasks = list(dict.fromkeys(row["task"] for row in rows))
    kinds = {row["task"]: row.get("kind", "?") for row in rows}
    blocks = []
    for length in lengths:
        header = ("| mode | MSR | mean retention | " + " | ".join(f"{task} ({kinds[task][0]})" for task in tasks)
                  + " |")
        lines = [f"### {length // 1024}K" if length % 1024 == 0 else f"### {length} tokens", "", header,
                 "|" + "---|" * (3 + len(tasks))]
        measured = {}  # mode -> the tasks with its cell and full attention's at this length
        full = {row["task"] for row in rows if row["mode"] == "full" and row["length"] == length}
        for row in rows:
            if row["length"] == length and row["task"] in full and (
                    row["mode"] in ("full", "sparse") or row["mode"].startswith(tuple(CURVES))):
                measured.setdefault(row["mode"], set()).add(row["task"])
        points = [point(rows, mode, length, sorted(on)) for mode, on in measured.items()]
        points.sort(key=lambda p: (p.mode not in ("full", "sparse"), p.mode.split("@")[0], p.msr))
        for found in points:
            shown = [f"{found.tasks[task]:.0%}" if not math.isnan(found.tasks.get(task, math.nan)) else "-"
                     for task in tasks]
            mean = f"{found.retention:.1%}" if len(found.tasks) == len(full) else "-"
            lines.append(f"| {found.mode} | {found.msr:.3f} | {mean} | " + " | ".join(shown) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def sensitive_target(rows: list[dict], length: int, share: float, tasks: Sequence[str] | None = None) -> str:
    """One line: the highest MSR at which the joint searched set keeps ``share`` of full attention on every task of
    ``tasks`` (default: every sensitive task) at ``length``, the weakest task one point further, and the points below
    it that miss (noise, or a dip)."""
    from elastic_attention.evaluation.frontier import curve, highest_msr_keeping, points_missing

    tasks = sorted(tasks or {row["task"] for row in rows if row.get("kind") == "sensitive"})
    points = curve(rows, "heads@", length, tasks)
    if not points:
        return f"sensitive target: no heads@MSR points at {length} tokens"
    reached = highest_msr_keeping(points, tasks, share)
    if reached is None:
        return f"sensitive target: no point keeps {share:.0%} on every one of {', '.join(tasks)} at {length} tokens"
    line = (f"sensitive target at {length} tokens: MSR {reached.msr:.3f} ({reached.mode} keeps >= {share:.0%} on "
            f"{', '.join(tasks)})")
    beyond = [p for p in points if p.msr > reached.msr]
    if beyond:
        weakest = min(tasks, key=lambda task: beyond[0].tasks[task])
        line += f"; at {beyond[0].mode} {weakest} keeps {beyond[0].tasks[weakest]:.0%}"
    missing = points_missing(points, tasks, share, reached.msr)
    if missing:
        line += "; below it " + ", ".join(
            f"{p.mode} keeps " + ", ".join(f"{task} {p.tasks[task]:.0%}" for task in tasks if p.tasks[task] < share)
            for p in missing)
    return line


#: Issue 40's retention bars: the share of full attention every task of a kind must keep.
BAR_SHARES = {"sensitive": 0.97, "robust": 0.99}


def searched_set_at(rows: list[dict], length: int, msr: float) -> float | None:
    """The joint searched set's mean retention at ``msr``: linear between the two nearest points of its path, whose
    ends are full attention (MSR 0) and all-SSA (``sparse``, MSR 1); None outside the measured points."""
    from elastic_attention.evaluation.frontier import curve, point

    ends = [point(rows, "full", length), point(rows, "sparse", length)]
    points = sorted([*curve(rows, "heads@", length), *(p for p in ends if p is not None)], key=lambda p: p.msr)
    around = [(a, b) for a, b in zip(points, points[1:]) if a.msr <= msr <= b.msr]
    if not around:
        return None
    a, b = around[0]
    return a.retention + (b.retention - a.retention) * (msr - a.msr) / (b.msr - a.msr or 1.0)


def _against_searched_set(rows: list[dict], length: int, found) -> str:
    heads = searched_set_at(rows, length, found.msr)
    if heads is None:
        return ""
    return f"; the searched set there keeps {heads:.1%} ({100 * (found.retention - heads):+.1f} points)"


def by_kind_lines(rows: list[dict], lengths: Sequence[int], by_kind: tuple[str, str]) -> str:
    """Per length, the point of routing by task kind alone and the searched set's retention at its MSR."""
    from elastic_attention.evaluation.frontier import routed_by_kind

    lines = []
    for length in lengths:
        found = routed_by_kind(rows, *by_kind, length)
        if found is None:
            lines.append(f"by task kind ({by_kind[0]} / {by_kind[1]}) at {length} tokens: a cell is missing")
            continue
        lines.append(f"by task kind ({by_kind[0]} / {by_kind[1]}) at {length} tokens: MSR {found.msr:.3f}, "
                     f"mean retention {found.retention:.1%}{_against_searched_set(rows, length, found)}")
    return "\n".join(lines) + "\n"


def by_task_lines(rows: list[dict], lengths: Sequence[int], modes: Sequence[str]) -> str:
    """Per length, the sparsest choice per task among ``modes`` that keeps every task at its bar (`BAR_SHARES`;
    `routed_by_task`): each task's mode, the average MSR, MSR(robust) - MSR(sensitive), the mean retention and the
    searched set's at that MSR. The most MSR a router choosing among ``modes`` per task can buy while meeting the
    retention bars on these rows."""
    from elastic_attention.evaluation.frontier import routed_by_task

    lines = []
    for length in lengths:
        found = routed_by_task(rows, modes, length, BAR_SHARES)
        if found is None:
            lines.append(f"by task, at the bars, at {length} tokens: a cell is missing")
            continue
        by_task, chosen = found
        kinds = {row["task"]: row.get("kind") for row in rows if row["mode"] == "full" and row["length"] == length}
        msrs = {row["task"]: row["msr"] for row in rows
                if row["length"] == length and chosen.get(row["task"]) == row["mode"]}
        mean = {kind: [msrs[task] for task in chosen if kinds[task] == kind] for kind in BAR_SHARES}
        gap = (sum(mean["robust"]) / len(mean["robust"]) - sum(mean["sensitive"]) / len(mean["sensitive"])
               if mean["robust"] and mean["sensitive"] else math.nan)
        lines.append(f"by task, at the bars (sensitive >= {BAR_SHARES['sensitive']:.0%}, robust >= "
                     f"{BAR_SHARES['robust']:.0%}), at {length} tokens: MSR {by_task.msr:.3f}, MSR(robust) - "
                     f"MSR(sensitive) {gap:.3f}, mean retention {by_task.retention:.1%}"
                     f"{_against_searched_set(rows, length, by_task)}; "
                     + ", ".join(f"{task} {chosen[task]} ({by_task.tasks[task]:.0%})" for task in chosen))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> str:
    from elastic_attention.evaluation.frontier import plot_pareto
    from elastic_attention.io import atomic_write_text

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("frontier", nargs="+", help="eval.json files of the frontier (their cells are pooled)")
    parser.add_argument("--router", action="append", default=[], metavar="LABEL=FILE",
                        help="an eval.json with a router run's elastic cells (repeatable)")
    parser.add_argument("--lengths", default=None, help="comma list of lengths in tokens (default: all in the files)")
    parser.add_argument("--target-length", type=int, default=16384)
    parser.add_argument("--share", type=float, default=0.98, help="share of full attention the target must keep")
    parser.add_argument("--target-tasks", help="comma list of the tasks the target must keep (default: every "
                                               "sensitive task; give the trained ones)")
    parser.add_argument("--by-kind", metavar="SENSITIVE_MODE,ROBUST_MODE",
                        help="also the point of routing by task kind alone, e.g. heads@0.5,sparse: each sensitive "
                             "task's cell of the first mode, each robust task's of the second")
    parser.add_argument("--by-task", metavar="MODES",
                        help="also the sparsest choice per task among these modes (comma list, e.g. "
                             "heads@0.1,...,heads@0.8,sparse) that keeps every task at issue 40's bars")
    parser.add_argument("--plot", help="PNG file for the Pareto plot")
    parser.add_argument("--out", help="markdown file for the tables and the target")
    args = parser.parse_args(argv)

    rows = [row for name in args.frontier for row in json.loads(Path(name).read_text())["results"]]
    routers = {}
    for item in args.router:
        label, _, name = item.partition("=")
        if not name:
            parser.error(f"--router takes LABEL=FILE, got {item!r}")
        routers[label] = [row for row in json.loads(Path(name).read_text())["results"]
                          if row["mode"] in ("elastic", "full")]
    lengths = ([int(text) for text in args.lengths.split(",")] if args.lengths
               else sorted({row["length"] for row in rows}))
    target_tasks = args.target_tasks.split(",") if args.target_tasks else None
    by_kind = tuple(args.by_kind.split(",")) if args.by_kind else None
    if by_kind is not None and len(by_kind) != 2:
        parser.error(f"--by-kind takes SENSITIVE_MODE,ROBUST_MODE, got {args.by_kind!r}")
    report = (frontier_tables(rows, lengths) + "\n\n"
              + sensitive_target(rows, args.target_length, args.share, target_tasks) + "\n"
              + (by_kind_lines(rows, lengths, by_kind) if by_kind else "")
              + (by_task_lines(rows, lengths, args.by_task.split(",")) if args.by_task else ""))
    if args.out:
        atomic_write_text(args.out, report)
    if args.plot:
        plot_pareto(rows, routers, lengths, args.plot, by_kind)
    print(report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
