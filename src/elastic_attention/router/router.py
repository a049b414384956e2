"""`AttentionRouter`: decides, per sequence and KV head, between retrieval (full) and sparse attention."""

from __future__ import annotations

import torch
from torch import nn

from elastic_attention.router.sampling import gumbel_noise, straight_through_decision

#: The state-dict name of a router's pinned heads (`AttentionRouter.pin_sparse`).
PINS = "pinned_sparse"


class AttentionRouter(nn.Module):
    """One router per layer, shared by the layer's KV heads.

    Pooled pre-RoPE key states go through a task MLP (Linear, SiLU, Linear) and a router MLP (Linear, SiLU, Linear,
    SiLU, Linear to 2 classes). Class 1 means full (retrieval) attention, class 0 sparse attention.

    With ``num_kv_heads`` (``router_standardize`` in the config), the pooled keys of KV head h are first mapped to
    ``(x - feature_mean[h]) / feature_scale[h]`` (buffers, set by `set_feature_statistics`) and a learned
    ``head_bias[h]`` is added to the logits: the MLPs then see what varies between inputs, and the bias carries
    what is fixed per head.

    Args:
        head_dim: D, the width of one key head.
        width: hidden width multiplier (hidden = width * D).
        num_kv_heads: Hkv for a standardizing router; ``None`` for the paper's router.
        classes: logits per head: 2 (sparse, full) for a per-head router; a `HeadSetRouter` gives one per head set.

    Every router type answers the same calls (`build_routers` places them): ``forward`` turns its layer's pooled
    keys into its output, `decisions` turns that output into the decisions of each routed layer it decides.
    """

    #: The head sets a router chooses among per prompt: None, this router decides each KV head.
    choices: int | None = None
    #: What the last eval-mode forward decided beyond its output (a `HeadSetRouter`'s `SetDecision`): none here.
    last_decision = None

    def __init__(self, head_dim: int, width: int = 4, num_kv_heads: int | None = None, classes: int = 2) -> None:
        super().__init__()
        hidden = width * head_dim
        self.head_dim = head_dim
        self.num_kv_heads = num_kv_heads
        if num_kv_heads is not None:
            self.register_buffer("feature_mean", torch.zeros(num_kv_heads, head_dim))
            self.register_buffer("feature_scale", torch.ones(num_kv_heads))
            self.head_bias = nn.Parameter(torch.zeros(num_kv_heads, classes))
        self.task_mlp = nn.Sequential(nn.Linear(head_dim, hidden), nn.SiLU(), nn.Linear(hidden, head_dim))
        self.router_mlp = nn.Sequential(
            nn.Linear(head_dim, hidden),
            nn.SiLU(),
            nn.Linear(hidden, head_dim),
            nn.SiLU(),
            nn.Linear(head_dim, classes),
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
        if self.num_kv_heads is not None:
            nn.init.zeros_(self.head_bias)

    @torch.no_grad()
    def set_full_probability(self, probability: float | torch.Tensor) -> None:
        """Bias the router so that, before any training, P(full) = ``probability`` for every input.

        Args:
            probability: one number for every head, or [Hkv] numbers, one per KV head (a standardizing router only:
                they go into ``head_bias``), each in (0, 1).

        The full-attention logit's bias becomes ``log(p / (1 - p))`` and every other bias zero; the initial weights
        make the rest of the logit close to zero, so the first decisions are full attention with probability about
        ``p``.
        """
        probability = torch.as_tensor(probability, dtype=torch.float64)
        if not bool(((probability > 0) & (probability < 1)).all()):
            raise ValueError(f"probability must be in (0, 1), got {probability.tolist()}")
        if probability.ndim and (self.num_kv_heads is None or probability.shape != (self.num_kv_heads,)):
            raise ValueError(f"per-head probabilities need a standardizing router (`router_standardize: true`) and one "
                             f"number per KV head ({self.num_kv_heads}), got shape {tuple(probability.shape)}")
        logit = torch.log(probability / (1 - probability))
        bias = self.router_mlp[-1].bias
        bias.zero_()
        if self.num_kv_heads is not None:
            self.head_bias.zero_()
        if probability.ndim:
            self.head_bias[:, 1] = logit.to(self.head_bias.dtype)
        else:
            bias[1] = float(logit)

    @torch.no_grad()
    def pin_sparse(self, heads: torch.Tensor | None) -> None:
        """Send the given KV heads to sparse attention for every input; the router chooses among the others only.

        A pinned head's decision is 0 whatever its logits, in training (no gradient reaches it) and at inference.
        The pins are the router's buffer ``pinned_sparse`` ([Hkv] bool), so its state dict, and an adapter saved
        from it, carries them; a router without pins has no such buffer (its state dict is unchanged).

        Args:
            heads: [Hkv] bool, True for the heads to pin (a standardizing router only: it knows Hkv); ``None`` or no
                True removes every pin.
        """
        heads = None if heads is None else torch.as_tensor(heads, dtype=torch.bool)
        if heads is not None and self.num_kv_heads is not None and heads.shape != (self.num_kv_heads,):
            raise ValueError(f"pinning heads needs one flag per KV head ({self.num_kv_heads}), got shape "
                             f"{tuple(heads.shape)}")
        if heads is None or not bool(heads.any()):
            self._buffers.pop(PINS, None)
            return
        if self.num_kv_heads is None:
            raise ValueError("pinning heads needs a standardizing router (`router_standardize: true`): it knows Hkv")
        self.register_buffer(PINS, heads.to(self.head_bias.device))

    def pinned_heads(self) -> torch.Tensor | None:
        """[Hkv] bool, the heads `pin_sparse` sends to sparse attention for every input, or ``None``."""
        return self._buffers.get(PINS)

    @torch.no_grad()
    def set_feature_statistics(self, pooled_keys: torch.Tensor) -> None:
        """Set the per-head centre and scale of a standardizing router from sample inputs.

        Args:
            pooled_keys: [M, Hkv, D] pooled keys of M sequences (M >= 2). The centre is their mean per head; the
                scale is the root mean square of the centred values per head (one number per head, so no single
                flat dimension is blown up).

        Raises:
            ValueError: the router does not standardize, or the samples have the wrong shape.
        """
        if self.num_kv_heads is None:
            raise ValueError("this router was built without num_kv_heads (router_standardize is off)")
        expected = (self.num_kv_heads, self.head_dim)
        if pooled_keys.ndim != 3 or tuple(pooled_keys.shape[1:]) != expected or pooled_keys.shape[0] < 2:
            raise ValueError(
                f"pooled_keys must be [M >= 2, {expected[0]}, {expected[1]}], got {list(pooled_keys.shape)}"
            )
        samples = pooled_keys.double()
        mean = samples.mean(dim=0)
        scale = (samples - mean).square().mean(dim=(0, 2)).sqrt().clamp(min=1e-6)
        self.feature_mean.copy_(mean)
        self.feature_scale.copy_(scale)

    def logits(self, pooled_keys: torch.Tensor) -> torch.Tensor:
        """Router logits.

        Args:
            pooled_keys: [N, Hkv, D] pooled key states.

        Returns:
            [N, Hkv, classes] float32 logits.
        """
        weight_dtype = self.router_mlp[0].weight.dtype
        if self.num_kv_heads is None:
            return self.router_mlp(self.task_mlp(pooled_keys.to(weight_dtype))).float()
        features = (pooled_keys.float() - self.feature_mean) / self.feature_scale[:, None]
        return self.router_mlp(self.task_mlp(features.to(weight_dtype))).float() + self.head_bias.float()

    def forward(self, pooled_keys: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Routing decisions.

        In training mode: hard Gumbel-softmax with a straight-through gradient at ``self.temperature``. In eval
        mode: the argmax, no noise.

        Args:
            pooled_keys: [N, Hkv, D].
            generator: random generator for the Gumbel noise (training only).

        Returns:
            [N, Hkv] float32, 1.0 where the head runs full (retrieval) attention and 0.0 where it runs sparse
            attention (always for a pinned head); differentiable through the straight-through estimator in
            training mode.
        """
        logits = self.logits(pooled_keys)
        if not self.training:
            decisions = (logits[..., 1] > logits[..., 0]).float()
        else:
            noise = gumbel_noise(logits.shape, device=logits.device, generator=generator)
            decisions = straight_through_decision(logits, self.temperature, noise, self.margin_limit)
        pinned = self.pinned_heads()
        return decisions if pinned is None else decisions.masked_fill(pinned, 0.0)

    def decisions(self, output: torch.Tensor, position: int) -> torch.Tensor:
        """[N, Hkv] float32 decisions of the ``position``-th routed layer from ``forward``'s ``output``: a per-head
        router decides its own layer only, and its output is that layer's decisions."""
        return output
