"""Quality against sparsity over a whole suite: the points and curves behind a Pareto plot, and the sparsity targets
a static frontier allows.

Every function reads eval.json rows (dicts with ``mode``, ``task``, ``kind``, ``length``, ``accuracy``, ``msr``).
A row's retention is its accuracy over full attention's on the same (task, length); a mode's point at a length is
(mean MSR, mean retention) over the tasks, each task weighing the same. The modes ``heads@MSR`` (points of a searched
head-set path) and ``static@MSR`` (the retrieval-score static hybrid) make one curve each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from elastic_attention.errors import InputError

#: Curve families: mode prefix -> label.
CURVES = {"heads@": "joint searched head set", "static@": "retrieval-score static hybrid"}


@dataclass(frozen=True)
class Point:
    """One mode at one length, over the tasks it was measured on.

    Attributes:
        mode: the eval mode (``elastic``, ``heads@0.4``, ...).
        length: prompt length in tokens.
        msr: mean MSR over the tasks.
        retention: mean over the tasks of accuracy / full attention's accuracy (NaN when a task's full accuracy
            is 0).
        tasks: task -> retention.
    """

    mode: str
    length: int
    msr: float
    retention: float
    tasks: dict[str, float]


def full_accuracy(rows: Sequence[dict]) -> dict[tuple[str, int], float]:
    """(task, length) -> full attention's accuracy."""
    return {(row["task"], row["length"]): row["accuracy"] for row in rows if row["mode"] == "full"}


def point(rows: Sequence[dict], mode: str, length: int, tasks: Sequence[str] | None = None) -> Point | None:
    """``mode``'s point at ``length`` over ``tasks`` (default: every task with a full-attention cell there); None
    when a task lacks the mode's cell or full attention's."""
    full = full_accuracy(rows)
    cells = {row["task"]: row for row in rows if row["mode"] == mode and row["length"] == length}
    tasks = list(tasks) if tasks is not None else [task for task, at in full if at == length]
    if not tasks or any(task not in cells or (task, length) not in full for task in tasks):
        return None
    kept = {task: cells[task]["accuracy"] / full[(task, length)] if full[(task, length)] else math.nan
            for task in tasks}
    return Point(mode=mode, length=length, msr=sum(cells[task]["msr"] for task in tasks) / len(tasks),
                 retention=sum(kept.values()) / len(kept), tasks=kept)


def routed_by_kind(rows: Sequence[dict], sensitive_mode: str, robust_mode: str, length: int) -> Point | None:
    """The point of routing by task kind alone, with no router: each sensitive task's cell of ``sensitive_mode``
    (e.g. ``heads@0.5``, a searched set) and each robust task's of ``robust_mode`` (e.g. ``sparse``), as if a router
    told the kinds apart perfectly and chose nothing else. None when a cell is missing.

    Raises:
        ValueError: a row at ``length`` has no ``kind`` (eval.json files written before rows carried it).
    """
    kinds = {row["task"]: row.get("kind") for row in rows if row["length"] == length}
    unknown = sorted(task for task, kind in kinds.items() if kind not in ("sensitive", "robust"))
    if unknown:
        raise ValueError(f"routing by kind needs each task's kind (sensitive or robust); the rows of {unknown} at "
                         f"{length} tokens have none: evaluate them again or add `kind`")
    chosen = [dict(row, mode="by kind") for row in rows if row["length"] == length and row["mode"] == (
        sensitive_mode if kinds[row["task"]] == "sensitive" else robust_mode)]
    return point([*chosen, *(row for row in rows if row["mode"] == "full")], "by kind", length)


def routed_by_task(rows: Sequence[dict], modes: Sequence[str], length: int,
                   shares: dict[str, float]) -> tuple[Point, dict[str, str]] | None:
    """The sparsest choice per task that keeps its kind's share of full attention: at ``length``, each task takes the
    cell of the highest-MSR mode of ``modes`` measured on it whose retention is at least ``shares[kind]``, or full
    attention's (retention 1, MSR 0) where none is. A router that picks one of ``modes`` per task and meets those
    shares on every task has at most this point's MSR, on these rows. Returns (the point, mode ``by task``; task ->
    the mode chosen), or None when no task has a full-attention cell at ``length``.

    Raises:
        ValueError: a task's kind is not in ``shares``.
    """
    full = full_accuracy(rows)
    cells = {(row["mode"], row["task"]): row for row in rows if row["length"] == length}
    tasks = [task for task, at in full if at == length]
    if not tasks:
        return None
    chosen_rows, chosen = [], {}
    for task in tasks:
        kind = cells[("full", task)].get("kind")
        if kind not in shares:
            raise ValueError(f"task {task} at {length} tokens is of kind {kind!r}; shares are given for "
                             f"{sorted(shares)}: give a share for every kind")
        keeping = [cells[(mode, task)] for mode in modes if (mode, task) in cells and full[(task, length)]
                   and cells[(mode, task)]["accuracy"] / full[(task, length)] >= shares[kind]]
        best = max(keeping, key=lambda row: row["msr"], default=cells[("full", task)])
        chosen[task] = best["mode"]
        chosen_rows.append(dict(best, mode="by task"))
    by_task = point([*chosen_rows, *(row for row in rows if row["mode"] == "full")], "by task", length)
    return by_task, chosen


