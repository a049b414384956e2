"""Training plots (PNG): the router trainer's losses, MSR and multipliers per task against step (the paper's Figure
13), and the pretraining recipe's losses, accuracies and learning rate."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)


def write_plot(plot: Callable[[list[dict], Path], Path], history: list[dict], output_dir: Path) -> Path | None:
    """``plot(history, output_dir)``; without matplotlib, a warning and no plot (None)."""
    try:
        return plot(history, output_dir)
    except ImportError:
        logger.warning("matplotlib is not installed: no training plot (pip install 'elastic-attention[train]')")
        return None


def plot_training(history: list[dict], output_dir: Path) -> Path:
    """Four panels from the metric history (the LM loss overall and per task, the regularisation loss, MSR and
    lambda1 per task); returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in history]
    figure, axes = plt.subplots(2, 2, figsize=(11, 7))
    axes[0, 0].plot(steps, [m["lm_loss"] for m in history], color="black", label="all")
    for key in sorted(k for k in history[0] if k.startswith("lm_loss/")):
        _plot_logged_steps(axes[0, 0], history, key, linewidth=0.6)
    axes[0, 0].set_title("LM loss (answer tokens; per task where logged)")
    axes[0, 0].set_yscale("log")
    axes[0, 0].legend(fontsize=7)
    axes[0, 1].plot(steps, [m["reg_loss"] for m in history])
    axes[0, 1].set_title("regularisation loss")
    for key in sorted(k for k in history[0] if k.startswith("msr/")):
        _plot_logged_steps(axes[1, 0], history, key)
        axes[1, 1].plot(steps, [m["lambda1/" + key[4:]] for m in history], label=key[4:])
    axes[1, 0].set_title("MSR per task")
    axes[1, 0].set_ylim(-0.05, 1.05)
    axes[1, 1].set_title("multiplier lambda1 per task")
    axes[1, 0].legend(fontsize=7)
    for axis in axes.flat:
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    figure.tight_layout()
    path = Path(output_dir) / "training.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _plot_logged_steps(axis, history: list[dict], key: str, **style) -> None:
    """Plot a per-task metric (``kind/TASK``, labelled TASK) at the steps that logged it: a task may be absent from
    a step's packs (NaN)."""
    present = [(m["step"], m[key]) for m in history if m[key] == m[key]]
    if present:
        axis.plot(*zip(*present), marker=".", label=key.split("/", 1)[1], **style)


def plot_pretraining(history: list[dict], output_dir: Path) -> Path:
    """Three panels from the pretraining recipe's logged steps (losses, argmax accuracies, learning rate); returns
    the PNG path (``output_dir/training.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in history]
    figure, axes = plt.subplots(1, 3, figsize=(14, 4))
    for key in ("loss", "suite", "dense"):
        axes[0].plot(steps, [m[key] for m in history], label=key)  # NaN (no suite row yet) leaves a gap
    axes[0].set_title("loss (cross-entropy on supervised tokens)")
    axes[0].set_yscale("log")
    for key in ("suite_accuracy", "dense_accuracy"):
        axes[1].plot(steps, [m[key] for m in history], label=key.removesuffix("_accuracy"))
    axes[1].set_title("argmax accuracy on supervised tokens")
    axes[1].set_ylim(-0.05, 1.05)
    axes[2].plot(steps, [m["lr"] for m in history])
    axes[2].set_title("learning rate")
    for axis in axes:
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    figure.tight_layout()
    path = Path(output_dir) / "training.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
