"""`RoutingReport`: what routing decided in the last prefill, and the sparsity it bought."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from elastic_attention.router import is_retrieval


@dataclass(frozen=True)
class RoutingReport:
    """Routing of the last prefill, one entry per sequence (a batch row, or a packed sample).

    MSR and ESR are computed over the routed layers; layers without a router run full attention.

    Attributes:
        layers: indices of the routed decoder layers, L of them.
        rows: [N] int64, batch row of each sequence.
        z: [N, L, Hkv] float32 routing decisions, 1.0 = retrieval (class 1), 0.0 = sparse; carries the
            straight-through gradient in training.
        msr: [N] model sparsity ratio: fraction of (layer, KV head) pairs routed to sparse attention; differentiable
            through ``z`` in training.
        esr_per_layer: [N, L] effective sparsity per layer: mean over query heads of 1 - attended causal
            (query, key) pairs / all causal pairs (0 for full-attention heads).
    """

    layers: tuple[int, ...]
    rows: torch.Tensor
    z: torch.Tensor
    msr: torch.Tensor
    esr_per_layer: torch.Tensor

    @property
    def decisions(self) -> torch.Tensor:
        """[N, L, Hkv] bool, True where the KV head runs retrieval attention (class 1)."""
        return is_retrieval(self.z)

    @property
    def esr_last(self) -> torch.Tensor:
        """[N] effective sparsity of the last routed layer (the paper's ESR)."""
        return self.esr_per_layer[:, -1]

    @property
    def esr_mean(self) -> torch.Tensor:
        """[N] effective sparsity averaged over the routed layers."""
        return self.esr_per_layer.mean(dim=1)

    def summary(self) -> list[dict[str, float]]:
        """Per sequence: row, MSR, ESR of the last layer, mean ESR, as plain floats."""
        return [
            {"row": int(row), "msr": float(msr), "esr_last": float(last), "esr_mean": float(mean)}
            for row, msr, last, mean in zip(
                self.rows.tolist(), self.msr.detach(), self.esr_last, self.esr_mean
            )
        ]
