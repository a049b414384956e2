"""`AttentionRouter`: decides, per sequence and KV head, between retrieval (full) and sparse attention."""

from __future__ import annotations

import torch
from torch import nn

from elastic_attention.router.sampling import gumbel_noise, straight_through_decision


class AttentionRouter(nn.Module):
    """One router per layer, shared by the layer's KV heads.

    Pooled pre-RoPE key states go through a task MLP (Linear, SiLU, Linear) and a router MLP (Linear, SiLU, Linear,
    SiLU, Linear to 2 classes). Class 1 means full (retrieval) attention, class 0 sparse attention.

    Args:
        head_dim: D, the width of one key head.
        width: hidden width multiplier (hidden = width * D).
    """

    def __init__(self, head_dim: int, width: int = 4) -> None:
        super().__init__()
        hidden = width * head_dim
        self.head_dim = head_dim
        self.task_mlp = nn.Sequential(nn.Linear(head_dim, hidden), nn.SiLU(), nn.Linear(hidden, head_dim))
        self.router_mlp = nn.Sequential(
            nn.Linear(head_dim, hidden),
            nn.SiLU(),
            nn.Linear(hidden, head_dim),
            nn.SiLU(),
            nn.Linear(head_dim, 2),
        )
        self.temperature = 1.0
        self.margin_limit: float | None = None  # training only, see `straight_through_decision`
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """N(0, 0.02) weights and zero biases: initial decisions are close to a coin flip."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def logits(self, pooled_keys: torch.Tensor) -> torch.Tensor:
        """Router logits.

        Args:
            pooled_keys: [N, Hkv, D] pooled key states.

        Returns:
            [N, Hkv, 2] float32 logits.
        """
        weight_dtype = self.router_mlp[0].weight.dtype
        return self.router_mlp(self.task_mlp(pooled_keys.to(weight_dtype))).float()

    def forward(self, pooled_keys: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Routing decisions.

        In training mode: hard Gumbel-softmax with a straight-through gradient at ``self.temperature``. In eval
        mode: the argmax, no noise.

        Args:
            pooled_keys: [N, Hkv, D].
            generator: random generator for the Gumbel noise (training only).

        Returns:
            [N, Hkv] float32, 1.0 where the head runs full (retrieval) attention and 0.0 where it runs sparse
            attention; differentiable through the straight-through estimator in training mode.
        """
        logits = self.logits(pooled_keys)
        if not self.training:
            return (logits[..., 1] > logits[..., 0]).float()
        noise = gumbel_noise(logits.shape, device=logits.device, generator=generator)
        return straight_through_decision(logits, self.temperature, noise, self.margin_limit)
