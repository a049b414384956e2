"""FlashAttention-4 backend: one block-sparse flash-attn-4 launch per layer at prefill (SM90 and newer).

The block tables go to the kernel as per-head "full block" lists (`BlockSparseTensorsTorch`); with ``causal=True``
the kernel masks the diagonal block at token level, so FA, SSA and XA heads of a layer run in one launch with no mask
function. Sequences are aligned to the start of their own batch row first (a no-op for an unpadded or right-padded
prefill batch).

Forward only, prefill only, bf16/fp16, block size 64 or 128, no logit soft-cap or model window: other calls
(decode steps, chunked prefill, inputs that need gradients, float32, other block sizes, soft-capped logits, a model
window on every layer) go to the fallback backend (``flex``), which computes the same attention; each reason
is logged once.
"""

from __future__ import annotations

import importlib.util
import logging

import torch

from elastic_attention.backends.sequences import AlignedSequences, fit_tables
from elastic_attention.errors import BackendUnavailableError
from elastic_attention.patterns import BlockTables, SequenceLayout

logger = logging.getLogger(__name__)

#: Block sizes (tokens) the SM90 kernel accepts as sparse blocks.
SUPPORTED_BLOCK_SIZES = (64, 128)


def fa4_available() -> tuple[bool, str]:
    """Whether flash-attn-4 can run here, and why not (checked without importing it)."""
    if not torch.cuda.is_available():
        return False, "it needs a CUDA GPU and none is visible"
    major, minor = torch.cuda.get_device_capability()
    if major < 9:
        return False, f"it needs compute capability 9.0 (Hopper) or newer; this GPU has {major}.{minor}"
    if importlib.util.find_spec("flash_attn") is None or importlib.util.find_spec("flash_attn.cute") is None:
        return False, "flash-attn-4 is not installed (pip install 'elastic-attention[hopper]')"
    return True, ""


class FA4Backend:
    """Hybrid prefill through flash-attn-4's block-sparse forward kernel."""

    name = "fa4"
    #: Through the fallback backend (flex), which has no attention sinks.
    supports_softcap = True
    supports_sinks = False

    def __init__(self, fallback=None) -> None:
        available, reason = fa4_available()
        if not available:
            raise BackendUnavailableError(f"backend 'fa4' cannot run: {reason}")
        from flash_attn.cute import flash_attn_func
        from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch

        self._attention = flash_attn_func
        self._tables_type = BlockSparseTensorsTorch
        self._fallback = fallback
        self._fallback_reasons_logged: set[str] = set()
        self._no_partial_blocks: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def _no_partial(self, num_query_blocks: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero "partial block" counts and indices (every listed block is attended whole), made once per shape."""
        key = (num_query_blocks, device)
        if key not in self._no_partial_blocks:
            self._no_partial_blocks[key] = (
                torch.zeros(1, 1, num_query_blocks, dtype=torch.int32, device=device),
                torch.zeros(1, 1, num_query_blocks, 1, dtype=torch.int32, device=device),
            )
        return self._no_partial_blocks[key]

    @property
    def fallback(self):
        if self._fallback is None:
            from elastic_attention.backends.flex import FlexBackend

            self._fallback = FlexBackend()
        return self._fallback

    @staticmethod
    def unhandled_reason(query, key, value, layout: SequenceLayout, tables: BlockTables) -> str | None:
        """Why the fa4 kernel does not compute this call (the fallback then does), or None when it does."""
        if not layout.is_prefill:
            return "queries that continue a cached past (decode steps, later prompt chunks)"
        if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
            return "inputs that need gradients (the kernel is forward-only)"
        if query.dtype not in (torch.float16, torch.bfloat16):
            return f"{query.dtype} inputs (the kernel takes bf16 or fp16)"
        if tables.block_size not in SUPPORTED_BLOCK_SIZES:
            return f"block size {tables.block_size} (the kernel takes {SUPPORTED_BLOCK_SIZES})"
        if tables.window_tokens is not None:
            return "a model window on every layer (the block tables here pass no token-level window)"
        return None

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
        if sinks is not None:
            raise BackendUnavailableError("the fa4 backend has no attention sinks; use backend='reference'")
        reason = self.unhandled_reason(query, key, value, layout, tables)
        if reason is None and softcap is not None:
            reason = "soft-capped logits (not wired to the kernel here)"
        if reason is not None:
            if reason not in self._fallback_reasons_logged:
                logger.info("elastic-attention: fa4 hands %s to %r", reason, self.fallback.name)
                self._fallback_reasons_logged.add(reason)
            return self.fallback.attend(query, key, value, layout, tables, scale, softcap)
        size = tables.block_size
        aligned = AlignedSequences.gather(query, key, value, layout, size)
        num_query_blocks = -(-aligned.query.shape[2] // size)
        num_key_blocks = -(-aligned.key.shape[2] // size)
        counts, index = fit_tables(tables, num_query_blocks, num_key_blocks)
        device = query.device
        no_partial_count, no_partial_index = self._no_partial(num_query_blocks, device)
        sparse_tables = self._tables_type(
            mask_block_cnt=no_partial_count,
            mask_block_idx=no_partial_index,
            full_block_cnt=counts.to(device=device, dtype=torch.int32),
            full_block_idx=index.to(device=device, dtype=torch.int32),
            block_size=(size, size),
        )
        attended, _ = self._attention(
            aligned.query.transpose(1, 2),
            aligned.key.transpose(1, 2),
            aligned.value.transpose(1, 2),
            softmax_scale=scale,
            causal=True,
            # The tables differ per query head, so query heads of a KV group must not be packed into one tile.
            pack_gqa=False,
            block_sparse_tensors=sparse_tables,
        )
        return aligned.scatter(attended.transpose(1, 2), query)
