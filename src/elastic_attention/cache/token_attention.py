"""Attention of queries over keys at known logical positions under the token rule (`patterns.tokens`).

The attention of steps that continue a cached past: over the keys of a full cache, or over the entries a bounded
cache kept (whose slots need not be in position order). `token_attention` is the general form in plain torch: a
single query in half precision (a decode step) goes through torch's fused SDPA with a boolean mask, in its own dtype,
unless the logits are soft-capped or the model has attention sinks; everything else is computed in float32 (float64
for float64 inputs), queries in chunks so that no more than a bounded number of scores exists at once.

A prompt chunk over keys stored in position order has two fused forms, both torch SDPA in the inputs' dtype (flash
or memory-efficient kernels on a GPU): `causal_suffix_attention` for heads that keep every key, and
`streaming_suffix_attention` for SSA heads whose sink and window are complete.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from elastic_attention.patterns.tokens import token_rule_mask

#: Upper bound on scores (heads x queries x keys) materialized at once.
_MAX_SCORES_PER_CHUNK = 1 << 25
#: SDPA kernels for a single query: cuDNN builds an execution plan per key length, milliseconds of host time on
#: every decode step, so it is left out.
_SINGLE_QUERY_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def single_query_kernels():
    """A context in which torch's SDPA picks among the kernels suited to single queries (enter it once per layer:
    entering costs tens of microseconds of host time)."""
    return sdpa_kernel(_SINGLE_QUERY_BACKENDS)


def attend_single_query(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float,
                        visible: torch.Tensor | None = None) -> torch.Tensor:
    """One query per head of grouped heads over keys every head of a group may see, with torch's fused SDPA.

    The g query heads of a KV head become g query rows of one head (they share keys and visibility), so no GQA
    support is needed from the kernel. Call it inside `single_query_kernels`.

    Args:
        query: [H, g, 1, D].
        key, value: [H, S, D] (the key axis may be strided).
        visible: None (every key), or [S] / [H, S] bool.

    Returns:
        [H, g, 1, D]; a head that sees no key gets NaN (callers never ask for one).
    """
    mask = None
    if visible is not None:
        mask = (visible if visible.ndim == 2 else visible[None]).unsqueeze(1).unsqueeze(1)  # [H or 1, 1, 1, S]
    attended = F.scaled_dot_product_attention(query.transpose(1, 2), key[:, None], value[:, None], attn_mask=mask,
                                              scale=scale)
    return attended.transpose(1, 2)


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
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    window_tokens: int | None = None,
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
        softcap: None, or the logit soft-cap c (Gemma 2): scores become c * tanh(scores / c) before the mask.
        sinks: None, or [H, g] attention-sink logits (gpt-oss): one more logit per query head in the softmax's
            denominator, with no value.
        window_tokens: the model's sliding window on every layer (keys with q - k < W), None for none.

    Returns:
        [H, g, q, D] in the dtype of ``query``. A query with no visible key (impossible under the rule, whose own
        position is always kept) would get zeros.
    """
    heads, group, num_queries, _ = query.shape
    if num_queries == 1 and query.dtype in (torch.float16, torch.bfloat16) and softcap is None and sinks is None:
        allowed = token_rule_mask(query_positions, key_positions, streaming, sink_tokens, local_tokens,
                                  window_tokens)[:, 0]
        with single_query_kernels():
            attended = attend_single_query(query, key, value, scale, allowed)
        return attended.nan_to_num(0.0) * allowed.any(dim=-1)[:, None, None, None]
    compute = torch.float64 if query.dtype == torch.float64 else torch.float32
    keys, values = key.to(compute), value.to(compute)
    output = torch.zeros(query.shape, dtype=compute, device=query.device)
    chunk = max(1, _MAX_SCORES_PER_CHUNK // max(1, heads * group * key.shape[1]))
    for first in range(0, num_queries, chunk):
        rows = slice(first, first + chunk)
        allowed = token_rule_mask(query_positions[rows], key_positions, streaming, sink_tokens, local_tokens,
                                  window_tokens)
        scores = torch.einsum("hgqd,hsd->hgqs", query[:, :, rows].to(compute), keys) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        if sinks is not None:
            column = sinks.to(compute)[:, :, None, None].expand(-1, -1, scores.shape[2], 1)
            weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
        else:
            weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        output[:, :, rows] = torch.einsum("hgqs,hsd->hgqd", weights, values)
    return output.to(query.dtype)


def _grouped(states: torch.Tensor, group: int) -> torch.Tensor:
    """[H, S, D] -> [H, g, S, D], a view (the fused kernels take one key head per query head)."""
    return states[:, None].expand(-1, group, -1, -1)


def causal_suffix_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """Queries at the last n of L positions over all L keys, causal (lower-right aligned), with fused SDPA.

    Equals `token_attention` with query positions ``L - n .. L - 1``, key positions ``0 .. L - 1`` and no
    streaming head.

    Args:
        query: [H, g, n, D], the g query heads of each of H KV heads.
        key, value: [H, L, D] in position order, L >= n.

    Returns:
        [H, g, n, D] in the dtype of ``query``.
    """
    group, num_queries = query.shape[1], query.shape[2]
    length = key.shape[1]
    if num_queries > length:
        raise ValueError(f"{num_queries} queries cannot be the suffix of {length} keys")
    mask = causal_lower_right(num_queries, length)
    keys, values = _grouped(key, group).contiguous(), _grouped(value, group).contiguous()
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scale)


