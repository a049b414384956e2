"""Tables, JSON and plots of evaluation results."""

from __future__ import annotations

import dataclasses
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from elastic_attention.evaluation.runner import CellResult
from elastic_attention.io import atomic_write_text


def format_table(results: Sequence[CellResult]) -> str:
    """A fixed-width table: one line per (mode, task, length) with accuracy, MSR and ESR.

    An ``exact`` column (share of rows answered exactly) follows the accuracy when some cell's accuracy is a graded
    score (edit similarity), i.e. differs from its exact-match share.
    """
    graded = _graded(results)
    width = max([8] + [len(r.mode) for r in results])
    exact_header = f" {'exact':>6}" if graded else ""
    header = (f"{'mode':<{width}} {'task':<18} {'length':>7} {'n':>4} {'accuracy':>9}{exact_header} {'MSR':>6} "
              f"{'ESR last':>9} {'ESR mean':>9}")
    lines = [header, "-" * len(header)]
    for r in results:
        exact = f" {r.exact_match:>6.3f}" if graded else ""
        lines.append(
            f"{r.mode:<{width}} {r.task:<18} {r.length:>7} {r.samples:>4} {r.accuracy:>9.3f}{exact} {r.msr:>6.3f} "
            f"{r.esr_last:>9.3f} {r.esr_mean:>9.3f}"
        )
    return "\n".join(lines)


def format_markdown(results: Sequence[CellResult]) -> str:
    """A markdown table: one row per (task, length), one accuracy column per mode with its MSR in brackets."""
    modes = list(dict.fromkeys(r.mode for r in results))
    cells = {(r.task, r.length, r.mode): r for r in results}
    header = "| task | kind | length | " + " | ".join(f"{mode} acc (MSR)" for mode in modes) + " |"
    lines = [header, "|" + "---|" * (3 + len(modes))]
    for task, kind, length in dict.fromkeys((r.task, r.kind, r.length) for r in results):
        values = []
        for mode in modes:
            cell = cells.get((task, length, mode))
            values.append("-" if cell is None else f"{cell.accuracy:.3f} ({cell.msr:.2f})")
        lines.append(f"| {task} | {kind} | {length} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def _graded(results: Sequence[CellResult]) -> bool:
    return any(abs(r.accuracy - r.exact_match) > 1e-12 for r in results)


def write_json(results: Sequence[CellResult], path: str | Path, **context) -> None:
    """Results plus the context that produced them (command, date, model, ...) as JSON, written atomically."""
    document = {**context, "results": [r.to_dict() for r in results]}
    atomic_write_text(path, json.dumps(document, indent=2))


def command_and_date() -> dict:
    """The ``command`` (this process's argv) and UTC ``date`` every eval.json header starts with."""
    return {"command": " ".join(sys.argv),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def cell_results(rows: Sequence[dict]) -> list[CellResult]:
    """The `CellResult` of each row of an eval.json (fields `CellResult` does not know are left out)."""
    known = {field.name for field in dataclasses.fields(CellResult)}
    return [CellResult(**{key: value for key, value in row.items() if key in known}) for row in rows]


def write_table_and_plot(results: Sequence[CellResult], out_dir: str | Path) -> str:
    """eval.md and accuracy_vs_msr.png of ``results`` in ``out_dir`` (beside its eval.json); returns the printed
    table and the list of files written."""
    out_dir = Path(out_dir)
    atomic_write_text(out_dir / "eval.md", format_markdown(results) + "\n")
    plot_accuracy_vs_msr(results, out_dir / "accuracy_vs_msr.png")
    written = ", ".join(str(out_dir / name) for name in ("eval.json", "eval.md", "accuracy_vs_msr.png"))
    return format_table(results) + f"\n\nwrote {written}"


def plot_accuracy_vs_msr(results: Sequence[CellResult], path: str | Path) -> None:
    """One panel per task: accuracy against mean MSR, one marker per (mode, length)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r.task for r in results))
    modes = list(dict.fromkeys(r.mode for r in results))
    columns = min(4, len(tasks))
    rows = (len(tasks) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3.2 * rows), squeeze=False)
    markers = dict(zip(sorted({r.length for r in results}), "osD^v<>p"))
    for axis, task in zip(axes.flat, tasks):
        for color, mode in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], modes):
            for r in (r for r in results if r.task == task and r.mode == mode):
                axis.scatter(r.msr, r.accuracy, color=color, marker=markers[r.length],
                             label=f"{mode} @ {r.length}")
        axis.set_title(task)
        axis.set_xlabel("MSR")
        axis.set_ylabel("exact match")
        axis.set_xlim(-0.05, 1.05)
        axis.set_ylim(-0.05, 1.05)
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(tasks):]:
        axis.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8)
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_head_routing(frequency: dict[str, torch.Tensor], path: Path) -> Path:
    """Heatmaps of head-routing frequency per task (the paper's Figure 6).

    Args:
        frequency: task -> [layers, Hkv] share of samples that route the head to full attention.
        path: PNG file to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(frequency)
    figure, axes = plt.subplots(1, len(tasks), figsize=(2.6 * len(tasks) + 1.5, 3.6), squeeze=False)
    for axis, task in zip(axes[0], tasks):
        image = axis.imshow(frequency[task].numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto")
        axis.set_title(task, fontsize=8)
        axis.set_xlabel("KV head")
        axis.set_xticks(range(frequency[task].shape[1]))
        axis.set_yticks(range(frequency[task].shape[0]))
    axes[0, 0].set_ylabel("layer")
    figure.colorbar(image, ax=axes[0].tolist(), label="share routed to full attention")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)
