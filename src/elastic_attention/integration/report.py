"""`RoutingReport`: what routing decided in the last prefill, and the sparsity it bought."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from elastic_attention.router import is_retrieval
from elastic_attention.router.head_set_router import SetDecision, set_msrs


@dataclass(frozen=True)
class HeadSetReport:
    """A head-set router's choice for each sequence of a prefill.

    Attributes:
        decision: the `SetDecision` (chosen set, probabilities, most probable set) of each sequence.
        head_sets: [C, routed layers, Hkv] the router's sets, 1.0 where a set runs full attention.
        floor_set: the safety floor's set, or None.
        floor_confidence: the probability under which the floor acts.
        thresholds: with a `SignalSetRouter`, its thresholds on the retrieval signal (densest set first); else None.
    """

    decision: SetDecision
    head_sets: torch.Tensor
    floor_set: int | None
    floor_confidence: float
    thresholds: tuple[float, ...] | None = None

    @property
    def full_heads(self) -> torch.Tensor:
        """[C] each set's number of full-attention (routed layer, KV head) pairs."""
        return self.head_sets.sum(dim=(1, 2)).long()

    @property
    def set_msrs(self) -> torch.Tensor:
        """[C] each set's MSR (its share of sparse pairs)."""
        return set_msrs(self.head_sets)

    @property
    def total_heads(self) -> int:
        """The number of (routed layer, KV head) pairs."""
        return self.head_sets[0].numel()

    def line(self, sequence: int = 0) -> str:
        """One line saying which set ``sequence`` runs, its MSR and full heads, the probability it was chosen with,
        and the safety floor's part in it."""
        decision = self.decision
        choice, preferred = int(decision.choice[sequence]), int(decision.preferred[sequence])
        probabilities = decision.probabilities[sequence]
        text = (f"head set {choice} of {len(self.set_msrs)}: MSR {float(self.set_msrs[choice]):.2f}, "
                f"{int(self.full_heads[choice])} of {self.total_heads} KV heads full")
        if self.thresholds is not None and decision.signal is not None:
            bands = ", ".join(f"set {index} from {value:.3f}" for index, value in enumerate(self.thresholds))
            return (f"{text}; retrieval signal {float(decision.signal[sequence]):.3f} ({bands}, set "
                    f"{len(self.thresholds)} below; the last threshold is the safety floor)")
        if choice != preferred:
            return (f"{text}; the safety floor moved it from set {preferred} (MSR "
                    f"{float(self.set_msrs[preferred]):.2f}, probability {float(probabilities[preferred]):.2f} < "
                    f"{self.floor_confidence:.2f})")
        text += f", probability {float(probabilities[choice]):.2f}"
        if self.floor_set is not None and self.floor_confidence > 0:
            text += (f" (safety floor: set {self.floor_set}, MSR {float(self.set_msrs[self.floor_set]):.2f}, below "
                     f"{self.floor_confidence:.2f})")
        return text


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
        head_sets: with a head-set router in eval mode (routing not forced), its choice per sequence; else None.
    """

    layers: tuple[int, ...]
    rows: torch.Tensor
    z: torch.Tensor
    msr: torch.Tensor
    esr_per_layer: torch.Tensor
    head_sets: HeadSetReport | None = None

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

    def __str__(self) -> str:
        """One line per sequence: its row, MSR, ESR of the last routed layer and mean ESR, and a head-set router's
        choice (`HeadSetReport.line`) when there is one."""
        lines = [f"RoutingReport: {len(self.rows)} sequence(s), {len(self.layers)} routed layer(s)"]
        for sequence, item in enumerate(self.summary()):
            line = (f"  sequence {sequence} (row {item['row']}): MSR {item['msr']:.2f}, ESR last "
                    f"{item['esr_last']:.2f}, ESR mean {item['esr_mean']:.2f}")
            if self.head_sets is not None:
                line += f"; {self.head_sets.line(sequence)}"
            lines.append(line)
        return "\n".join(lines)

    def summary(self) -> list[dict[str, float]]:
        """Per sequence: row, MSR, ESR of the last layer, mean ESR, as plain floats."""
        return [
            {"row": int(row), "msr": float(msr), "esr_last": float(last), "esr_mean": float(mean)}
            for row, msr, last, mean in zip(
                self.rows.tolist(), self.msr.detach(), self.esr_last, self.esr_mean
            )
        ]
