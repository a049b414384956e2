"""The token rule of steps that continue a cached past (decode steps and later prompt chunks).

A prefill attends by the block rules of `block_tables`. A query whose sequence already has cached keys follows a
token-exact rule instead, the one a bounded cache can serve:

- full (and XA) heads: every key at a logical position <= the query's position;
- SSA heads: the keys at positions < ``sink_tokens`` and the last ``local_tokens`` positions up to the query's own
  (positions p - local_tokens + 1 .. p for a query at p);
- with a model window of W tokens on every layer, only keys at positions > p - W, for every head.
"""

from __future__ import annotations

import torch


def token_rule_mask(
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    streaming: torch.Tensor,
    sink_tokens: int,
    local_tokens: int,
    window_tokens: int | None = None,
) -> torch.Tensor:
    """Which keys each query of each head attends.

    Args:
        query_positions: [q] int64 logical positions of the queries.
        key_positions: [S] or [H, S] int64 logical positions of the keys; negative entries are empty slots.
        streaming: [H] bool, the heads on SSA.
        sink_tokens, local_tokens: the SSA sizes in tokens.
        window_tokens: the model's sliding window on every layer, None for none.

    Returns:
        [H, q, S] bool.
    """
    keys = key_positions if key_positions.ndim == 2 else key_positions[None, :]
    keys = keys[:, None, :]
    queries = query_positions[None, :, None]
    causal = (keys >= 0) & (keys <= queries)
    if window_tokens is not None:
        causal &= keys > queries - window_tokens
    window = (keys < sink_tokens) | (keys > queries - local_tokens)
    return causal & (window | ~streaming[:, None, None])