def curve(rows: Sequence[dict], prefix: str, length: int, tasks: Sequence[str] | None = None) -> list[Point]:
    """The complete points of every ``PREFIX@MSR`` mode at ``length``, by rising MSR."""
    modes = dict.fromkeys(row["mode"] for row in rows if row["mode"].startswith(prefix))
    points = [point(rows, mode, length, tasks) for mode in modes]
    return sorted((p for p in points if p is not None), key=lambda p: p.msr)


def highest_msr_keeping(points: Sequence[Point], tasks: Sequence[str], share: float) -> Point | None:
    """The point of highest MSR at which every task of ``tasks`` keeps at least ``share`` of full attention (None
    when no point does). Points below it may miss (a few rows a cell make a noisy curve): `points_missing` lists
    them."""
    keeping = [p for p in points if all(p.tasks.get(task, math.nan) >= share for task in tasks)]
    return max(keeping, key=lambda p: p.msr, default=None)


def points_missing(points: Sequence[Point], tasks: Sequence[str], share: float, below: float) -> list[Point]:
    """The points under MSR ``below`` at which some task of ``tasks`` keeps less than ``share``."""
    return [p for p in points if p.msr < below and any(not p.tasks.get(task, math.nan) >= share for task in tasks)]


def with_full(cells: Sequence[dict], frontier: Sequence[dict]) -> list[dict]:
    """A router run's rows with the full-attention cells to divide by: the run's own where it has them (the same
    rows), else the frontier's."""
    own = {(row["task"], row["length"]) for row in cells if row["mode"] == "full"}
    return [*cells, *(row for row in frontier if row["mode"] == "full" and (row["task"], row["length"]) not in own)]


#: (marker, colour) of each router run's point, in turn: colours the curves and the by-kind point do not use.
ROUTER_STYLES = tuple((marker, color) for marker in ("D", "s", "^")
                      for color in ("C3", "C4", "C5", "C6", "C8", "C9", "C7"))


def plot_pareto(frontier: Sequence[dict], routers: dict[str, Sequence[dict]], lengths: Sequence[int],
                path: str | Path, by_kind: tuple[str, str] | None = None) -> Path:
    """Mean retention over the tasks against mean MSR, one panel per length: the ``heads@`` and ``static@`` curves
    and full / all-SSA of the frontier, the ``elastic`` point of each router run, and with ``by_kind`` (sensitive
    mode, robust mode) the point of routing by task kind alone (`routed_by_kind`).

    Args:
        frontier: eval.json rows of the frontier (full attention's among them).
        routers: label -> a router run's eval.json rows (its elastic cells; each is divided by the run's own full
            attention cell where it has one, else by the frontier's: `with_full`).
        lengths: prompt lengths, one panel each.
        path: PNG file to write.
    """
    if len(routers) > len(ROUTER_STYLES):
        raise InputError(f"{len(routers)} router runs for one plot, which tells {len(ROUTER_STYLES)} apart: plot fewer")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(lengths), figsize=(5.2 * len(lengths), 4.4), squeeze=False)
    for axis, length in zip(axes[0], lengths):
        for (prefix, label), style in zip(CURVES.items(), ("o-", "s--")):
            points = curve(frontier, prefix, length)
            if points:
                axis.plot([p.msr for p in points], [p.retention for p in points], style, label=label, markersize=4)
        for mode, marker, label in (("full", "k*", "full attention"), ("sparse", "kx", "all SSA")):
            found = point(frontier, mode, length)
            if found is not None:
                axis.plot(found.msr, found.retention, marker, markersize=9, label=label)
        found = routed_by_kind(frontier, *by_kind, length) if by_kind else None
        if found is not None:
            axis.plot(found.msr, found.retention, "o", markerfacecolor="none", color="C2", markersize=10,
                      label=f"by task kind, no router ({by_kind[0]} / {by_kind[1]})")
        for (label, rows), (marker, color) in zip(routers.items(), ROUTER_STYLES):
            found = point(with_full(rows, frontier), "elastic", length)
            if found is not None:
                axis.plot(found.msr, found.retention, marker, color=color, markersize=8, label=f"elastic: {label}")
        axis.set_title(f"{length // 1024}K tokens" if length % 1024 == 0 else f"{length} tokens")
        axis.set_xlabel("average MSR (share of KV heads on sparse attention)")
        axis.set_ylabel("mean retention (accuracy / full attention's)")
        axis.set_xlim(-0.03, 1.03)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, loc="lower left")
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)
