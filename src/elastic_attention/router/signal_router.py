"""`SignalSetRouter`: a head set per prompt, chosen by thresholds on the prompt's retrieval signal.

Like a `HeadSetRouter` it runs one of C head sets ([C, routed layers, Hkv], True = full attention) for a whole prompt,
but it reads what the prompt asks of its context instead of its pooled keys: the `retrieval_signal` of one routed
layer (the decision layer), the largest over its KV heads. The sets are ordered from densest to sparsest and the
thresholds t_0 > t_1 > ... > t_{C-2} split the signal: a prompt with signal >= t_0 runs set 0, one in
[t_1, t_0) set 1, ..., one below t_{C-2} the sparsest set. The thresholds are calibrated on validation rows (the last
for a high recall of the rows that need the far context, so that a prompt near it falls back to a set that keeps
retrieval instead of the sparsest one). The routed layers before the decision layer run before the signal exists:
every set agrees on them. The router has no weights to train.
"""

from __future__ import annotations

import torch
from torch import nn

from elastic_attention.router.head_set_router import ChoosesHeadSets, SetDecision


class SignalSetRouter(ChoosesHeadSets, nn.Module):
    """Thresholds on the retrieval signal choose one of C head sets per prompt.

    Args:
        num_kv_heads: Hkv of the model.
        thresholds: the C - 1 thresholds, strictly decreasing, in [0, 1].
        routed_layers: R, the layers the sets cover.
        decision_position: the index, among the routed layers, of the layer whose signal decides.

    Buffers:
        head_sets: [C, R, Hkv] float32, 1.0 where a set runs full attention (`set_head_sets`); saved with the router.
    """

    def __init__(self, num_kv_heads: int, thresholds: tuple[float, ...], routed_layers: int,
                 decision_position: int) -> None:
        super().__init__()
        thresholds = tuple(float(value) for value in thresholds)
        if not thresholds:
            raise ValueError("a signal router chooses among at least 2 sets: give at least one threshold")
        if any(not 0.0 <= value <= 1.0 for value in thresholds) or any(
                later >= earlier for earlier, later in zip(thresholds, thresholds[1:])):
            raise ValueError(f"signal thresholds must be strictly decreasing values in [0, 1], got {list(thresholds)}")
        if not 0 <= decision_position < routed_layers:
            raise ValueError(f"decision_position must index one of the {routed_layers} routed layers, "
                             f"got {decision_position}")
        self.num_kv_heads = num_kv_heads
        self.thresholds = thresholds
        self.choices = len(thresholds) + 1
        self.decision_position = decision_position
        self.floor_set: int | None = None  # the thresholds are the floor (a `HeadSetReport` reads these two)
        self.floor_confidence = 0.0
        self.last_decision: SetDecision | None = None
        self.register_buffer("head_sets", torch.zeros(self.choices, routed_layers, num_kv_heads))

    @torch.no_grad()
    def set_head_sets(self, head_sets: torch.Tensor) -> None:
        """Set the C head sets ([C, R, Hkv] bool, True = full attention): densest first, each no denser than the one
        before, all alike on the routed layers before the decision layer."""
        head_sets = self._checked_sets(head_sets)
        before = head_sets[:, : self.decision_position]
        if not bool((before == before[:1]).all()):
            raise ValueError(f"the head sets differ on the routed layers before the decision layer (position "
                             f"{self.decision_position}): those layers run before the signal is known")
        full = head_sets.sum(dim=(1, 2))
        if bool((full[1:] > full[:-1]).any()):
            raise ValueError(f"signal-router sets go from densest to sparsest; their full heads are {full.tolist()}")
        self.head_sets.copy_(head_sets.float())

    def prefix_decisions(self, position: int) -> torch.Tensor:
        """[Hkv] float32 decisions of a routed layer before the decision layer (the sets agree there)."""
        if position >= self.decision_position:
            raise ValueError(f"routed layer position {position} is decided by the signal, not before it")
        return self.head_sets[0, position]

    @torch.no_grad()
    def decide(self, signal: torch.Tensor) -> SetDecision:
        """The set each prompt runs, from its retrieval signal [N, Hkv] (the decision layer's)."""
        score = signal.float().amax(dim=1)
        thresholds = torch.tensor(self.thresholds, device=score.device)
        choice = (score[:, None] < thresholds[None, :]).sum(dim=1)
        one_hot = torch.nn.functional.one_hot(choice, self.choices).float()
        return SetDecision(choice=choice, probabilities=one_hot, preferred=choice, signal=score)

    def forward(self, signal: torch.Tensor) -> torch.Tensor:
        """[N, C] float32 one-hot choice per prompt (`decide`), its decision kept in ``last_decision``."""
        self.last_decision = self.decide(signal)
        return self.last_decision.probabilities
