"""A decode step over KV heads with different cache lengths, for every sequence and head of a layer at once (Triton).

The bounded cache stores each (sequence, KV head) as a *segment*: the keys and values of one head in its own storage,
entry ``i`` at ``base + i * head_dim`` (contiguous rows). A head on full attention holds its entries in position
order and reads all of them; a streaming head holds a ring of ``sink + local`` slots (`cache.bounded` says which
position goes to which slot) and reads the slots filled so far. `DecodeSegments` lists the segments of one layer by
address, so one launch reaches all of them whatever tensor each lives in.

A decode step is one launch per layer, whatever the batch size (`decode_step`): a grid of segments x key splits (so a
batch-1 step at long lengths still fills the GPU). Each program takes its segment's new key and value from the step's
states (the first split also writes them to the cache: a full store at its end, a ring at its slot, with the slot's
position), runs split-K attention of the segment's query heads over its share of the entries (all of a full store,
the filled slots of a ring, the new entry among them), and leaves its partial result; the last split of a segment to
finish (an atomic count of arrivals) merges the splits, writes the output and counts the entry in the segment's
length. `write_step_entries` writes without attending (a step whose attention took another path).

Segments are ordered (sequence, KV head), so segment ``s`` reads the queries of batch row ``s // Hkv`` and query heads
``(s % Hkv) * g .. + g - 1`` (g query heads per KV head).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import torch

from elastic_attention.errors import InputError

try:
    import triton
    import triton.language as tl
except ImportError:  # the cache falls back to its per-sequence torch path
    triton = None

#: Keys per block of the attention kernel's inner loop.
_BLOCK_KEYS = 64


def triton_decode_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True when the Triton decode kernels can run on ``device`` for states of ``dtype``: a CUDA device with Triton
    installed (bf16, fp16, float32: Triton's products take no float64), or the CPU under Triton's interpreter
    (``TRITON_INTERPRET=1``, for tests and debugging; float32 only, the interpreter does not read half-precision
    storage through raw addresses)."""
    if triton is None:
        return False
    if device.type == "cuda":
        return dtype in (torch.bfloat16, torch.float16, torch.float32)
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1" and dtype == torch.float32


@dataclass
class DecodeSegments:
    """The (sequence, KV head) segments of one layer, by address. Every tensor is int64 [N] on the cache's device.

    Attributes:
        key_addresses, value_addresses: address of entry 0 of the segment's keys / values (rows of head_dim).
        position_addresses: a ring's slot positions (int64 [sink + local]), 0 for a full-store segment.
        lengths: entries the segment's sequence has so far (positions 0 .. length - 1); the write kernel adds one.
        num_kv_heads: Hkv, so segment s is (sequence s // Hkv, KV head s % Hkv).
        aligned: every key and value address is a multiple of 16 bytes (lets the kernels load 16 bytes at a time; the
            addresses come from memory, so the compiler cannot see it).
        arrivals: int32 [N], zero between steps: how many key splits of each segment have finished the step.
    """

    key_addresses: torch.Tensor
    value_addresses: torch.Tensor
    position_addresses: torch.Tensor
    lengths: torch.Tensor
    num_kv_heads: int
    aligned: bool = False
    arrivals: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.arrivals = torch.zeros_like(self.lengths, dtype=torch.int32)

    @classmethod
    def from_columns(cls, key_addresses: list[int], value_addresses: list[int], position_addresses: list[int],
                     lengths: list[int], num_kv_heads: int, device: torch.device) -> DecodeSegments:
        """A table from host lists (one entry per segment, in (sequence, KV head) order), copied to ``device`` at once."""
        table = torch.tensor([key_addresses, value_addresses, position_addresses, lengths], dtype=torch.int64)
        aligned = all(address % 16 == 0 for address in key_addresses + value_addresses)
        return cls(*table.to(device), num_kv_heads=num_kv_heads, aligned=aligned)

    @property
    def num_segments(self) -> int:
        return int(self.lengths.numel())


