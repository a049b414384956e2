"""The paper's training objective: LM loss plus a per-task sparsity constraint with trainable multipliers.

For each task k with target t_k (or a band [lo_k, hi_k]) and the samples S_k of that task in the batch:

    reg = sum_k mean_{i in S_k} ( lambda1[k] * g(gap_i) + lambda2[k] * gap_i^2 ),   gap_i = MSR_i - t_k

with g the identity ("signed", a real Lagrangian) or the absolute value ("absolute", what the reference code does).
The multipliers are trained by gradient ascent (their optimizer group maximizes), the routers by descent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from elastic_attention.errors import ConfigError, InputError

LINEAR_TERMS = ("signed", "absolute")


class SparsityObjective(nn.Module):
    """Per-task sparsity targets and their multipliers.

    Args:
        targets: task -> target MSR in [0, 1].
        linear_term: ``"signed"`` or ``"absolute"``.
        bounds: optional task -> (lower, upper) MSR band; inside the band the gap is 0. Overrides the target.
    """

    def __init__(
        self,
        targets: Mapping[str, float],
        linear_term: str = "signed",
        bounds: Mapping[str, tuple[float, float]] | None = None,
    ) -> None:
        super().__init__()
        if linear_term not in LINEAR_TERMS:
            raise ConfigError(f"`linear_term` must be one of {LINEAR_TERMS}, got {linear_term!r}")
        if not targets:
            raise ConfigError("`targets` must map at least one task to a target MSR")
        for task, target in targets.items():
            if not 0.0 <= float(target) <= 1.0:
                raise ConfigError(f"target MSR of task {task!r} must be in [0, 1], got {target}")
        bounds = dict(bounds or {})
        for task, (lower, upper) in bounds.items():
            if task not in targets:
                raise ConfigError(f"bounds name task {task!r}, which has no target")
            if not 0.0 <= lower <= upper <= 1.0:
                raise ConfigError(f"bounds of task {task!r} must satisfy 0 <= lower <= upper <= 1, got {(lower, upper)}")
        self.tasks = tuple(sorted(targets))
        self.linear_term = linear_term
        self.register_buffer("target", torch.tensor([float(targets[t]) for t in self.tasks]))
        lower = [bounds.get(t, (targets[t], targets[t]))[0] for t in self.tasks]
        upper = [bounds.get(t, (targets[t], targets[t]))[1] for t in self.tasks]
        self.register_buffer("lower", torch.tensor(lower, dtype=torch.float32))
        self.register_buffer("upper", torch.tensor(upper, dtype=torch.float32))
        self.lambda1 = nn.Parameter(torch.zeros(len(self.tasks)))
        self.lambda2 = nn.Parameter(torch.zeros(len(self.tasks)))

    def task_indices(self, tasks: Sequence[str]) -> torch.Tensor:
        """[N] int64 index of each sample's task.

        Raises:
            InputError: a task without a target.
        """
        unknown = sorted(set(tasks) - set(self.tasks))
        if unknown:
            raise InputError(f"tasks {unknown} have no sparsity target; map them in the training config `targets`")
        return torch.tensor([self.tasks.index(task) for task in tasks], dtype=torch.long)

    def gap(self, msr: torch.Tensor, task_index: torch.Tensor) -> torch.Tensor:
        """[N] MSR minus the nearest admissible value of the sample's task (0 inside a band)."""
        task_index = task_index.to(msr.device)
        lower, upper = self.lower.to(msr.device)[task_index], self.upper.to(msr.device)[task_index]
        return msr - torch.minimum(torch.maximum(msr, lower), upper)

    def forward(self, msr: torch.Tensor, task_index: torch.Tensor) -> torch.Tensor:
        """Regularisation loss of a batch.

        Args:
            msr: [N] per-sample MSR (differentiable through the routers).
            task_index: [N] task of each sample (see `task_indices`).

        Returns:
            Scalar: the sum over tasks present of the per-task mean of lambda1 * g(gap) + lambda2 * gap^2.
        """
        task_index = task_index.to(msr.device)
        gap = self.gap(msr, task_index)
        linear = gap if self.linear_term == "signed" else gap.abs()
        per_sample = self.lambda1[task_index] * linear + self.lambda2[task_index] * gap.square()
        counts = torch.bincount(task_index, minlength=len(self.tasks)).clamp(min=1).to(per_sample.dtype)
        per_task = torch.zeros(len(self.tasks), device=msr.device, dtype=per_sample.dtype)
        per_task = per_task.index_add(0, task_index, per_sample) / counts
        return per_task.sum()