def streaming_suffix_attention(
    query: torch.Tensor,
    sink_key: torch.Tensor,
    sink_value: torch.Tensor,
    window_key: torch.Tensor,
    window_value: torch.Tensor,
    *,
    local_tokens: int,
    scale: float,
    block: int | None = None,
) -> torch.Tensor:
    """SSA queries of a prompt chunk over a complete sink and window, by the token rule, with fused SDPA.

    The n queries sit at positions ``p0 .. p0 + n - 1`` with ``p0 >= sink + local``; ``window_key`` holds positions
    ``p0 - local .. p0 + n - 1`` in order (the ``local`` kept before the chunk, then the chunk's own keys). A query
    at position p sees the sink and the window positions in ``(p - local, p]``, so query i sees window entries
    ``i + 1 .. i + local``. Queries go in blocks of ``block`` rows, each over the sink and the ``block + local - 1``
    window entries its rows can see, under one band mask shared by all blocks.

    Args:
        query: [H, g, n, D].
        sink_key, sink_value: [H, sink, D], positions ``0 .. sink - 1``.
        window_key, window_value: [H, local + n, D].
        local_tokens: the window size in tokens.
        block: query rows per SDPA call (default: ``local_tokens``, at most 2048 and at most n, which bounds the
            mask at 2048 x (sink + 2048 + local) entries).

    Returns:
        [H, g, n, D] in the dtype of ``query``; equals `token_attention` under the same rule.
    """
    group, num_queries = query.shape[1], query.shape[2]
    if window_key.shape[1] != local_tokens + num_queries:
        raise ValueError(
            f"window_key must hold local_tokens + n = {local_tokens + num_queries} entries, got {window_key.shape[1]}"
        )
    block = block or min(local_tokens, 2048, num_queries)
    sink = sink_key.shape[1]
    rows = torch.arange(block, device=query.device)[:, None]
    columns = torch.arange(block + local_tokens - 1, device=query.device)[None, :]
    band = (columns >= rows) & (columns <= rows + local_tokens - 1)  # [block, block + local - 1]
    mask = torch.cat([band.new_ones(block, sink), band], dim=1)
    output = torch.empty_like(query)
    for first in range(0, num_queries, block):
        count = min(block, num_queries - first)
        span = slice(first + 1, first + count + local_tokens)
        keys = torch.cat([_grouped(sink_key, group), _grouped(window_key[:, span], group)], dim=2)  # one copy
        values = torch.cat([_grouped(sink_value, group), _grouped(window_value[:, span], group)], dim=2)
        output[:, :, first : first + count] = F.scaled_dot_product_attention(
            query[:, :, first : first + count], keys, values, attn_mask=mask[:count, : sink + count + local_tokens - 1],
            scale=scale,
        )
    return output
