"""Block tables: for each (sequence, query head, query block), the key blocks it attends.

This is the one representation of a routed layer that every backend consumes. It is built from block-level rules
(full, SSA) or a block-level selection (XA) and never allocates anything of size S x S. Inside an attended block the
rule is always causal at token level (key position <= query position).

SSA at block granularity: query block b sees key blocks [0, sink_blocks) and (b - local_blocks, b].

A model that applies a sliding window of W tokens on every layer (``window_tokens``) composes it with every pattern
at token level: a key at position k is visible to a query at q only if q - k < W. The tables then leave out the
key blocks wholly outside the window, and carry W so that each backend masks the blocks the window's edge cuts.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from elastic_attention.config import ElasticConfig
from elastic_attention.errors import InputError
from elastic_attention.patterns.layout import SequenceLayout
from elastic_attention.patterns.xattention import xattention_block_mask

#: Integer codes of attention modes in head-mode tensors.
FULL, SSA, XA = 0, 1, 2
MODE_CODES = {"full": FULL, "ssa": SSA, "xa": XA}


class BlockTables(NamedTuple):
    """Key blocks attended per (sequence, query head, query block).

    Attributes:
        kv_block_count: [N, Hq, R] int32, number of key blocks attended by row r.
        kv_block_index: [N, Hq, R, K] int32, the attended key blocks in ascending order; entries at positions
            >= the count are -1.
        first_query_block: [N] int64, logical block index of row 0 of sequence n (0 at prefill).
        num_rows: [N] int64, rows of sequence n that hold queries of this forward (rows beyond are empty).
        block_size: tokens per block.
        window_tokens: the model's sliding window W on top of the patterns (keys with q - k < W), None for none.
    """

    kv_block_count: torch.Tensor
    kv_block_index: torch.Tensor
    first_query_block: torch.Tensor
    num_rows: torch.Tensor
    block_size: int
    window_tokens: int | None = None


def causal_block_mask(query_blocks: torch.Tensor, num_key_blocks: int) -> torch.Tensor:
    """Full causal attention at block level.

    Args:
        query_blocks: [R] int64 logical query block indices.
        num_key_blocks: Kb, number of key blocks of the sequence.

    Returns:
        [R, Kb] bool, True where key block kb <= query block.
    """
    key_blocks = torch.arange(num_key_blocks, device=query_blocks.device)
    return key_blocks[None, :] <= query_blocks[:, None]


def streaming_block_mask(
    query_blocks: torch.Tensor, num_key_blocks: int, sink_blocks: int, local_blocks: int
) -> torch.Tensor:
    """SSA at block level: sink blocks [0, sink_blocks) plus the local window (b - local_blocks, b].

    Returns:
        [R, Kb] bool.
    """
    key_blocks = torch.arange(num_key_blocks, device=query_blocks.device)[None, :]
    rows = query_blocks[:, None]
    causal = key_blocks <= rows
    sink = key_blocks < sink_blocks
    local = key_blocks > rows - local_blocks
    return causal & (sink | local)


def window_block_mask(query_blocks: torch.Tensor, num_key_blocks: int, block_size: int,
                      window_tokens: int) -> torch.Tensor:
    """The key blocks a sliding window of ``window_tokens`` leaves any key of: [R, Kb] bool, True where some query
    of the row's block and some key of the key block are fewer than ``window_tokens`` positions apart."""
    key_blocks = torch.arange(num_key_blocks, device=query_blocks.device)[None, :]
    first_query = query_blocks[:, None] * block_size
    last_key = key_blocks * block_size + block_size - 1
    return first_query - last_key < window_tokens


def tables_from_block_masks(
    masks: list[torch.Tensor], first_query_block: torch.Tensor, block_size: int
) -> BlockTables:
    """Pack per-sequence block masks into padded block tables.

    Args:
        masks: one [Hq, R_n, Kb_n] bool block mask per sequence (all with the same Hq, on one device).
        first_query_block: [N] int64, logical block of row 0 of each sequence.
        block_size: tokens per block.
    """
    heads = torch.arange(masks[0].shape[0], device=masks[0].device)
    return _tables_from_patterns([(mask, heads) for mask in masks], first_query_block, block_size)


