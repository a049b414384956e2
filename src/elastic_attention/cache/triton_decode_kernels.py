"""The Triton kernels of the fused decode step (`cache.triton_decode` launches them: the step, then the merge).

Imported only when a fused step runs, so that importing elastic_attention never imports Triton. Segments, slots and
the merge of key splits are described in `cache.triton_decode`.
"""

import triton
import triton.language as tl

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
def write_kernel(new_keys, new_values, key_stride_b, key_stride_h, value_stride_b, value_stride_h, num_kv,
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
def step_kernel(query, query_stride_b, query_stride_h, new_keys, new_values, key_stride_b, key_stride_h,
                 value_stride_b, value_stride_h, num_kv, key_addresses, value_addresses, position_addresses,
                 lengths, sink, local, keys_per_split, partial, maxima, sums, scale, splits, GROUP: tl.constexpr,
                 BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                 ALIGNED: tl.constexpr, PRECISION: tl.constexpr):
    """One key split of one segment: its partial result (maximum, sum, weighted values) per query head. A split that
    starts past the segment's entries returns at once: the grid is sized for the longest segment (or a captured
    step's capacity), so a ring's later splits and a full store's splits past its length hold nothing."""
    segment, split = tl.program_id(0), tl.program_id(1)
    batch_row, head = segment // num_kv, segment % num_kv
    length = tl.load(lengths + segment)  # before the step (counted after the merge)
    position_address = tl.load(position_addresses + segment)
    entries = length + 1
    if position_address != 0:
        entries = tl.minimum(entries, sink + local)
    start = split * keys_per_split
    if start > entries:  # past every split the merge may read (it reads at most the one starting at `entries`)
        return
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
    end = tl.minimum(start + keys_per_split, entries)
    # The new entry's slot is being written by split 0, so the loop leaves it out and split 0 starts from it.
    new_scores = tl.sum(queries.to(tl.float32) * new_key.to(tl.float32)[None, :], 1) * scale
    first = split == 0
    running_max = tl.where(first, new_scores, float("-inf"))
    running_sum = tl.where(first, 1.0, 0.0) + tl.zeros([BLOCK_G], tl.float32)
    accumulator = tl.where(first, 1.0, 0.0) * new_value.to(tl.float32)[None, :] + tl.zeros([BLOCK_G, BLOCK_D],
                                                                                           tl.float32)
    for block_start in range(start, end, BLOCK_N):
        n = block_start + tl.arange(0, BLOCK_N)
        in_range = n < end
        offsets = n.to(tl.int64)[:, None] * HEAD_DIM + d[None, :]
        if BLOCK_D == HEAD_DIM:  # a mask constant along rows keeps the loads wide
            load_mask = in_range[:, None]
        else:
            load_mask = in_range[:, None] & in_dim[None, :]
        block_keys = tl.load(keys + offsets, mask=load_mask, other=0.0)
        block_values = tl.load(values + offsets, mask=load_mask, other=0.0)
        scores = tl.dot(queries, tl.trans(block_keys), input_precision=PRECISION) * scale
        scores = tl.where((in_range & (n != slot))[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # a block of only the new entry's slot: no key yet
        rescale = tl.exp(running_max - shift)
        weights = tl.exp(scores - shift[:, None])
        running_sum = running_sum * rescale + tl.sum(weights, 1)
        accumulator = accumulator * rescale[:, None] + tl.dot(weights.to(block_values.dtype), block_values,
                                                              input_precision=PRECISION)
        running_max = new_max
    stats = (segment * splits + split) * GROUP + g
    tl.store(maxima + stats, running_max, mask=in_group)
    tl.store(sums + stats, running_sum, mask=in_group)
    tl.store(partial + stats[:, None] * HEAD_DIM + d[None, :], accumulator,
             mask=in_group[:, None] & in_dim[None, :])


@triton.jit
def merge_kernel(partial, maxima, sums, output, output_stride_b, output_stride_h, lengths, position_addresses,
                 num_kv, sink, local, keys_per_split, splits, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    """One query head of one segment, BLOCK_D of its head_dim: merge the partial results of the splits that hold
    entries, BLOCK_S at a time (an online softmax over the splits), write the output, and count the step's entry
    (the program of the segment's first head and chunk adds one to its length).

    Another program of the segment may read the length after that program counted it, and then merges one split
    more: a split past this step's entries, which the step kernel left empty (maximum -inf, sum 0), so it adds
    nothing."""
    segment, g, chunk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    batch_row, head = segment // num_kv, segment % num_kv
    length = tl.load(lengths + segment)
    entries = length + 1
    if tl.load(position_addresses + segment) != 0:
        entries = tl.minimum(entries, sink + local)
    used = tl.minimum(tl.cdiv(entries, keys_per_split), splits)  # later splits start past the end: empty
    s = tl.arange(0, BLOCK_S)
    d = chunk * BLOCK_D + tl.arange(0, BLOCK_D)
    in_dim = d < HEAD_DIM
    running_max = tl.full([], float("-inf"), tl.float32)
    running_sum = tl.zeros([], tl.float32)
    total = tl.zeros([BLOCK_D], tl.float32)
    for first in range(0, used, BLOCK_S):
        valid = first + s < used
        stats = (segment * splits + first + s) * GROUP + g
        split_max = tl.load(maxima + stats, mask=valid, other=float("-inf"))
        new_max = tl.maximum(running_max, tl.max(split_max, 0))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        rescale = tl.exp(running_max - shift)
        weights = tl.exp(split_max - shift)
        running_sum = running_sum * rescale + tl.sum(weights * tl.load(sums + stats, mask=valid, other=0.0), 0)
        rows = tl.load(partial + stats[:, None] * HEAD_DIM + d[None, :], mask=valid[:, None] & in_dim[None, :],
                       other=0.0)
        total = total * rescale + tl.sum(weights[:, None] * rows, 0)
        running_max = new_max
    row = output + batch_row * output_stride_b + (head * GROUP + g) * output_stride_h + d
    tl.store(row, (total / running_sum).to(output.dtype.element_ty), mask=in_dim)  # split 0 holds the new entry
    if g == 0 and chunk == 0:
        tl.store(lengths + segment, length + 1)
