"""`HeadSetRouter`: one decision per prompt, which of a few fixed head sets runs full attention.

The paper's routers decide every KV head on its own. A head-set router decides once per prompt, in the first routed
layer, among C head sets ([C, routed layers, Hkv], True = full attention) that come with it: typically points of a
greedy search's path (`head_sets.HeadSets`), nested, from "the searched set" to "every head sparse". A prompt that
needs the searched heads keeps them all, in the order the search ranked them; one that needs none drops them all.
What it cannot do is drop a head the search ranked above one it keeps, which a per-head router trained on few steps
does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from elastic_attention.router.router import AttentionRouter
from elastic_attention.router.sampling import gumbel_noise, straight_through_one_hot


def set_msrs(head_sets: torch.Tensor) -> torch.Tensor:
    """[C] float64: the MSR of each of the sets [C, routed layers, Hkv] (1 = full attention), the share of its
    (routed layer, KV head) entries on sparse attention."""
    return 1.0 - head_sets.double().mean(dim=(1, 2))


@dataclass(frozen=True)
class SetDecision:
    """What a `HeadSetRouter` decided for each of N prompts at inference.

    Attributes:
        choice: [N] int64, the set each prompt runs.
        probabilities: [N, C] float32, the router's probabilities over the sets.
        preferred: [N] int64, the most probable set (``choice`` unless the safety floor acted).
        signal: with a `SignalSetRouter`, [N] float32 the retrieval signal each prompt was routed by (its
            ``probabilities`` are then the one-hot choice); None for a `HeadSetRouter`.
    """

    choice: torch.Tensor
    probabilities: torch.Tensor
    preferred: torch.Tensor
    signal: torch.Tensor | None = None

    @property
    def floor_acted(self) -> torch.Tensor:
        """[N] bool: the safety floor replaced the most probable set."""
        return self.choice != self.preferred


class ChoosesHeadSets:
    """What a router that runs one of C head sets per prompt shares (`HeadSetRouter`, `SignalSetRouter`): its
    ``head_sets`` buffer [C, R, Hkv] (1.0 = full attention), their MSRs, the decisions a choice gives, no pins."""

    head_sets: torch.Tensor

    def _checked_sets(self, head_sets: torch.Tensor) -> torch.Tensor:
        """``head_sets`` as bool, after checking it has the buffer's shape."""
        if tuple(head_sets.shape) != tuple(self.head_sets.shape):
            raise ValueError(f"head sets must be {list(self.head_sets.shape)} ([choices, routed layers, KV heads]), "
                             f"got {list(head_sets.shape)}")
        return head_sets.to(torch.bool)

    def pin_sparse(self, heads: torch.Tensor | None) -> None:
        """Refuse pins (`AttentionRouter.pin_sparse`): the sets alone say which heads can be full."""
        if heads is not None and bool(torch.as_tensor(heads).any()):
            raise ValueError("a router choosing among head sets takes no pins: a head outside every set is never full")

    def set_msrs(self) -> torch.Tensor:
        """[C] float64: each set's MSR, the share of its (routed layer, KV head) entries on sparse attention."""
        return set_msrs(self.head_sets)

    def decisions(self, choice: torch.Tensor, position: int) -> torch.Tensor:
        """[N, Hkv] float32 decisions of the ``position``-th routed layer (1.0 = full attention) under ``choice``
        ([N, C], from ``forward``): the chosen set's heads, with the choice's gradient."""
        return choice @ self.head_sets[:, position]


