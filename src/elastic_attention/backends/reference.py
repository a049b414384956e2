"""Reference backend: plain torch, CPU or GPU; the oracle for every faster backend.

Per sequence, it expands the block tables of a chunk of query blocks to a token mask (chunk x keys, never S x S for
long inputs), adds causality (and a model window), and runs masked softmax attention in float32 (float64 for float64
inputs) through torch's scaled_dot_product_attention (explicit scores for soft-capped logits and attention sinks).
Heads that share a block pattern (every head of a mode, for FA and SSA) share one token mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from elastic_attention.patterns import BlockTables, SequenceLayout, block_mask_from_tables

#: Upper bound on Hq x chunk-queries x keys mask entries materialized at once.
_MAX_SCORES_PER_CHUNK = 1 << 25


class ReferenceBackend:
    """Masked-softmax attention driven by block tables."""

    name = "reference"
    supports_softcap = True
    supports_sinks = True

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
        num_query_heads = query.shape[1]
        compute_dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
        output = torch.zeros_like(query)
        size = tables.block_size
        for n, (row, start, length, first_row, count) in enumerate(layout.spans()):
            if count == 0:
                continue
            keys = key[row, :, start : start + length].to(compute_dtype)
            values = value[row, :, start : start + length].to(compute_dtype)
            num_key_blocks = (length - 1) // size + 1
            block_mask = block_mask_from_tables(tables, n, num_key_blocks)
            patterns, head_pattern = torch.unique(block_mask, dim=0, return_inverse=True)
            first_block = int(tables.first_query_block[n])
            first_position = length - count
            key_positions = torch.arange(length, device=query.device)
            rows_per_chunk = max(1, _MAX_SCORES_PER_CHUNK // (num_query_heads * size * length))
            for chunk_start in range(0, block_mask.shape[1], rows_per_chunk):
                chunk_rows = patterns[:, chunk_start : chunk_start + rows_per_chunk]
                lo = max(first_position, (first_block + chunk_start) * size)
                hi = min(length, (first_block + chunk_start + chunk_rows.shape[1]) * size)
                query_positions = torch.arange(lo, hi, device=query.device)
                token_rows = (query_positions // size) - (first_block + chunk_start)
                allowed = chunk_rows[:, token_rows][..., key_positions // size]
                allowed &= key_positions[None, :] <= query_positions[:, None]
                if tables.window_tokens is not None:
                    allowed &= key_positions[None, :] > query_positions[:, None] - tables.window_tokens
                physical = slice(first_row + lo - first_position, first_row + hi - first_position)
                queries = query[row, :, physical].to(compute_dtype)
                mask = allowed[head_pattern]
                if softcap is None and sinks is None:
                    attended = F.scaled_dot_product_attention(
                        queries[None], keys[None], values[None], attn_mask=mask[None], scale=scale, enable_gqa=True,
                    )[0]
                else:
                    attended = _explicit_attention(queries, keys, values, mask, scale, softcap, sinks)
                output[row, :, physical] = attended.to(query.dtype)
        return output


def _explicit_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor,
                        scale: float, softcap: float | None, sinks: torch.Tensor | None) -> torch.Tensor:
    """Masked softmax attention from explicit scores, with a logit soft-cap and attention sinks where given.

    query [Hq, q, D], key/value [Hkv, k, D], allowed [Hq, q, k], sinks [Hq] -> [Hq, q, D].
    """
    group = query.shape[0] // key.shape[0]
    scores = torch.einsum("hqd,hkd->hqk", query, key.repeat_interleave(group, dim=0)) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:  # one more logit per head, with no value
        column = sinks.to(scores.dtype)[:, None, None].expand(-1, scores.shape[1], 1)
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,hkd->hqd", weights, value.repeat_interleave(group, dim=0))
