"""`SequenceLayout`: where each sequence of a forward pass lives on the key axis.

A forward pass sees key states [B, Hkv, S_kv, D] and query states [B, Hq, S_q, D]; the queries are the last S_q key
positions. A batch row holds one sequence (left or right padded) or several packed sequences. Every pattern, the
router pooling and every backend work per sequence, in the sequence's own *logical* positions: position 0 is its
first token, wherever that token sits physically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from elastic_attention.errors import InputError


class SequenceSpan(NamedTuple):
    """Where one sequence of a forward sits.

    Attributes:
        row: its batch row.
        key_start: physical index on the key axis of its first token.
        key_len: number of keys it has so far (logical positions 0 .. key_len - 1).
        first_query_row: physical query row of its first query in this forward.
        query_count: its queries in this forward: query rows [first_query_row, first_query_row + query_count),
            logical positions ``key_len - query_count .. key_len - 1``.
    """

    row: int
    key_start: int
    key_len: int
    first_query_row: int
    query_count: int


@dataclass(frozen=True)
class SequenceLayout:
    """Sequences of one forward pass.

    Attributes:
        row: [N] int64, the batch row of sequence n.
        key_start: [N] int64, physical index on the key axis of sequence n's first token.
        key_len: [N] int64, number of keys sequence n has so far (prompt plus generated tokens).
        query_len: S_q, number of query positions in this forward; they are key positions S_kv - S_q .. S_kv - 1.
        kv_len: S_kv, length of the key axis.
        batch_size: B.
    """

    row: torch.Tensor
    key_start: torch.Tensor
    key_len: torch.Tensor
    query_len: int
    kv_len: int
    batch_size: int

    @property
    def num_sequences(self) -> int:
        return int(self.row.numel())

    @property
    def is_prefill(self) -> bool:
        """True when every key of this forward is also a query (no cached past)."""
        return self.query_len == self.kv_len

    @property
    def query_offset(self) -> int:
        """Physical key position of query row 0."""
        return self.kv_len - self.query_len

    def spans(self) -> list[SequenceSpan]:
        """One `SequenceSpan` per sequence: where its keys and its queries of this forward sit.

        Rows of a batch that belong to no sequence are padding. Computed once per layout (every layer of a forward
        asks); do not modify the returned list.
        """
        cached = self.__dict__.get("_spans")
        if cached is not None:
            return cached
        result = []
        for row, start, length in zip(self.row.tolist(), self.key_start.tolist(), self.key_len.tolist()):
            end = start + length
            first_physical = max(start, self.query_offset)
            count = max(0, end - first_physical)
            result.append(SequenceSpan(row, start, length, first_physical - self.query_offset, count))
        object.__setattr__(self, "_spans", result)  # a cache, not a field: the dataclass is frozen
        return result

    @property
    def is_single_token_step(self) -> bool:
        """True when sequence n lives in batch row n and has exactly one query, the first row (a decode step)."""
        return self.query_len == 1 and all(
            span.row == n and span.first_query_row == 0 and span.query_count == 1
            for n, span in enumerate(self.spans())
        )

    def query_positions(self) -> list[tuple[int, int]]:
        """Per sequence: (first logical query position, number of queries)."""
        return [(span.key_len - span.query_count, span.query_count) for span in self.spans()]

    @classmethod
    def dense(cls, batch_size: int, kv_len: int, query_len: int | None = None) -> SequenceLayout:
        """One unpadded sequence per row."""
        _check_batch(batch_size, kv_len)
        rows = torch.arange(batch_size, dtype=torch.int64)
        return cls(
            row=rows,
            key_start=torch.zeros(batch_size, dtype=torch.int64),
            key_len=torch.full((batch_size,), kv_len, dtype=torch.int64),
            query_len=kv_len if query_len is None else query_len,
            kv_len=kv_len,
            batch_size=batch_size,
        )

    @classmethod
    def from_padding_mask(cls, mask: torch.Tensor, query_len: int | None = None) -> SequenceLayout:
        """One sequence per row from a 2D padding mask.

        Args:
            mask: [B, S_kv] bool or 0/1, True on real tokens. Each row's real tokens must be one contiguous span
                (left or right padding).
            query_len: S_q; defaults to S_kv (prefill).

        Raises:
            InputError: the mask is not 2D, a row has no tokens, or a row's tokens are not contiguous.
        """
        if mask.ndim != 2:
            raise InputError(
                f"elastic attention takes a 2D padding mask [batch, keys], got shape {tuple(mask.shape)}; "
                "pass the tokenizer's attention_mask, not a 4D mask"
            )
        batch_size, kv_len = mask.shape
        _check_batch(batch_size, kv_len)
        # Reduced where the mask lives; only three numbers per row come to the host.
        valid = mask.to(dtype=torch.bool)
        positions = torch.arange(kv_len, device=mask.device)
        key_len, key_start, key_end = torch.stack([
            valid.sum(dim=1),
            torch.where(valid, positions, kv_len).min(dim=1).values,
            torch.where(valid, positions + 1, 0).max(dim=1).values,
        ]).cpu()
        empty = (key_len == 0).nonzero().flatten().tolist()
        if empty:
            raise InputError(f"attention_mask rows {empty} have no tokens; drop empty samples from the batch")
        holes = ((key_end - key_start) != key_len).nonzero().flatten().tolist()
        if holes and query_len is not None and query_len < kv_len:
            raise InputError(
                f"attention_mask rows {holes} continue a right-padded prompt: the new tokens come after the padding. "
                "Pad on the left to generate or to continue a cached prompt (tokenizer.padding_side = 'left')"
            )
        if holes:
            raise InputError(
                f"attention_mask rows {holes} mark tokens that are not one contiguous span; "
                "elastic attention supports left or right padding only"
            )
        return cls(
            row=torch.arange(batch_size, dtype=torch.int64),
            key_start=key_start.to(torch.int64),
            key_len=key_len.to(torch.int64),
            query_len=kv_len if query_len is None else query_len,
            kv_len=kv_len,
            batch_size=batch_size,
        )

    @classmethod
    def from_position_ids(cls, position_ids: torch.Tensor) -> SequenceLayout:
        """Packed sequences at prefill: a new sequence starts wherever the position does not follow its predecessor.

        Args:
            position_ids: [B, S] int, positions restarting at 0 for each packed sequence.

        Raises:
            InputError: a sequence that does not start at 0 (positions that skip, e.g. ``arange * 2``, or start
                late) or packed sequences of one token (e.g. all zeros), which are not packing but a mistake.
        """
        if position_ids.ndim != 2:
            raise InputError(f"position_ids must be [batch, tokens], got shape {tuple(position_ids.shape)}")
        batch_size, length = position_ids.shape
        _check_batch(batch_size, length)
        positions = position_ids.to("cpu", torch.int64)
        starts_new = torch.ones_like(positions, dtype=torch.bool)
        starts_new[:, 1:] = positions[:, 1:] != positions[:, :-1] + 1
        rows, starts = starts_new.nonzero(as_tuple=True)
        ends = torch.cat([starts[1:], torch.tensor([length])])
        ends = torch.where(torch.cat([rows[1:] != rows[:-1], torch.tensor([True])]), length, ends)
        first_positions = positions[rows, starts]
        late = (first_positions != 0).nonzero().flatten()
        single = ((ends - starts == 1) & (rows.bincount(minlength=batch_size)[rows] > 1)).nonzero().flatten()
        if late.numel() or single.numel():
            index = int(late[0] if late.numel() else single[0])
            row, column = int(rows[index]), int(starts[index])
            shown = positions[row, max(0, column - 3) : column + 3].tolist()
            problem = (f"row {row} has position {int(first_positions[index])} at column {column}, which neither "
                       f"follows its predecessor nor restarts at 0" if late.numel() else
                       f"row {row} holds one-token sequences from column {column}")
            raise InputError(
                "position_ids must count 0, 1, 2, ... along each row, or restart at 0 for each packed sequence of "
                f"two tokens or more; {problem} (positions {shown} around it). For padded batches pass the "
                "attention_mask; otherwise pass no position_ids"
            )
        return cls(
            row=rows.to(torch.int64),
            key_start=starts.to(torch.int64),
            key_len=(ends - starts).to(torch.int64),
            query_len=length,
            kv_len=length,
            batch_size=batch_size,
        )


def _check_batch(batch_size: int, length: int) -> None:
    if batch_size == 0:
        raise InputError("the batch is empty (batch size 0); pass at least one sample")
    if length == 0:
        raise InputError("the inputs have no tokens (sequence length 0); pass at least one token per sample")