class HeadSetRouter(ChoosesHeadSets, AttentionRouter):
    """The network of `AttentionRouter` with one logit per head set: the pooled keys of each KV head of the first
    routed layer give C logits, averaged over the heads into the prompt's logits.

    A safety floor (``floor_set``, ``floor_confidence``) keeps a prompt the router is unsure of off the sets sparser
    than the floor set: when the most probable set is sparser than the floor set and its probability is below
    ``floor_confidence``, the prompt runs the most probable set among those no sparser than the floor set.

    Args:
        head_dim: D.
        width: hidden width multiplier.
        num_kv_heads: Hkv of the model.
        choices: C, the head sets to choose among (at least 2).
        routed_layers: R, the layers the sets cover.
        standardize: centre and scale the pooled keys per KV head (as ``router_standardize``).
        floor_set: index of the safety floor's set, or None (no floor).
        floor_confidence: the probability under which the floor acts, in [0, 1].

    Buffers:
        head_sets: [C, R, Hkv] float32, 1.0 where a set runs full attention (`set_head_sets`); saved with the
            router, so an adapter carries its sets.
    """

    def __init__(self, head_dim: int, width: int, num_kv_heads: int, choices: int, routed_layers: int,
                 standardize: bool = False, floor_set: int | None = None, floor_confidence: float = 0.0) -> None:
        if choices < 2:
            raise ValueError(f"a head-set router chooses among at least 2 sets, got {choices}")
        if floor_set is not None and not 0 <= floor_set < choices:
            raise ValueError(f"floor_set must index one of the {choices} sets, got {floor_set}")
        super().__init__(head_dim, width, num_kv_heads if standardize else None, classes=choices)
        self.choices = choices
        self.floor_set = floor_set
        self.floor_confidence = float(floor_confidence)
        self.last_decision: SetDecision | None = None
        self.register_buffer("head_sets", torch.zeros(choices, routed_layers, num_kv_heads))

    @torch.no_grad()
    def set_head_sets(self, head_sets: torch.Tensor) -> None:
        """Set the C head sets ([C, R, Hkv] bool, True = full attention)."""
        self.head_sets.copy_(self._checked_sets(head_sets).float())

    @torch.no_grad()
    def set_full_probability(self, probability: float | torch.Tensor) -> None:
        """Bias the router so that, before any training, the set with the most full heads is chosen with
        ``probability`` and each other set with an equal share of the rest."""
        probability = float(probability)
        if not 0 < probability < 1:
            raise ValueError(f"probability must be in (0, 1), got {probability}")
        fullest = int(self.head_sets.sum(dim=(1, 2)).argmax())
        bias = torch.full((self.choices,), math.log((1 - probability) / (self.choices - 1)))
        bias[fullest] = math.log(probability)
        self.router_mlp[-1].bias.copy_(bias)
        if self.num_kv_heads is not None:
            self.head_bias.zero_()

    def choice_logits(self, pooled_keys: torch.Tensor) -> torch.Tensor:
        """[N, C] float32: each prompt's logits over the sets, from its pooled keys [N, Hkv, D]."""
        return self.logits(pooled_keys).mean(dim=1)

    def forward(self, pooled_keys: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The chosen set per prompt.

        In training mode: a hard Gumbel-softmax choice with a straight-through gradient at ``self.temperature``; in
        eval mode: `decide`'s choice (the argmax, no noise, under the safety floor), its `SetDecision` kept in
        ``last_decision``.

        Args:
            pooled_keys: [N, Hkv, D] the first routed layer's pooled keys.
            generator: random generator for the Gumbel noise (training only).

        Returns:
            [N, C] float32 one-hot choices (differentiable through the straight-through estimator in training).
        """
        if not self.training:
            self.last_decision = self.decide(pooled_keys)
            return torch.nn.functional.one_hot(self.last_decision.choice, self.choices).float()
        logits = self.choice_logits(pooled_keys)
        noise = gumbel_noise(logits.shape, device=logits.device, generator=generator)
        return straight_through_one_hot(logits, self.temperature, noise)

    @torch.no_grad()
    def decide(self, pooled_keys: torch.Tensor) -> SetDecision:
        """The inference decision for prompts with pooled keys [N, Hkv, D]: the most probable set, or, where the
        safety floor acts, the most probable set no sparser than the floor set."""
        probabilities = torch.softmax(self.choice_logits(pooled_keys).float(), dim=-1)
        preferred = probabilities.argmax(dim=-1)
        choice = preferred
        if self.floor_set is not None and self.floor_confidence > 0:
            msrs = self.set_msrs().to(probabilities.device)
            allowed = msrs <= msrs[self.floor_set] + 1e-9  # [C] sets no sparser than the floor set
            unsure = probabilities.gather(1, preferred[:, None])[:, 0] < self.floor_confidence
            fallback = probabilities.masked_fill(~allowed, -1.0).argmax(dim=-1)
            choice = torch.where(unsure & ~allowed[preferred], fallback, preferred)
        return SetDecision(choice=choice, probabilities=probabilities, preferred=preferred)
