"""`HybridAttention`: one layer's attention from its routing, without a bounded cache.

At a prefill the decisions become per-head modes, the modes become block tables (one `BlockTableBuilder` per
forward serves every layer) and the backend attends them; in training every head computes both its retrieval and
its sparse output and the straight-through decision mixes them, which is what gives the routers a gradient. A step
that continues a cached past (Hugging Face's own cache) attends every cached key by the token rule of
`patterns.tokens`. Each prefill records the effective sparsity it bought, per layer and sequence.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from elastic_attention.backends import AttentionBackend
from elastic_attention.cache.token_attention import token_attention
from elastic_attention.config import ElasticConfig
from elastic_attention.patterns import FULL, MODE_CODES, BlockTableBuilder, SequenceLayout, causal_pairs
from elastic_attention.router import is_retrieval


class HybridAttention:
    """Block-table attention through a backend, and the sparsity it bought.

    Args:
        config: the attached configuration (modes, pattern sizes).
        backend: computes attention from block tables.
        softcap: the model's attention-logit soft-cap (Gemma 2), None for none.
        window_tokens: the model's sliding window on every layer (Mistral 7B v0.1), composed with every pattern;
            None for none.

    Attributes:
        sparsity: layer index -> [N] float32 ESR of that layer in the last prefill (mean over query heads of
            1 - attended causal pairs / causal pairs).
    """

    def __init__(self, config: ElasticConfig, backend: AttentionBackend, softcap: float | None = None,
                 window_tokens: int | None = None) -> None:
        self.config = config
        self.backend = backend
        self.softcap = softcap
        self.window_tokens = window_tokens
        self.sparsity: dict[int, torch.Tensor] = {}
        self._builder: BlockTableBuilder | None = None
        self._causal_pairs: tuple[SequenceLayout, torch.Tensor] | None = None

    def begin_prefill(self) -> None:
        """Forget the previous prompt's sparsity."""
        self.sparsity = {}

    def prefill(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        layout: SequenceLayout,
        z: torch.Tensor | None,
        layer_index: int,
        scale: float,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of a prefill: query [B, Hq, S, D], key/value [B, Hkv, S, D] -> [B, Hq, S, D].

        ``z``: [N, Hkv] decisions of the layer (1.0 = retrieval), or None for a layer without a router (every head
        full). ``sinks``: [Hq] the layer's attention-sink logits (models with sinks), else None.
        """
        if z is None:
            modes = torch.full((layout.num_sequences, key.shape[1]), FULL, dtype=torch.long, device=query.device)
            return self._attend(query, key, value, layout, modes, scale, layer_index, sinks)
        retrieval = MODE_CODES[self.config.retrieval_mode]
        sparse = MODE_CODES[self.config.sparse_mode]
        chosen = torch.where(is_retrieval(z), retrieval, sparse).long()
        if not (z.requires_grad and torch.is_grad_enabled()):
            return self._attend(query, key, value, layout, chosen, scale, layer_index, sinks)
        tables_retrieval, pairs_retrieval = self._tables(layout, torch.full_like(chosen, retrieval), query, key, scale)
        tables_sparse, pairs_sparse = self._tables(layout, torch.full_like(chosen, sparse), query, key, scale)
        group = query.shape[1] // key.shape[1]
        retrieval_heads = (chosen == retrieval).repeat_interleave(group, dim=1).to(pairs_retrieval.device)
        self._record_sparsity(layout, layer_index, torch.where(retrieval_heads, pairs_retrieval, pairs_sparse))
        out_retrieval = self.backend.attend(query, key, value, layout, tables_retrieval, scale, self.softcap, sinks)
        out_sparse = self.backend.attend(query, key, value, layout, tables_sparse, scale, self.softcap, sinks)
        weight = _per_row_weight(z, query, layout)
        return weight * out_retrieval + (1.0 - weight) * out_sparse

    def continue_tokens(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        layout: SequenceLayout,
        streaming_heads: Callable[[int], torch.Tensor],
        scale: float,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A step that continues a cached past, over every cached key, by the token rule (`patterns.tokens`).

        Args:
            query: [B, Hq, S_q, D] the step's queries.
            key, value: [B, Hkv, S_k, D] every cached key and value, the step's included.
            layout: the sequences of this forward.
            streaming_heads: sequence index -> [Hkv] bool, the heads that run SSA.
            scale: softmax scale.
            sinks: [Hq] the layer's attention-sink logits, or None.

        Returns:
            [B, Hq, S_q, D].
        """
        num_kv, group = key.shape[1], query.shape[1] // key.shape[1]
        output = torch.zeros_like(query)
        for n, span in enumerate(layout.spans()):
            if span.query_count == 0:
                continue
            row, start, length, first_row, count = span
            attended = token_attention(
                query[row, :, first_row : first_row + count].unflatten(0, (num_kv, group)),
                key[row, :, start : start + length],
                value[row, :, start : start + length],
                torch.arange(length - count, length, device=query.device),
                torch.arange(length, device=query.device),
                streaming_heads(n).to(query.device),
                sink_tokens=self.config.sink_tokens,
                local_tokens=self.config.local_tokens,
                scale=scale,
                softcap=self.softcap,
                sinks=None if sinks is None else sinks.view(num_kv, group),
                window_tokens=self.window_tokens,
            )
            output[row, :, first_row : first_row + count] = attended.flatten(0, 1)
        return output

    def _tables(self, layout: SequenceLayout, modes: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                scale: float):
        """(block tables, attended pairs per head) of one layer; the forward's patterns are built once."""
        if self._builder is None or self._builder.layout is not layout:
            self._builder = BlockTableBuilder(layout, self.config, query.device, self.window_tokens)
        return self._builder.build(modes, query.shape[1], query=query, key=key, scale=scale)

    def _attend(self, query, key, value, layout: SequenceLayout, modes, scale, layer_index: int,
                sinks: torch.Tensor | None) -> torch.Tensor:
        tables, pairs = self._tables(layout, modes, query, key, scale)
        self._record_sparsity(layout, layer_index, pairs)
        return self.backend.attend(query, key, value, layout, tables, scale, self.softcap, sinks)

    def _record_sparsity(self, layout: SequenceLayout, layer_index: int, attended: torch.Tensor) -> None:
        """ESR of a layer per sequence from attended causal pairs per head [N, Hq]."""
        if self._causal_pairs is None or self._causal_pairs[0] is not layout:
            self._causal_pairs = (layout, causal_pairs(layout).to(attended.device).double())
        sparsity = 1.0 - attended.double() / self._causal_pairs[1][:, None]
        self.sparsity[layer_index] = sparsity.mean(dim=1).float()


def _per_row_weight(z: torch.Tensor, query: torch.Tensor, layout: SequenceLayout) -> torch.Tensor:
    """[N, Hkv] decisions spread to [B, Hq, S_q, 1] over each sequence's query rows."""
    batch, num_query_heads, query_len, _ = query.shape
    group = num_query_heads // z.shape[1]
    per_head = z.repeat_interleave(group, dim=1).to(query.dtype)
    weight = query.new_zeros(batch, num_query_heads, query_len, 1)
    for n, span in enumerate(layout.spans()):
        weight[span.row, :, span.first_query_row : span.first_query_row + span.query_count] = per_head[n][:, None, None]
    return weight
