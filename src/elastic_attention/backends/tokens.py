"""Attention of queries over keys at known logical positions under the token rule (`patterns.tokens`).

The attention of steps that continue a cached past: over the keys of a full cache, or over the entries a bounded
cache kept (whose slots need not be in position order). Plain torch. A single query in half precision (a decode
step) goes through torch's fused SDPA with a boolean mask, in its own dtype; everything else is computed in float32
(float64 for float64 inputs), queries in chunks so that no more than a bounded number of scores exists at once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from elastic_attention.patterns.tokens import token_rule_mask

#: Upper bound on scores (heads x queries x keys) materialized at once.
_MAX_SCORES_PER_CHUNK = 1 << 25


def token_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    streaming: torch.Tensor,
    *,
    sink_tokens: int,
    local_tokens: int,
    scale: float,
) -> torch.Tensor:
    """Masked softmax attention of grouped queries.

    Args:
        query: [H, g, q, D], the g query heads of each of H KV heads.
        key, value: [H, S, D].
        query_positions: [q] int64.
        key_positions: [S] or [H, S] int64; negative entries are empty slots.
        streaming: [H] bool, the KV heads on SSA.
        sink_tokens, local_tokens: the SSA sizes in tokens.
        scale: softmax scale.

    Returns:
        [H, g, q, D] in the dtype of ``query``. A query with no visible key (impossible under the rule, whose own
        position is always kept) would get zeros.
    """
    heads, group, num_queries, _ = query.shape
    if num_queries == 1 and query.dtype in (torch.float16, torch.bfloat16):
        allowed = token_rule_mask(query_positions, key_positions, streaming, sink_tokens, local_tokens)
        attended = F.scaled_dot_product_attention(
            query, key[:, None], value[:, None], attn_mask=allowed[:, None], scale=scale, enable_gqa=True
        )
        return attended * allowed.any(dim=-1)[:, None, :, None]
    compute = torch.float64 if query.dtype == torch.float64 else torch.float32
    keys, values = key.to(compute), value.to(compute)
    output = torch.zeros(query.shape, dtype=compute, device=query.device)
    chunk = max(1, _MAX_SCORES_PER_CHUNK // max(1, heads * group * key.shape[1]))
    for first in range(0, num_queries, chunk):
        rows = slice(first, first + chunk)
        allowed = token_rule_mask(query_positions[rows], key_positions, streaming, sink_tokens, local_tokens)
        scores = torch.einsum("hgqd,hsd->hgqs", query[:, :, rows].to(compute), keys) * scale
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        output[:, :, rows] = torch.einsum("hgqs,hsd->hgqd", weights, values)
    return output.to(query.dtype)