def write_step_entries(new_keys: torch.Tensor, new_values: torch.Tensor, segments: DecodeSegments, *,
                       sink_tokens: int, local_tokens: int) -> None:
    """Write one new entry per segment and count it (``segments.lengths += 1``).

    A full-store segment writes at slot ``length``; a ring writes at ``length`` inside the sink, else at
    ``sink + (length - sink) % local``, and records ``length`` as that slot's position.

    Args:
        new_keys, new_values: [B, Hkv, 1, D], B * Hkv = number of segments; the last axis contiguous.
    """
    batch, num_kv, _, head_dim = new_keys.shape
    _check_states(new_keys, new_values, segments, batch * num_kv)
    _write_kernel[(segments.num_segments,)](
        new_keys, new_values, new_keys.stride(0), new_keys.stride(1), new_values.stride(0), new_values.stride(1),
        num_kv, segments.key_addresses, segments.value_addresses, segments.position_addresses, segments.lengths,
        sink_tokens, local_tokens, HEAD_DIM=head_dim, BLOCK_D=_pow2(head_dim, 16),
        ALIGNED=segments.aligned and head_dim % 8 == 0,
    )


def decode_step(query: torch.Tensor, new_keys: torch.Tensor, new_values: torch.Tensor, segments: DecodeSegments,
                scale: float, *, sink_tokens: int, local_tokens: int, max_entries: int) -> torch.Tensor:
    """One decode step of a layer in one launch: write each segment's new entry (as `write_step_entries`), attend the
    step's query to every entry the segment keeps (all of a full store, the filled slots of a ring, the new entry
    among them), and count the entry (``segments.lengths += 1``).

    Args:
        query: [B, Hq, 1, D], the last axis contiguous; Hq = g * Hkv.
        new_keys, new_values: [B, Hkv, 1, D], the step's entries; B * Hkv = number of segments.
        segments: the layer's segments, ``lengths`` as before the step.
        sink_tokens, local_tokens: a ring's sizes (it keeps positions [0, sink) and the last ``local``).
        max_entries: an upper bound on any segment's entries after the step (sets the key splits).

    Returns:
        [B, Hq, 1, D] in the query's dtype; softmax in float32.
    """
    batch, num_query_heads, _, head_dim = query.shape
    num_kv = segments.num_kv_heads
    _check_states(new_keys, new_values, segments, batch * num_kv)
    if num_query_heads % num_kv or batch * num_kv != segments.num_segments or query.stride(3) != 1:
        raise InputError(
            f"query {tuple(query.shape)} does not match {segments.num_segments} segments of {num_kv} KV heads "
            "(or its last axis is strided)"
        )
    group = num_query_heads // num_kv
    num_segments = segments.num_segments
    splits, keys_per_split = _key_splits(max_entries, num_segments, query.device)
    block_group = _pow2(group, 16)
    partial = torch.empty(num_segments, splits, group, head_dim, device=query.device, dtype=torch.float32)
    maxima = torch.empty(num_segments, splits, group, device=query.device, dtype=torch.float32)
    sums = torch.empty_like(maxima)
    output = torch.empty_like(query)
    _step_kernel[(num_segments, splits)](
        query, query.stride(0), query.stride(1), new_keys, new_values, new_keys.stride(0), new_keys.stride(1),
        new_values.stride(0), new_values.stride(1), num_kv, segments.key_addresses, segments.value_addresses,
        segments.position_addresses, segments.lengths, segments.arrivals, sink_tokens, local_tokens, keys_per_split,
        partial, maxima, sums, output, output.stride(0), output.stride(1), scale, splits,
        GROUP=group, BLOCK_G=block_group, HEAD_DIM=head_dim, BLOCK_D=_pow2(head_dim, 16), BLOCK_N=_BLOCK_KEYS,
        ALIGNED=segments.aligned and head_dim % 8 == 0,
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
    )
    return output


def _check_states(new_keys: torch.Tensor, new_values: torch.Tensor, segments: DecodeSegments, count: int) -> None:
    if new_keys.shape != new_values.shape or new_keys.shape[2] != 1 or count != segments.num_segments:
        raise InputError(
            f"a decode step writes one entry per segment: got keys {tuple(new_keys.shape)}, values "
            f"{tuple(new_values.shape)} for {segments.num_segments} segments"
        )
    if new_keys.stride(3) != 1 or new_values.stride(3) != 1:
        raise InputError("the new keys and values need a contiguous last axis")


def _pow2(value: int, minimum: int) -> int:
    return max(minimum, 1 << (int(value) - 1).bit_length())


