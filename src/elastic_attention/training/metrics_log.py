"""A run's metric history on disk: ``metrics.csv`` (one row per logged step) and tensorboard event files."""

from __future__ import annotations

import csv
import io
import logging
from pathlib import Path

from elastic_attention.io import atomic_write_text

logger = logging.getLogger(__name__)


def append_metrics(path: Path, metrics: dict, writer=None) -> None:
    """Add one row to the CSV at ``path`` (a new file, with its header, at step 1 or when there is none) and the
    scalars to the tensorboard ``writer`` when there is one. ``metrics["step"]`` is the 1-based step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or metrics["step"] == 1
    with path.open("w" if new else "a", newline="") as file:
        csv_writer = csv.DictWriter(file, fieldnames=list(metrics))
        if new:
            csv_writer.writeheader()
        csv_writer.writerow(metrics)
    if writer is not None:
        for key, value in metrics.items():
            if key != "step":
                writer.add_scalar(key, value, metrics["step"])


def rewrite_metrics(path: Path, history: list[dict]) -> None:
    """Make the CSV hold exactly ``history``: a run killed after logging steps past its last checkpoint would
    otherwise log those steps twice once resumed."""
    if not history:
        path.unlink(missing_ok=True)
        return
    buffer = io.StringIO(newline="")
    csv_writer = csv.DictWriter(buffer, fieldnames=list(history[0]))
    csv_writer.writeheader()
    csv_writer.writerows(history)
    atomic_write_text(path, buffer.getvalue())


def open_tensorboard(output_dir: Path, step: int):
    """A tensorboard ``SummaryWriter`` under ``output_dir/tensorboard`` that drops events after ``step`` (a resumed
    run rewrites them), or None when tensorboard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.info("tensorboard is not installed: logging to metrics.csv only")
        return None
    return SummaryWriter(str(output_dir / "tensorboard"), purge_step=step + 1)
