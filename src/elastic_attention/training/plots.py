"""Training plots (PNG): losses, MSR per task and multipliers per task against step (the paper's Figure 13)."""

from __future__ import annotations

from pathlib import Path

import torch


def plot_training(history: list[dict], output_dir: Path) -> Path:
    """Four panels from the metric history; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in history]
    figure, axes = plt.subplots(2, 2, figsize=(11, 7))
    axes[0, 0].plot(steps, [m["lm_loss"] for m in history])
    axes[0, 0].set_title("LM loss")
    axes[0, 1].plot(steps, [m["reg_loss"] for m in history])
    axes[0, 1].set_title("regularisation loss")
    for key in sorted(k for k in history[0] if k.startswith("msr/")):
        axes[1, 0].plot(steps, [m[key] for m in history], label=key[4:])
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
    figure, axes = plt.subplots(1, len(tasks), figsize=(2.2 * len(tasks) + 1, 3.6), squeeze=False)
    for axis, task in zip(axes[0], tasks):
        image = axis.imshow(frequency[task].numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto")
        axis.set_title(task, fontsize=8)
        axis.set_xlabel("KV head")
        axis.set_ylabel("layer")
    figure.colorbar(image, ax=axes[0].tolist(), label="share routed to full attention")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)