@functools.lru_cache(maxsize=None)
def _processors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _key_splits(max_entries: int, num_segments: int, device: torch.device) -> tuple[int, int]:
    """(splits, keys per split): about two programs per SM in all, each over whole key blocks."""
    programs = 2 * _processors(device)
    blocks = triton.cdiv(max(1, max_entries), _BLOCK_KEYS)
    splits = max(1, min(blocks, triton.cdiv(programs, num_segments)))
    keys_per_split = triton.cdiv(blocks, splits) * _BLOCK_KEYS
    return triton.cdiv(max(1, max_entries), keys_per_split), keys_per_split


if triton is not None:

    @triton.jit
    def _segment_storage(segment, key_addresses, value_addresses, dtype, ALIGNED: tl.constexpr):
        """(keys, values) pointers of a segment's storage (rows of head_dim)."""
        keys = tl.load(key_addresses + segment).to(tl.pointer_type(dtype))
        values = tl.load(value_addresses + segment).to(tl.pointer_type(dtype))
        if ALIGNED:
            keys, values = tl.multiple_of(keys, 16), tl.multiple_of(values, 16)
        return keys, values

    @triton.jit
    def _slot_of(length, position_address, sink, local):
        """The slot of position ``length``: itself in a full store (no position address), else its ring slot."""
        slot = length
        if position_address != 0:
            slot = tl.where(length < sink, length, sink + (length - sink) % local)
        return slot

    @triton.jit
    def _store_entry(keys, values, position_address, length, sink, local, key, value, d, in_dim,
                     HEAD_DIM: tl.constexpr):
        """Store the entry of position ``length`` at its slot (and, in a ring, the slot's position)."""
        slot = _slot_of(length, position_address, sink, local)
        if position_address != 0:
            tl.store(position_address.to(tl.pointer_type(tl.int64)) + slot, length.to(tl.int64))
        row = slot.to(tl.int64) * HEAD_DIM
        tl.store(keys + row + d, key, mask=in_dim)
        tl.store(values + row + d, value, mask=in_dim)

    @triton.jit
    def _write_kernel(new_keys, new_values, key_stride_b, key_stride_h, value_stride_b, value_stride_h, num_kv,
                      key_addresses, value_addresses, position_addresses, lengths, sink, local,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, ALIGNED: tl.constexpr):
        segment = tl.program_id(0)
        batch_row, head = segment // num_kv, segment % num_kv
        length = tl.load(lengths + segment)
        d = tl.arange(0, BLOCK_D)
        in_dim = d < HEAD_DIM
        keys, values = _segment_storage(segment, key_addresses, value_addresses, new_keys.dtype.element_ty, ALIGNED)
        key = tl.load(new_keys + batch_row * key_stride_b + head * key_stride_h + d, mask=in_dim)
        value = tl.load(new_values + batch_row * value_stride_b + head * value_stride_h + d, mask=in_dim)
        _store_entry(keys, values, tl.load(position_addresses + segment), length, sink, local, key, value, d, in_dim,
                     HEAD_DIM)
        tl.store(lengths + segment, length + 1)

    @triton.jit
    def _step_kernel(query, query_stride_b, query_stride_h, new_keys, new_values, key_stride_b, key_stride_h,
                     value_stride_b, value_stride_h, num_kv, key_addresses, value_addresses, position_addresses,
                     lengths, arrivals, sink, local, keys_per_split, partial, maxima, sums, output, output_stride_b,
                     output_stride_h, scale, splits, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, ALIGNED: tl.constexpr,
                     PRECISION: tl.constexpr):
        segment, split = tl.program_id(0), tl.program_id(1)
        batch_row, head = segment // num_kv, segment % num_kv
        length = tl.load(lengths + segment)  # before the step; only this segment's last split changes it
        position_address = tl.load(position_addresses + segment)
        entries = length + 1
        if position_address != 0:
            entries = tl.minimum(entries, sink + local)
        slot = _slot_of(length, position_address, sink, local)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        in_group, in_dim = g < GROUP, d < HEAD_DIM
        keys, values = _segment_storage(segment, key_addresses, value_addresses, query.dtype.element_ty, ALIGNED)
        new_key = tl.load(new_keys + batch_row * key_stride_b + head * key_stride_h + d, mask=in_dim, other=0.0)
        new_value = tl.load(new_values + batch_row * value_stride_b + head * value_stride_h + d, mask=in_dim,
                            other=0.0)
        if split == 0:
            _store_entry(keys, values, position_address, length, sink, local, new_key, new_value, d, in_dim, HEAD_DIM)
        query_rows = query + batch_row * query_stride_b + (head * GROUP + g[:, None]) * query_stride_h + d[None, :]
        queries = tl.load(query_rows, mask=in_group[:, None] & in_dim[None, :], other=0.0)
        start = split * keys_per_split
        end = tl.minimum(start + keys_per_split, entries)
        running_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
        running_sum = tl.zeros([BLOCK_G], tl.float32)
        accumulator = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for block_start in range(start, end, BLOCK_N):
            n = block_start + tl.arange(0, BLOCK_N)
            in_range = n < end
            # The new entry's slot is being written by split 0: every split takes it from the step's states.
            is_new = (n == slot)[:, None]
            offsets = n.to(tl.int64)[:, None] * HEAD_DIM + d[None, :]
            if BLOCK_D == HEAD_DIM:  # a mask constant along rows keeps the loads wide
                load_mask = in_range[:, None]
            else:
                load_mask = in_range[:, None] & in_dim[None, :]
            block_keys = tl.where(is_new, new_key[None, :], tl.load(keys + offsets, mask=load_mask, other=0.0))
            scores = tl.dot(queries, tl.trans(block_keys), input_precision=PRECISION) * scale
            scores = tl.where(in_range[None, :], scores, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, 1))
            rescale = tl.exp(running_max - new_max)
            weights = tl.exp(scores - new_max[:, None])
            running_sum = running_sum * rescale + tl.sum(weights, 1)
            block_values = tl.where(is_new, new_value[None, :], tl.load(values + offsets, mask=load_mask, other=0.0))
            accumulator = accumulator * rescale[:, None] + tl.dot(weights.to(block_values.dtype), block_values,
                                                                  input_precision=PRECISION)
            running_max = new_max
        stats = (segment * splits + split) * GROUP + g
        tl.store(maxima + stats, running_max, mask=in_group)
        tl.store(sums + stats, running_sum, mask=in_group)
        tl.store(partial + stats[:, None] * HEAD_DIM + d[None, :], accumulator,
                 mask=in_group[:, None] & in_dim[None, :])
        tl.debug_barrier()  # every thread's partial results are stored before the arrival is counted
        if tl.atomic_add(arrivals + segment, 1, sem="acq_rel") == splits - 1:  # the last split merges
            tl.debug_barrier()
            _merge_splits(partial, maxima, sums, output, output_stride_b, output_stride_h, segment, batch_row, head,
                          splits, GROUP, BLOCK_G, HEAD_DIM, BLOCK_D)
            tl.store(lengths + segment, length + 1)
            tl.atomic_xchg(arrivals + segment, 0)

    @triton.jit
    def _merge_splits(partial, maxima, sums, output, output_stride_b, output_stride_h, segment, batch_row, head,
                      splits, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_D: tl.constexpr):
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        in_group, in_dim = g < GROUP, d < HEAD_DIM
        tile_mask = in_group[:, None] & in_dim[None, :]
        stats = segment * splits * GROUP + g  # split 0 always holds an entry (the first), so its maximum is finite
        total_max = tl.load(maxima + stats, mask=in_group, other=0.0)
        total_sum = tl.load(sums + stats, mask=in_group, other=1.0)
        total = tl.load(partial + stats[:, None] * HEAD_DIM + d[None, :], mask=tile_mask, other=0.0)
        for split in range(1, splits):
            stats = (segment * splits + split) * GROUP + g
            split_max = tl.load(maxima + stats, mask=in_group, other=float("-inf"))
            new_max = tl.maximum(total_max, split_max)
            old_weight, split_weight = tl.exp(total_max - new_max), tl.exp(split_max - new_max)
            total_sum = total_sum * old_weight + tl.load(sums + stats, mask=in_group, other=0.0) * split_weight
            split_total = tl.load(partial + stats[:, None] * HEAD_DIM + d[None, :], mask=tile_mask, other=0.0)
            total = total * old_weight[:, None] + split_total * split_weight[:, None]
            total_max = new_max
        rows = output + batch_row * output_stride_b + (head * GROUP + g[:, None]) * output_stride_h + d[None, :]
        tl.store(rows, (total / total_sum[:, None]).to(output.dtype.element_ty), mask=tile_mask)
