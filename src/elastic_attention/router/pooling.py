"""Boundary pooling: the mean of a prompt's first and last tokens, per sequence."""

from __future__ import annotations

import torch

from elastic_attention.patterns import SequenceLayout


def boundary_pool(
    keys: torch.Tensor, layout: SequenceLayout, first: int, last: int
) -> torch.Tensor:
    """Mean over the first ``first`` and last ``last`` tokens of each sequence, each token counted once.

    A sequence shorter than ``first + last`` pools every token it has.

    Args:
        keys: [B, S, Hkv, D] key states of the prefill (pre-RoPE).
        layout: the sequences of the prefill (one per row when padded, several when packed).
        first: leading tokens pooled.
        last: trailing tokens pooled.

    Returns:
        [N, Hkv, D] in float32, one vector per sequence and KV head.
    """
    pooled = []
    for row, start, length, _, _ in layout.spans():
        tokens = keys[row, start : start + length]
        if length > first + last:  # slice before the float32 copy: only first + last tokens are converted
            tokens = torch.cat([tokens[:first], tokens[length - last :]])
        pooled.append(tokens.float().mean(dim=0))
    return torch.stack(pooled)