def _compact(patterns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts [P, R] and ascending indices [P, R, K] (-1 padded, K = max count) of block masks [P, R, Kb].

    A cumulative sum gives each attended block its slot; one scatter writes it (no sort).
    """
    counts = patterns.sum(dim=-1, dtype=torch.int32)
    width = max(1, int(counts.max())) if counts.numel() else 1
    slot = patterns.cumsum(dim=-1, dtype=torch.int32) - 1
    slot = torch.where(patterns, slot, width)
    columns = torch.arange(patterns.shape[-1], dtype=torch.int32, device=patterns.device).expand_as(slot)
    index = torch.full((*patterns.shape[:-1], width + 1), -1, dtype=torch.int32, device=patterns.device)
    index.scatter_(-1, slot.long(), columns)
    return counts, index[..., :width]


def _tables_from_patterns(
    sequences: list[tuple[torch.Tensor, torch.Tensor]], first_query_block: torch.Tensor, block_size: int,
    window_tokens: int | None = None,
) -> BlockTables:
    """Block tables from, per sequence, distinct block patterns [P, R_n, Kb_n] and the pattern of each head [Hq]."""
    device = sequences[0][0].device
    num_heads = sequences[0][1].numel()
    compacted = [_compact(patterns) for patterns, _ in sequences]
    max_rows = max(patterns.shape[1] for patterns, _ in sequences)
    max_blocks = max(index.shape[-1] for _, index in compacted)
    kv_block_count = torch.zeros(len(sequences), num_heads, max_rows, dtype=torch.int32, device=device)
    kv_block_index = torch.full(
        (len(sequences), num_heads, max_rows, max_blocks), -1, dtype=torch.int32, device=device
    )
    for n, ((patterns, head_pattern), (counts, index)) in enumerate(zip(sequences, compacted)):
        rows, width = index.shape[1], index.shape[2]
        kv_block_count[n, :, :rows] = counts[head_pattern]
        kv_block_index[n, :, :rows, :width] = index[head_pattern]
    return BlockTables(
        kv_block_count=kv_block_count,
        kv_block_index=kv_block_index,
        first_query_block=first_query_block.to(torch.int64),
        num_rows=torch.tensor([patterns.shape[1] for patterns, _ in sequences], dtype=torch.int64),
        block_size=block_size,
        window_tokens=window_tokens,
    )


def block_mask_from_tables(tables: BlockTables, sequence: int, num_key_blocks: int) -> torch.Tensor:
    """Inverse of `tables_from_block_masks` for one sequence: [Hq, R_n, Kb] bool."""
    rows = int(tables.num_rows[sequence])
    index = tables.kv_block_index[sequence, :, :rows].long()
    mask = torch.zeros(*index.shape[:2], num_key_blocks + 1, dtype=torch.bool, device=index.device)
    mask.scatter_(-1, torch.where(index < 0, num_key_blocks, index), True)
    return mask[..., :num_key_blocks]


class BlockTableBuilder:
    """Block tables of every layer of one forward pass.

    The full and SSA block patterns depend only on the sequences, so they are built and compacted once per forward;
    a layer then gathers them per head in one step (and estimates its XA heads, which depend on its states).

    Args:
        layout: the sequences of this forward.
        config: block size, SSA sizes, XA stride and threshold.
        device: where the tables live.
        window_tokens: the model's sliding window on every layer, composed with every pattern (None for none).
    """

    def __init__(self, layout: SequenceLayout, config: ElasticConfig, device: torch.device | str,
                 window_tokens: int | None = None) -> None:
        if window_tokens is not None and window_tokens < 1:
            raise InputError(f"`window_tokens` must be a positive number of tokens or None, got {window_tokens}")
        self.layout, self.config, self.window_tokens = layout, config, window_tokens
        # Routing puts heads only on its configuration's two modes, so without XA there is no per-layer
        # device-to-host check for XA heads.
        self.config_has_xa = "xa" in (config.retrieval_mode, config.sparse_mode)
        size = config.block_size
        self._spans = list(zip(layout.spans(), layout.query_positions()))
        self._bases, first_blocks = [], []
        for span, (first_pos, _) in self._spans:
            first_block = first_pos // size
            query_blocks = torch.arange(first_block, (span.key_len - 1) // size + 1, device=device)
            num_key_blocks = (span.key_len - 1) // size + 1
            full = causal_block_mask(query_blocks, num_key_blocks)
            ssa = streaming_block_mask(query_blocks, num_key_blocks, config.sink_blocks, config.local_blocks)
            base = torch.stack([full, ssa])
            if window_tokens is not None:
                base &= window_block_mask(query_blocks, num_key_blocks, size, window_tokens)
            self._bases.append(base)
            first_blocks.append(first_block)
        self._first_blocks = torch.tensor(first_blocks, dtype=torch.int64)
        patterns = torch.arange(2, device=device)
        self._base = _tables_from_patterns([(base, patterns) for base in self._bases], self._first_blocks, size,
                                           window_tokens)
        self._base_pairs = attended_pairs(self._base, layout)

    def build(
        self,
        head_modes: torch.Tensor,
        num_query_heads: int,
        *,
        query: torch.Tensor | None = None,
        key: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> tuple[BlockTables, torch.Tensor]:
        """Block tables of one routed layer, and the causal (query, key) pairs each head attends.

        Args:
            head_modes: [N, Hkv] int codes (`FULL`, `SSA`, `XA`), the mode of each KV head of each sequence; every
                query head of a GQA group follows its KV head.
            num_query_heads: Hq, a multiple of Hkv.
            query: [B, Hq, S_q, D] query states; needed only when some head is on XA at prefill.
            key: [B, Hkv, S_kv, D] key states; same condition.
            scale: attention scale for the XA estimate (default 1/sqrt(D)).

        Returns:
            (tables, pairs [N, Hq] int64). At decode (queries with a cached past) XA heads attend every key: the XA
            estimate is a prefill method.

        Raises:
            InputError: shapes disagree, or XA heads need query/key states that were not given.
        """
        num_sequences, num_kv_heads = head_modes.shape
        if num_sequences != self.layout.num_sequences:
            raise InputError(f"head_modes has {num_sequences} sequences, the layout {self.layout.num_sequences}")
        if num_query_heads % num_kv_heads:
            raise InputError(f"query heads ({num_query_heads}) must be a multiple of KV heads ({num_kv_heads})")
        group = num_query_heads // num_kv_heads
        modes = head_modes.repeat_interleave(group, dim=1).to(self._base.kv_block_count.device)
        if self.layout.is_prefill and self.config_has_xa and bool((modes == XA).any()):
            tables = self._build_with_xa(modes, group, query, key, scale)
            return tables, attended_pairs(tables, self.layout)
        pattern = (modes == SSA).long()
        base = self._base
        rows, width = base.kv_block_index.shape[2:]
        count = base.kv_block_count.gather(1, pattern[:, :, None].expand(-1, -1, rows))
        index = base.kv_block_index.gather(1, pattern[:, :, None, None].expand(-1, -1, rows, width))
        tables = base._replace(kv_block_count=count, kv_block_index=index)
        return tables, self._base_pairs.gather(1, pattern)

    def _build_with_xa(self, modes, group, query, key, scale) -> BlockTables:
        if query is None or key is None:
            raise InputError("heads on XA need the query and key states to estimate their blocks")
        config, size = self.config, self.config.block_size
        sequences = []
        for n, (base, (span, _)) in enumerate(zip(self._bases, self._spans)):
            row, start, length, first_row, count = span
            patterns = list(base.unbind(0))
            # Pattern 0 is full attention, 1 SSA, 2.. one XA selection per XA head.
            head_pattern = (modes[n] == SSA).long()
            xa_heads = (modes[n] == XA).nonzero().flatten()
            if xa_heads.numel():
                selected = xattention_block_mask(
                    query[row, xa_heads, first_row : first_row + count],
                    key[row, xa_heads // group, start : start + length],
                    block_size=size,
                    stride=config.xa_stride,
                    threshold=config.xa_threshold,
                    scale=scale,
                ).to(base.device)
                if self.window_tokens is not None:
                    selected &= base[0]  # the full pattern, cut to the window
                patterns.extend(selected.unbind(0))
                head_pattern[xa_heads] = torch.arange(2, 2 + xa_heads.numel(), device=base.device)
            sequences.append((torch.stack(patterns), head_pattern))
        return _tables_from_patterns(sequences, self._first_blocks, size, self.window_tokens)


def build_block_tables(
    layout: SequenceLayout,
    head_modes: torch.Tensor,
    config: ElasticConfig,
    num_query_heads: int,
    *,
    query: torch.Tensor | None = None,
    key: torch.Tensor | None = None,
    scale: float | None = None,
    window_tokens: int | None = None,
) -> BlockTables:
    """Block tables of one routed layer (one-shot `BlockTableBuilder`; tables on the device of ``head_modes``).

    Raises:
        InputError: if a head is on XA and ``config``'s configuration has no XA (a builder would treat it as full).
    """
    builder = BlockTableBuilder(layout, config, head_modes.device, window_tokens)
    if not builder.config_has_xa and bool((head_modes == XA).any()):
        raise InputError(
            f"`head_modes` puts heads on XA but configuration {config.configuration!r} has no XA; "
            "use configuration 'fa-xa' or 'xa-ssa'"
        )
    tables, _ = builder.build(head_modes, num_query_heads, query=query, key=key, scale=scale)
    return tables


def attended_pairs(tables: BlockTables, layout: SequenceLayout) -> torch.Tensor:
    """Causal (query, key) pairs each head attends over the queries of this forward.

    Computed on the tables' device; only the [N, Hq] result is small. Under a model window (``window_tokens``) the
    blocks its edge cuts count whole, so the pairs are an upper bound there.

    Returns:
        [N, Hq] int64, on the tables' device.
    """
    size = tables.block_size
    device = tables.kv_block_count.device
    result = torch.zeros(tables.kv_block_count.shape[:2], dtype=torch.int64, device=device)
    for n, (first_pos, count) in enumerate(layout.query_positions()):
        rows = int(tables.num_rows[n])
        end = first_pos + count
        blocks = int(tables.first_query_block[n]) + torch.arange(rows, device=device)
        lo = torch.clamp(blocks * size, min=first_pos)
        hi = torch.clamp((blocks + 1) * size, max=end)
        queries = (hi - lo).clamp(min=0)
        block_count = tables.kv_block_count[n, :, :rows].long()
        # Indices ascend and never pass the diagonal, so the diagonal block, when attended, is the last one.
        last = tables.kv_block_index[n, :, :rows].gather(-1, (block_count - 1).clamp(min=0)[..., None])[..., 0]
        diagonal = (block_count > 0) & (last.long() == blocks[None, :])
        off_diagonal = block_count - diagonal.long()
        base = blocks * size
        triangle = _triangular(hi - base) - _triangular(lo - base)
        per_row = queries * size * off_diagonal + diagonal.long() * triangle
        result[n] = per_row.sum(dim=-1)
    return result


def causal_pairs(layout: SequenceLayout) -> torch.Tensor:
    """All causal (query, key) pairs over the queries of this forward: [N] int64."""
    totals = [_triangular(torch.tensor(first + count)) - _triangular(torch.tensor(first))
              for first, count in layout.query_positions()]
    return torch.stack(totals).to(torch.int64)


def _triangular(n: torch.Tensor) -> torch.Tensor:
    return n * (n + 1) // 2
