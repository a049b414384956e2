"""Straight-through hard Gumbel-softmax: over a router's two classes, or over the head sets a `HeadSetRouter`
chooses among."""

from __future__ import annotations

import torch


def is_retrieval(z: torch.Tensor) -> torch.Tensor:
    """[...] bool, True where a decision z (1.0 retrieval / full attention, 0.0 sparse) routes to retrieval; the one
    place that reads decisions as classes."""
    return z.detach() > 0.5


def gumbel_noise(shape: torch.Size, *, device: torch.device, generator: torch.Generator | None = None) -> torch.Tensor:
    """Standard Gumbel(0, 1) samples in float32."""
    uniform = torch.rand(shape, device=device, generator=generator, dtype=torch.float32)
    tiny = torch.finfo(torch.float32).tiny
    exponential = -torch.log(uniform.clamp(min=tiny))
    return -torch.log(exponential.clamp(min=tiny))


def straight_through_decision(
    logits: torch.Tensor, temperature: float, noise: torch.Tensor | None = None, margin_limit: float | None = None
) -> torch.Tensor:
    """Hard decision forward, softmax gradient backward.

    Args:
        logits: [..., 2] router logits; class 1 means full attention.
        temperature: softmax temperature; it scales the gradient only (the forward is a hard argmax).
        noise: [..., 2] Gumbel noise added to the logits, or None for a noiseless decision.
        margin_limit: if set, the margin ``logits[..., 1] - logits[..., 0]`` is clamped to ``[-limit, limit]`` in
            the forward pass (the sample and the softmax) and passed through unchanged in the backward pass. A
            saturated router then still flips a head now and then (probability at least ``sigmoid(-limit)`` under
            the noise) and keeps a gradient of at least ``sigmoid'(limit) / temperature``; without the limit, Adam's
            normalised steps keep growing margins whose softmax gradient has vanished, and the decisions freeze.

    Returns:
        [...] float, exactly 1.0 (full attention) or 0.0 (sparse) in the forward pass, whose gradient is that of
        softmax((logits + noise) / temperature)[..., 1] (with the clamped margin when ``margin_limit`` is set).
    """
    logits = logits.float()
    if margin_limit is not None:
        margin = logits[..., 1] - logits[..., 0]
        clamped = margin + (margin.clamp(-margin_limit, margin_limit) - margin).detach()
        logits = torch.stack([torch.zeros_like(clamped), clamped], dim=-1)
    perturbed = logits if noise is None else logits + noise
    soft = torch.softmax(perturbed / temperature, dim=-1)[..., 1]
    hard = (perturbed[..., 1] > perturbed[..., 0]).to(soft.dtype)
    return hard + (soft - soft.detach())


def straight_through_one_hot(logits: torch.Tensor, temperature: float,
                             noise: torch.Tensor | None = None) -> torch.Tensor:
    """Hard one-hot choice forward, softmax gradient backward, over the last axis.

    Args:
        logits: [..., C] float logits of C choices.
        temperature: softmax temperature; it scales the gradient only (the forward is a hard argmax).
        noise: [..., C] Gumbel noise added to the logits, or None for a noiseless choice.

    Returns:
        [..., C] float32, exactly one-hot at the argmax of ``logits + noise`` in the forward pass, whose gradient is
        that of softmax((logits + noise) / temperature).
    """
    perturbed = logits.float() if noise is None else logits.float() + noise
    soft = torch.softmax(perturbed / temperature, dim=-1)
    hard = torch.nn.functional.one_hot(perturbed.argmax(dim=-1), perturbed.shape[-1]).to(soft.dtype)
    return hard + (soft - soft.detach())
