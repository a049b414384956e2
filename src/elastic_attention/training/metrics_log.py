"""A run's metric history: one step's metrics gathered over the processes, and on disk ``metrics.csv`` (one row
per logged step) and tensorboard event files."""

from __future__ import annotations

import csv
import io
import logging
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist

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


def step_metrics(step: int, sums: dict[str, float], task_msr: dict[str, list[float]],
                 task_lm: dict[str, list[float]], packs: int, objective, device: torch.device, *, temperature: float,
                 lr: float) -> dict:
    """One router-training step's metrics row, over every process's packs.

    Args:
        step: the 1-based step.
        sums: this process's summed ``lm_loss`` and ``reg_loss`` (and ``teacher_loss`` with the signal teacher) over
            its packs.
        task_msr: task -> this process's MSR of each of its samples.
        task_lm: task -> this process's [summed answer-token loss, answer tokens].
        packs: the step's packs on all processes (the sums are averaged over them).
        objective: the `SparsityObjective` (its tasks and multipliers).
        device: where the sums are all-reduced (NCCL reduces only device tensors).
        temperature: the routers' temperature at this step.
        lr: the routers' learning rate at this step.

    Returns:
        ``step``, ``lm_loss``, ``reg_loss``, ``temperature``, ``lr`` and, per task, ``msr/``, ``lm_loss/`` (per
        answer token), ``lambda1/`` and ``lambda2/`` (NaN for a task without samples in this step).
    """
    totals = torch.tensor([sums["lm_loss"], sums["reg_loss"], sums.get("teacher_loss", 0.0)], dtype=torch.float64)
    gathered = [(task_msr, task_lm)]
    if dist.is_initialized() and dist.get_world_size() > 1:
        totals = totals.to(device)
        dist.all_reduce(totals)
        totals = totals.cpu()
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (dict(task_msr), dict(task_lm)))
    merged: dict[str, list[float]] = defaultdict(list)
    answer_loss: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for msr_part, lm_part in gathered:
        for task, values in msr_part.items():
            merged[task] += values
        for task, (total, tokens) in lm_part.items():
            answer_loss[task][0] += total
            answer_loss[task][1] += tokens
    metrics = {"step": step, "lm_loss": float(totals[0]) / packs, "reg_loss": float(totals[1]) / packs,
               "temperature": temperature, "lr": lr}
    if "teacher_loss" in sums:  # a run with the signal teacher (`router_objective`)
        metrics["teacher_loss"] = float(totals[2]) / packs
    for index, task in enumerate(objective.tasks):
        values = merged.get(task)
        metrics[f"msr/{task}"] = sum(values) / len(values) if values else float("nan")
        total, tokens = answer_loss.get(task, (0.0, 0))
        metrics[f"lm_loss/{task}"] = total / tokens if tokens else float("nan")
        metrics[f"lambda1/{task}"] = float(objective.lambda1.detach()[index])
        metrics[f"lambda2/{task}"] = float(objective.lambda2.detach()[index])
    return metrics


def progress_postfix(metrics: dict) -> str:
    """The progress bar's text for one step's metrics row: the losses, each task's MSR and first multiplier."""
    msr = " ".join(f"{k.split('_')[-1]}={v:.2f}" for k, v in metrics.items() if k.startswith("msr/") and v == v)
    lambdas = " ".join(f"{v:+.2f}" for k, v in metrics.items() if k.startswith("lambda1/"))
    teacher = f" teacher {metrics['teacher_loss']:.3f}" if "teacher_loss" in metrics else ""
    return f"lm {metrics['lm_loss']:.3f} reg {metrics['reg_loss']:+.3f}{teacher} | MSR {msr} | l1 {lambdas}"
