"""A decode step over KV heads with different cache lengths, for every sequence and head of a layer at once (Triton).

The bounded cache stores each (sequence, KV head) as a *segment*: the keys and values of one head in its own storage,
entry ``i`` at ``base + i * head_dim`` (contiguous rows). A head on full attention holds its entries in position
order and reads all of them; a streaming head holds a ring of ``sink + local`` slots (`cache.bounded` says which
position goes to which slot) and reads the slots filled so far. `DecodeSegments` lists the segments of one layer by
address, so one launch reaches all of them whatever tensor each lives in.

A decode step is two launches per layer, whatever the batch size (`decode_step`): a grid of segments x key splits, the
splits sized from the entries of all segments together (so a batch-1 step at long lengths still fills the GPU, and a
short ring takes one split) and as many as the longest segment needs (a split starting past its segment's entries
returns at once: a ring beside full stores, or a captured step sized for its capacity, leaves most of its own empty).
Each program takes its segment's new key and value from the step's states (the first split also writes them to the
cache: a full store at its end, a ring at its slot, with the slot's position), runs split-K attention of the segment's
query heads over its share of the entries (all of a full store, the filled slots of a ring; split 0 starts from the new
entry and every split leaves its slot out, since split 0 is writing it), and leaves its partial result. A second launch
merges, one program per (segment, query head, chunk of head_dim), the splits that hold entries, writes the output and
counts the entry in the segment's length (two launches in all, which a captured step replays together).
`write_step_entries` writes without attending (a step whose attention took another path).

Segments are ordered (sequence, KV head), so segment ``s`` reads the queries of batch row ``s // Hkv`` and query heads
``(s % Hkv) * g .. + g - 1`` (g query heads per KV head).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from elastic_attention.errors import InputError

import importlib.util



@dataclass(frozen=True)
class DecodeKernelOptions:
    """How `decode_step` launches its kernel. The defaults were the fastest of a sweep over 32K and 128K entries
    at batch 1 and 8 (docs/how-it-works.md, "Numbers behind the defaults").

    Attributes:
        block_keys: keys per block of the attention loop (a power of two, at least 16).
        num_warps, num_stages: Triton's launch options of the step kernel.
        programs_per_processor: how many programs per SM the key splits aim at, counted over the entries of every
            segment (a short ring needs one program, a long full store many).
        max_splits: at most this many splits per segment.
        min_split_keys: at least this many keys per split (rounded up to whole blocks): a layer whose few long full
            stores sit beside short rings otherwise splits them into programs of one or two blocks, which spend as
            much on their query, partial result and merge as on keys. 0: one block.
    """

    block_keys: int = 64
    num_warps: int = 4
    num_stages: int = 2
    programs_per_processor: int = 3
    max_splits: int = 1024
    min_split_keys: int = 0


#: The options `decode_step` uses unless given others.
DEFAULT_KERNEL_OPTIONS = DecodeKernelOptions()
#: Elements of head_dim per merge program: merged by one program per query head, a long full store's many splits
#: wait on one SM's load latency; chunks of head_dim spread the merge over more SMs.
MERGE_CHUNK = 32
#: Splits a merge program reads at once (more take several rounds of its online softmax).
MERGE_SPLITS = 128


def triton_decode_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True when the Triton decode kernels can run on ``device`` for states of ``dtype``: a CUDA device with Triton
    installed (bf16, fp16, float32: Triton's products take no float64), or the CPU under Triton's interpreter
    (``TRITON_INTERPRET=1``, for tests and debugging; float32 only, the interpreter does not read half-precision
    storage through raw addresses)."""
    if importlib.util.find_spec("triton") is None:  # the cache falls back to its per-sequence torch path
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
        lengths: entries the segment's sequence has so far (positions 0 .. length - 1); a step adds one (its write
            or merge kernel).
        num_kv_heads: Hkv, so segment s is (sequence s // Hkv, KV head s % Hkv).
        aligned: every key and value address is a multiple of 16 bytes (lets the kernels load 16 bytes at a time; the
            addresses come from memory, so the compiler cannot see it).
    """

    key_addresses: torch.Tensor
    value_addresses: torch.Tensor
    position_addresses: torch.Tensor
    lengths: torch.Tensor
    num_kv_heads: int
    aligned: bool = False

    @classmethod
    def from_columns(cls, key_addresses: list[int], value_addresses: list[int], position_addresses: list[int],
                     lengths: list[int], num_kv_heads: int, device: torch.device) -> DecodeSegments:
        """A table from host lists (one entry per segment, in (sequence, KV head) order), copied to ``device``
        at once."""
        table = torch.tensor([key_addresses, value_addresses, position_addresses, lengths], dtype=torch.int64)
        aligned = all(address % 16 == 0 for address in key_addresses + value_addresses)
        return cls(*table.to(device), num_kv_heads=num_kv_heads, aligned=aligned)

    @property
    def num_segments(self) -> int:
        return int(self.lengths.numel())

    def copy_(self, other: DecodeSegments) -> None:
        """Write ``other``'s addresses and lengths (as many segments) into this table's tensors, in place: a captured
        step that reads this table then runs over ``other``'s storage."""
        for name in ("key_addresses", "value_addresses", "position_addresses", "lengths"):
            getattr(self, name).copy_(getattr(other, name))


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
    from elastic_attention.cache.triton_decode_kernels import write_kernel

    write_kernel[(segments.num_segments,)](
        new_keys, new_values, new_keys.stride(0), new_keys.stride(1), new_values.stride(0), new_values.stride(1),
        num_kv, segments.key_addresses, segments.value_addresses, segments.position_addresses, segments.lengths,
        sink_tokens, local_tokens, HEAD_DIM=head_dim, BLOCK_D=_pow2(head_dim, 16),
        ALIGNED=segments.aligned and head_dim % 8 == 0,
    )


def decode_step(query: torch.Tensor, new_keys: torch.Tensor, new_values: torch.Tensor, segments: DecodeSegments,
                scale: float, *, sink_tokens: int, local_tokens: int, max_entries: int,
                total_entries: int | None = None, options: DecodeKernelOptions | None = None) -> torch.Tensor:
    """One decode step of a layer in two launches (the splits, the merge): write each segment's new entry (as
    `write_step_entries`), attend the step's query to every entry the segment keeps (all of a full store, the filled
    slots of a ring, the new entry among them), and count the entry (``segments.lengths += 1``).

    Args:
        query: [B, Hq, 1, D], the last axis contiguous; Hq = g * Hkv.
        new_keys, new_values: [B, Hkv, 1, D], the step's entries; B * Hkv = number of segments.
        segments: the layer's segments, ``lengths`` as before the step.
        sink_tokens, local_tokens: a ring's sizes (it keeps positions [0, sink) and the last ``local``).
        max_entries: an upper bound on any segment's entries after the step (with ``total_entries`` it sets the key
            splits; any larger bound gives the same result, so a captured step may pass its capacity).
        total_entries: about how many entries all segments attend together (None: ``max_entries`` per segment).
        options: launch options (None: `DEFAULT_KERNEL_OPTIONS`).

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
    options = options or DEFAULT_KERNEL_OPTIONS
    if total_entries is None:
        total_entries = max_entries * num_segments
    splits, keys_per_split = _key_splits(max_entries, total_entries, options, query.device)
    block_group = _pow2(group, 16)
    block_d = _pow2(head_dim, 16)
    partial = torch.empty(num_segments, splits, group, head_dim, device=query.device, dtype=torch.float32)
    maxima = torch.empty(num_segments, splits, group, device=query.device, dtype=torch.float32)
    sums = torch.empty_like(maxima)
    output = torch.empty_like(query)
    from elastic_attention.cache.triton_decode_kernels import merge_kernel, step_kernel

    step_kernel[(num_segments, splits)](
        query, query.stride(0), query.stride(1), new_keys, new_values, new_keys.stride(0), new_keys.stride(1),
        new_values.stride(0), new_values.stride(1), num_kv, segments.key_addresses, segments.value_addresses,
        segments.position_addresses, segments.lengths, sink_tokens, local_tokens, keys_per_split, partial, maxima,
        sums, scale, splits, GROUP=group, BLOCK_G=block_group, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_N=options.block_keys, ALIGNED=segments.aligned and head_dim % 8 == 0,
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=options.num_warps, num_stages=options.num_stages,
    )
    merge_chunk = min(block_d, MERGE_CHUNK)
    merge_kernel[(num_segments, group, _ceil_div(head_dim, merge_chunk))](
        partial, maxima, sums, output, output.stride(0), output.stride(1), segments.lengths,
        segments.position_addresses, num_kv, sink_tokens, local_tokens, keys_per_split, splits, GROUP=group,
        HEAD_DIM=head_dim, BLOCK_D=merge_chunk, BLOCK_S=max(1, min(MERGE_SPLITS, _pow2(splits, 1))),
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


def _key_splits(max_entries: int, total_entries: int, options: DecodeKernelOptions,
                device: torch.device) -> tuple[int, int]:
    """(splits, keys per split): about ``options.programs_per_processor`` programs per SM over all the step's entries
    (each program over whole key blocks), at most ``options.max_splits`` splits per segment, at least
    ``options.min_split_keys`` keys per split."""
    block = options.block_keys
    programs = options.programs_per_processor * _processors(device)
    least_keys = max(_ceil_div(max(1, total_entries), programs), _ceil_div(max(1, max_entries), options.max_splits),
                     options.min_split_keys)
    keys_per_split = _ceil_div(least_keys, block) * block
    return _ceil_div(max(1, max_entries), keys_per_split), keys_per_split


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)
