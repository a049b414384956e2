"""The interface every attention backend implements."""

from __future__ import annotations

from typing import Protocol

import torch

from elastic_attention.patterns import BlockTables, SequenceLayout


class AttentionBackend(Protocol):
    """Computes one hybrid attention layer from block tables.

    A backend knows nothing of routing, training or models: it receives the states, where the sequences are, and
    which key blocks each query block attends.
    """

    name: str
    #: Whether ``attend`` implements a logit soft-cap, and learned attention sinks.
    supports_softcap: bool
    supports_sinks: bool

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
        """Hybrid attention.

        Args:
            query: [B, Hq, S_q, D].
            key: [B, Hkv, S_kv, D], not repeated for GQA (query head h reads KV head h // (Hq // Hkv)).
            value: [B, Hkv, S_kv, D].
            layout: where each sequence lives on the key axis.
            tables: attended key blocks per (sequence, query head, query block).
            scale: softmax scale applied to q.k.
            softcap: None, or the logit soft-cap c (Gemma 2): scores become c * tanh(scale q.k / c) before the
                mask and the softmax. A backend whose ``supports_softcap`` is False raises
                `BackendUnavailableError` when given one.
            sinks: None, or [Hq] learned attention-sink logits (gpt-oss): one more logit per query head in every
                softmax's denominator, with no value (so a row's weights sum to less than 1). Refused likewise by a
                backend whose ``supports_sinks`` is False (only ``reference`` has them).

        Returns:
            [B, Hq, S_q, D] in the dtype of ``query``; rows that belong to no sequence (padding) are zero.
        """
        ...
