"""CPU backend: each head computes only the key blocks it attends, through torch's SDPA kernels.

Per sequence, the query heads are grouped by block pattern (all the heads of a mode share one for FA and SSA; XA
heads have their own selections). A pattern that is full causal attention runs as one causal SDPA call (torch's
CPU flash kernel skips the blocks above the diagonal); any other pattern (SSA, XA) runs per chunk of query blocks,
over the union of the key blocks that chunk attends (for SSA: the sink and the window), gathered and masked to the
pattern inside. Nothing of size S x S is built, and nothing outside the attended blocks is computed but the chunk's
slack. `backend="auto"` picks it on a CPU; the `reference` backend stays the oracle.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from elastic_attention.errors import BackendUnavailableError
from elastic_attention.patterns import BlockTables, SequenceLayout, block_mask_from_tables

#: Query tokens per chunk of a sparse pattern (rounded to whole blocks): small enough that the union of the key
#: blocks a chunk attends stays close to what its rows attend, large enough to amortise a call.
_CHUNK_TOKENS = 256


class CPUBlockBackend:
    """Block-sparse attention from block tables through SDPA calls over the attended blocks only."""

    name = "cpu"
    supports_softcap = False
    supports_sinks = False

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        layout: SequenceLayout,
        tables: BlockTables,
        scale: float,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if softcap is not None or sinks is not None:
            raise BackendUnavailableError(
                "the cpu backend's SDPA kernels have no logit soft-cap and no attention sinks; attach with "
                "backend='reference' (or 'flex') for a model that uses them"
            )
        output = torch.zeros_like(query)
        group = query.shape[1] // key.shape[1]
        size = tables.block_size
        for n, span in enumerate(layout.spans()):
            if span.query_count == 0:
                continue
            length, count = span.key_len, span.query_count
            num_key_blocks = (length - 1) // size + 1
            block_mask = block_mask_from_tables(tables, n, num_key_blocks)  # [Hq, R, Kb]
            patterns, head_pattern = torch.unique(block_mask, dim=0, return_inverse=True)
            first_block = int(tables.first_query_block[n])
            first_position = length - count
            rows_physical = slice(span.first_query_row, span.first_query_row + count)
            keys = key[span.row, :, span.key_start : span.key_start + length]
            values = value[span.row, :, span.key_start : span.key_start + length]
            for index, pattern in enumerate(patterns):
                heads = (head_pattern == index).nonzero().flatten()
                if heads.numel() == query.shape[1]:  # one pattern for every head: views, no copies
                    heads = slice(None)
                    queries = query[span.row : span.row + 1, :, rows_physical]
                    head_keys, head_values, gqa = keys[None], values[None], group > 1
                else:
                    queries = query[span.row, heads, rows_physical][None]  # [1, h, count, D]
                    head_keys, head_values, gqa = _head_states(heads, keys, values, group)
                window = tables.window_tokens
                if _is_causal(pattern, first_block) and (window is None or length <= window):
                    attended = _causal(queries, head_keys, head_values, scale, gqa)
                else:
                    attended = _sparse(queries, head_keys, head_values, pattern, first_block, first_position, size,
                                       scale, gqa, window)
                output[span.row, heads, rows_physical] = attended[0]
        return output


def _is_causal(pattern: torch.Tensor, first_block: int) -> bool:
    """Whether a [R, Kb] block pattern is exactly full causal attention for rows from ``first_block``."""
    rows = torch.arange(first_block, first_block + pattern.shape[0], device=pattern.device)[:, None]
    return bool(torch.equal(pattern, torch.arange(pattern.shape[1], device=pattern.device)[None, :] <= rows))


def _head_states(heads: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, group: int):
    """Keys and values [1, h_kv, L, D] for query heads ``heads`` (ascending) and whether they are shared by groups
    (``enable_gqa``): whole KV groups read their KV heads once; other sets get one copy per query head."""
    kv_heads = heads // group
    if heads.numel() % group == 0 and torch.equal(heads, (kv_heads.view(-1, group)[:, :1] * group
                                                          + torch.arange(group, device=heads.device)).flatten()):
        shared = kv_heads[::group]
        return keys[shared][None], values[shared][None], group > 1
    return keys[kv_heads][None], values[kv_heads][None], False


def _causal(queries, keys, values, scale: float, gqa: bool) -> torch.Tensor:
    """Causal attention of the last ``count`` positions over all keys ([1, h, count, D] x [1, h_kv, L, D]); 4D
    states keep torch's fused CPU kernel (3D ones fall back to the one that materializes every score)."""
    if queries.shape[2] == keys.shape[2]:
        return F.scaled_dot_product_attention(queries, keys, values, is_causal=True, scale=scale, enable_gqa=gqa)
    bias = causal_lower_right(queries.shape[2], keys.shape[2])
    return F.scaled_dot_product_attention(queries, keys, values, attn_mask=bias, scale=scale, enable_gqa=gqa)


def _sparse(queries, keys, values, pattern, first_block: int, first_position: int, size: int, scale: float,
            gqa: bool, window: int | None = None):
    """A non-causal pattern per chunk of query blocks, over the union of the key blocks each chunk attends
    ([1, h, count, D] x [1, h_kv, L, D]); ``window``: the model's sliding window on top, in tokens."""
    length = keys.shape[2]
    output = torch.empty_like(queries)
    rows_per_chunk = max(1, _CHUNK_TOKENS // size)
    device = pattern.device
    for chunk in range(0, pattern.shape[0], rows_per_chunk):
        rows = pattern[chunk : chunk + rows_per_chunk]  # [r, Kb]
        used = rows.any(dim=0).nonzero().flatten()  # key blocks attended by some row of the chunk
        key_positions = (used[:, None] * size + torch.arange(size, device=device)[None, :]).flatten()
        key_positions = key_positions[key_positions < length]
        lo = max(first_position, (first_block + chunk) * size)
        hi = min(length, (first_block + chunk + rows.shape[0]) * size)
        query_positions = torch.arange(lo, hi, device=device)
        allowed = rows[(query_positions // size) - (first_block + chunk)][:, key_positions // size]
        allowed &= key_positions[None, :] <= query_positions[:, None]
        if window is not None:
            allowed &= key_positions[None, :] > query_positions[:, None] - window
        local = slice(lo - first_position, hi - first_position)
        attended = F.scaled_dot_product_attention(
            queries[:, :, local], keys[:, :, key_positions], values[:, :, key_positions], attn_mask=allowed,
            scale=scale, enable_gqa=gqa,
        )
        # A query row with no attended key (impossible under the patterns here: the diagonal block is always
        # attended) would come out NaN; keep the zeros of the reference there.
        output[:, :, local] = attended.nan_to_num(0.0)
    return output
