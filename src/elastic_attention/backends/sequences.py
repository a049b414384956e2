"""Per-sequence, left-aligned buffers for kernels that see one sequence per batch row.

A fused kernel's block grid starts at index 0 of each batch row, while a sequence may start anywhere (left padding,
packing). `AlignedSequences` gathers each sequence to the start of its own row, padded to whole blocks, and writes
the kernel's output back to the caller's layout. When the caller's batch already has that shape (one sequence per
row starting at index 0, queries starting at the first block), no copy is made.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from elastic_attention.patterns import BlockTables, SequenceLayout, SequenceSpan


@dataclass
class AlignedSequences:
    """Queries, keys and values with sequence n in batch row n, logical position p at index p - query offset.

    Attributes:
        query: [N, Hq, Sq_pad, D]; rows past each sequence's queries hold zeros (or the caller's padding, when no
            copy was needed).
        key, value: [N, Hkv, Skv_pad, D]; likewise past each sequence's keys.
        lengths: key count per sequence (python ints).
        query_offsets: logical position of the first query of each sequence.
        query_counts: queries per sequence.
        copied: whether the buffers are copies (False: views of the caller's tensors).
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    lengths: list[int]
    query_offsets: list[int]
    query_counts: list[int]
    copied: bool
    _spans: list[SequenceSpan]

    @classmethod
    def gather(
        cls,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        layout: SequenceLayout,
        block_size: int,
        *,
        allow_views: bool = True,
    ) -> AlignedSequences:
        """Align the sequences of ``layout`` (query [B, Hq, S_q, D], key/value [B, Hkv, S_kv, D]).

        With ``allow_views=False`` the buffers are always copies padded to whole blocks.
        """
        spans = layout.spans()
        lengths = [span.key_len for span in spans]
        counts = [span.query_count for span in spans]
        offsets = [length - count for length, count in zip(lengths, counts)]
        in_place = allow_views and (
            [span.row for span in spans] == list(range(layout.batch_size))
            and all(span.key_start == 0 and span.first_query_row == 0 for span in spans)
            and layout.is_prefill
        )
        if in_place:
            return cls(query, key, value, lengths, offsets, counts, False, spans)
        key_len = -(-max(lengths) // block_size) * block_size
        query_len = -(-max(counts) // block_size) * block_size
        num = len(spans)
        queries = query.new_zeros(num, query.shape[1], query_len, query.shape[3])
        keys = key.new_zeros(num, key.shape[1], key_len, key.shape[3])
        values = value.new_zeros(num, value.shape[1], key_len, value.shape[3])
        for n, (row, start, length, first_row, count) in enumerate(spans):
            queries[n, :, :count] = query[row, :, first_row : first_row + count]
            keys[n, :, :length] = key[row, :, start : start + length]
            values[n, :, :length] = value[row, :, start : start + length]
        return cls(queries, keys, values, lengths, offsets, counts, True, spans)

    def scatter(self, attended: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """The kernel's output [N, Hq, Sq_pad, D] in the caller's layout (shape and dtype of ``like``), padding zero."""
        if not self.copied:
            padded = [(n, count) for n, count in enumerate(self.query_counts) if count < attended.shape[2]]
            if padded and attended.requires_grad:
                attended = attended.clone()  # the kernel's backward may read its output
            for n, count in padded:
                attended[n, :, count:] = 0
            return attended
        output = torch.zeros_like(like)
        for n, (row, _, _, first_row, count) in enumerate(self._spans):
            output[row, :, first_row : first_row + count] = attended[n, :, :count]
        return output


def fit_tables(tables: BlockTables, num_query_blocks: int, num_key_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts [N, Hq, num_query_blocks] and indices [N, Hq, num_query_blocks, num_key_blocks] for a kernel grid.

    Rows past a sequence's queries have count 0; index columns past the counts hold 0 (a valid block, never read).
    """
    counts = tables.kv_block_count[:, :, :num_query_blocks]
    index = tables.kv_block_index[:, :, :num_query_blocks, :num_key_blocks].clamp(min=0)
    if counts.shape[2] < num_query_blocks:
        counts = torch.nn.functional.pad(counts, (0, num_query_blocks - counts.shape[2]))
        index = torch.nn.functional.pad(index, (0, 0, 0, num_query_blocks - index.shape[2]))
    if index.shape[3] < num_key_blocks:
        index = torch.nn.functional.pad(index, (0, num_key_blocks - index.shape[3]))
    return counts.contiguous(), index.contiguous()
