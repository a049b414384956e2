"""The retrieval signal: how much of a prompt's attention reaches where streaming attention cannot see.

For one layer and KV head: the softmax mass that the prompt's last few queries put on key blocks outside SSA's view
of their own block (past the sink blocks and before the local window of blocks, the block rule of
`patterns.block_tables`), averaged (or the largest) over those queries and the query heads of the KV head's group. A prompt whose
question must be answered from far back in its context puts mass there; one answered from its recent tokens does not.
It costs one [queries, keys] score matrix per head, computed from the layer's own queries and keys at prefill. The
softmax is the plain scaled one: a model's logit soft-cap or attention-sink logits (Gemma 2, gpt-oss) are not applied.
"""

from __future__ import annotations

import torch

from elastic_attention.patterns import SequenceLayout


#: How a KV head's signal summarizes the hidden mass of its query heads and measured queries: their ``mean``, or their
#: ``max`` (the one query that reaches furthest: a retrieval that few queries make is not averaged away).
STATISTICS = ("mean", "max")


def retrieval_signal(query: torch.Tensor, key: torch.Tensor, layout: SequenceLayout, scale: float, *, queries: int,
                     block_size: int, sink_tokens: int, local_tokens: int, statistic: str = "mean",
                     prompt_lengths: list[int] | None = None) -> torch.Tensor:
    """[N, Hkv] float32: each sequence's retrieval signal per KV head, in [0, 1].

    Args:
        query: [B, Hq, S, D] a prefill's queries (after the model's position encoding).
        key: [B, Hkv, S, D] its keys.
        layout: the prefill's sequences (padded or packed).
        scale: the softmax scale.
        queries: how many of each prompt's last queries are measured (all of a shorter prompt's).
        block_size, sink_tokens, local_tokens: SSA's pattern (tokens; sink and local multiples of the block).
        statistic: `STATISTICS`: the mean or the max of the hidden mass over the group's query heads and the queries.
        prompt_lengths: per sequence, how many of its first tokens are the prompt (the rest, a training target, is
            not measured); None: every token.

    Returns:
        [N, Hkv] float32; 0 for a prompt that fits in its sink and window (nothing is hidden from it).
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
    heads, kv_heads = query.shape[1], key.shape[1]
    group = heads // kv_heads
    sink_blocks, local_blocks = sink_tokens // block_size, local_tokens // block_size
    signals = []
    for n, span in enumerate(layout.spans()):
        length = span.key_len if prompt_lengths is None else min(span.key_len, int(prompt_lengths[n]))
        first = max(0, length - queries)
        if span.query_count != span.key_len:
            raise ValueError("the retrieval signal is measured at a prefill (every key of a sequence has its query)")
        q = query[span.row, :, span.first_query_row + first : span.first_query_row + length].float()
        k = key[span.row, :, span.key_start : span.key_start + length].float().repeat_interleave(group, dim=0)
        scores = torch.einsum("hqd,hkd->hqk", q, k) * scale
        query_position = torch.arange(first, length, device=query.device)[:, None]
        key_position = torch.arange(length, device=query.device)[None, :]
        weights = torch.softmax(scores.masked_fill(key_position > query_position, float("-inf")), dim=-1)
        query_block, key_block = query_position // block_size, key_position // block_size
        hidden = (key_block >= sink_blocks) & (key_block <= query_block - local_blocks)
        mass = (weights * hidden).sum(dim=-1).view(kv_heads, -1)  # [Hkv, group * measured queries]
        signals.append(mass.mean(dim=-1) if statistic == "mean" else mass.amax(dim=-1))
    return torch.stack(signals).float()
