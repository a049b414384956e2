"""`ElasticCacheLayer`: the bounded cache of one decoder layer, over the per-sequence stores of `cache.stores`.

It stages, writes and attends each step's entries (`cache.bounded` describes the storage and the paths a step takes)
and, on a CUDA GPU with Triton, runs decode steps through the fused kernels of `cache.triton_decode`.
"""

from __future__ import annotations

import weakref
from typing import Protocol

import torch
from transformers.cache_utils import CacheLayerMixin

from elastic_attention.cache.stores import (
    SequenceStore,
    StreamingWindow,
    StagedEntries,
    append_full,
    reserve_full,
    reserve_ring,
    write_ring,
)
from elastic_attention.cache.triton_decode import (
    DecodeKernelOptions,
    DecodeSegments,
    decode_step,
    triton_decode_available,
    write_step_entries,
)
from elastic_attention.cache.token_attention import (
    attend_single_query,
    causal_suffix_attention,
    single_query_kernels,
    streaming_suffix_attention,
    token_attention,
)
from elastic_attention.errors import InputError
from elastic_attention.patterns import SequenceLayout


class LayerOwner(Protocol):
    """What a layer reads from the cache that holds it (`cache.bounded.ElasticCache`). A protocol, so this module
    does not import `cache.bounded`, which builds the layers.

    Attributes:
        layout: the sequences of the forward that is updating the cache (None before the first).
        window: the streaming heads' sink and local window.
        model_window: the model's own sliding window on every layer (None: none).
        softcap: the model's attention-logit soft-cap (None: none).
        explicit_attention: True when steps attend through `token_attention` (soft-cap, sinks or a model window).
        fused_decode: True when decode steps may run through the fused kernels.
        kernel_options: options of the fused decode kernels (None: their defaults).
        max_length: the most tokens a sequence may reach (None: no limit).
        static_steps: decode steps replayed in static mode, which the host-side lengths leave out.
    """

    layout: SequenceLayout | None
    window: StreamingWindow
    model_window: int | None
    softcap: float | None
    explicit_attention: bool
    fused_decode: bool
    kernel_options: DecodeKernelOptions | None
    max_length: int | None
    static_steps: int

    def head_lists(self, layer_index: int, sequence: int, num_kv_heads: int) -> tuple[list[int], list[int]]: ...

    def head_split(self, layer_index: int, sequence: int, num_kv_heads: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]: ...

    def prefill_capacity(self, longest: int, device: torch.device, dtype: torch.dtype) -> int: ...


class ElasticCacheLayer(CacheLayerMixin):
    """The bounded cache of one decoder layer."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    @property
    def cache(self) -> LayerOwner:
        cache = self._cache()
        if cache is None:
            raise InputError("this cache layer's ElasticCache is gone; keep the cache while its layers are used")
        return cache

    def __init__(self, cache: LayerOwner, layer_index: int) -> None:
        super().__init__()
        # A weak reference: a cache and its layers must not form a reference cycle, or a dropped cache keeps its
        # tensors until Python's cycle collector happens to run (GPU memory grew by every generate call's cache).
        self._cache = weakref.ref(cache)
        self.layer_index = layer_index
        self.sequences: list[SequenceStore] = []
        self.physical_length = 0
        self._staged: list[StagedEntries | None] = []
        #: A prefill's keys and values [B, Hkv, S, D] and its sequences' spans, stored at `commit` (after the layer's
        #: attention is launched: the stores need the routing on the host); None otherwise.
        self._prefill: tuple[torch.Tensor, torch.Tensor, list] | None = None
        #: Storage addresses for the fused decode step (None: rebuild before the next one).
        self._segments: DecodeSegments | None = None
        #: A fused decode step's new keys and values [B, Hkv, 1, D], between `update` and `attend`.
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None
        #: Decode steps this layer ran through the fused kernels.
        self.fused_steps = 0
        #: In static mode (`ElasticCache.begin_static`): (the most entries any segment can reach: the capacity, or the
        #: ring's size where every head streams; the entries of all segments when it began), which fix the fused
        #: kernel's key splits; None otherwise.
        self._static: tuple[int, int] | None = None

    # -- the Hugging Face layer interface ------------------------------------------------------------------------

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Store a step's new entries ([B, Hkv, S_new, D]; a prefill's at `commit`); returns them unchanged (a
        prefill attends them)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.commit()
        layout = self.cache.layout
        if layout is None or key_states.shape[2] != layout.query_len:
            raise InputError("ElasticCache.update got states that do not match the current forward's inputs")
        if self._static is not None:
            if key_states.shape[0] != len(self.sequences) or not self._is_fused_decode_step(layout, key_states):
                raise InputError("a static decode step takes one new token per sequence, every batch row kept")
            self._pending = (key_states, value_states)
            return key_states, value_states
        spans = layout.spans()
        for span in spans:
            self._check_limit(span.key_len)
        if not self.sequences and layout.is_prefill:
            self._prefill = (key_states, value_states, spans)  # stored by `commit`, after the attention's launch
            return key_states, value_states
        if not self.sequences:
            self.sequences = [self._new_store(n, key_states) for n in range(layout.num_sequences)]
        elif len(self.sequences) != layout.num_sequences:
            raise InputError(
                f"the cache holds {len(self.sequences)} sequences but this step has {layout.num_sequences}; "
                "keep the batch rows from prefill to the last step"
            )
        if self._is_fused_decode_step(layout, key_states):
            self._reserve_step()
            self._pending = (key_states, value_states)
            for store in self.sequences:
                store.length += 1
            self.physical_length += 1
            return key_states, value_states
        self._store(key_states, value_states, spans)
        return key_states, value_states

    def _store(self, key_states: torch.Tensor, value_states: torch.Tensor, spans, *, stage: bool = True) -> None:
        """Append a forward's new entries to each sequence's full heads and stage its streaming heads' entries (which
        this forward's attention reads with the ring's), or (``stage`` False: a prefill nothing attends any more)
        write them into the rings now, copying only those a ring keeps."""
        self._segments = None
        for store, span in zip(self.sequences, spans):
            count = span.query_count
            new_keys = key_states[span.row, :, span.first_query_row : span.first_query_row + count]
            new_values = value_states[span.row, :, span.first_query_row : span.first_query_row + count]
            append_full(store, new_keys[store.full_heads], new_values[store.full_heads], self.cache.model_window)
            if stage:
                self._staged.append(StagedEntries(new_keys[store.ring_heads], new_values[store.ring_heads],
                                                  store.length))
            else:
                write_ring(store, new_keys, new_values, store.length, self.cache.window, heads=store.ring_heads)
            store.length += count
        self.physical_length += key_states.shape[2]

    def _check_limit(self, length: int) -> None:
        limit = self.cache.max_length
        if limit is not None and length > limit:
            raise InputError(
                f"sequence length {length} exceeds the cache's max_length {limit}; "
                "create ElasticCache with a larger max_length (or None to grow as needed)"
            )

    def get_seq_length(self) -> int:
        """Length of the key axis seen so far (padding included), as Hugging Face counts it."""
        return self.physical_length + self.cache.static_steps

    def get_mask_sizes(self, query_length, *args, **kwargs) -> tuple[int, int]:
        length = query_length.shape[0] if isinstance(query_length, torch.Tensor) else int(query_length)
        return self.get_seq_length() + length, 0

    def get_max_length(self) -> int:
        return -1 if self.cache.max_length is None else self.cache.max_length

    def reset(self) -> None:
        self.sequences, self._staged, self.physical_length, self._prefill = [], [], 0, None
        self._segments, self._pending, self._static = None, None, None
        self.is_initialized = False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.commit()
        self.sequences = [self.sequences[int(i)].clone() for i in beam_idx.tolist()]
        self._segments = None

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.commit()
        self.sequences = [store.clone() for store in self.sequences for _ in range(repeats)]
        self._segments = None

    def offload(self):
        raise NotImplementedError("ElasticCache does not offload; it keeps only what the heads read again")

    def prefetch(self):
        return None

    # -- elastic attention ---------------------------------------------------------------------------------------

    def attend(self, query: torch.Tensor, scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of a step that continues the cached past, by the token rule; then commits the step.

        Args:
            query: [B, Hq, S_new, D].
            scale: softmax scale.
            sinks: [Hq] attention-sink logits of the layer (models with sinks), else None.

        Returns:
            [B, Hq, S_new, D]; rows that belong to no sequence are zero.
        """
        if self._pending is not None:
            return self._attend_fused(query, scale)
        layout = self.cache.layout
        output = torch.zeros_like(query)
        num_kv = self.sequences[0].full_heads.numel() + self.sequences[0].ring_heads.numel()
        group = query.shape[1] // num_kv
        with single_query_kernels():  # entered once per layer: entering costs tens of microseconds
            spans = zip(self.sequences, self._staged, layout.spans())
            for index, (store, staged, (row, _, length, first_row, count)) in enumerate(spans):
                if count == 0:
                    continue
                queries = query[row, :, first_row : first_row + count].unflatten(0, (num_kv, group))
                result = output[row, :, first_row : first_row + count].unflatten(0, (num_kv, group))
                if self.cache.explicit_attention:
                    self._attend_explicit(store, staged, queries, result, scale,
                                          None if sinks is None else sinks.view(num_kv, group))
                elif count == 1:
                    self._attend_one(store, staged, queries, result, scale)
                    self._staged[index] = None
                else:
                    self._attend_many(store, staged, queries, result, scale)
        self.commit()
        return output

    def _attend_many(self, store: SequenceStore, staged: StagedEntries, queries: torch.Tensor, result: torch.Tensor,
                     scale: float) -> None:
        """Several new queries of one sequence (a prefill chunk) under the token rule, before the ring is written.

        Full-store heads keep every key in position order: one fused causal call. Ring heads whose sink and window
        are complete (the chunk starts at ``sink + local`` or later) read the sink and the window in position order
        (the ring rotated) followed by the chunk's own keys: fused calls with a band mask. A chunk that starts
        earlier goes through the general `token_attention`.

        Args:
            queries, result: [Hkv, g, n, D] views of the step's queries and of the output rows.
        """
        window = self.cache.window
        sink, local = window.sink_tokens, window.local_tokens
        length, count = store.length, queries.shape[2]
        first = length - count
        if store.full_heads.numel():
            heads = store.full_heads
            result[heads] = causal_suffix_attention(queries[heads], store.full_keys[:, :length],
                                                    store.full_values[:, :length], scale)
        if not store.ring_heads.numel():
            return
        heads = store.ring_heads
        if first >= sink + local:
            shift = (first - sink) % local  # the window slot of position first - local
            window = [torch.cat([ring[:, sink:].roll(-shift, dims=1), new], dim=1)
                      for ring, new in ((store.ring_keys, staged.keys), (store.ring_values, staged.values))]
            result[heads] = streaming_suffix_attention(
                queries[heads], store.ring_keys[:, :sink], store.ring_values[:, :sink], *window,
                local_tokens=local, scale=scale,
            )
            return
        query_positions = torch.arange(first, length, device=queries.device)
        result[heads] = token_attention(
            queries[heads], torch.cat([store.ring_keys, staged.keys], dim=1),
            torch.cat([store.ring_values, staged.values], dim=1), query_positions,
            torch.cat([store.ring_positions, query_positions]), torch.ones_like(heads, dtype=torch.bool),
            sink_tokens=sink, local_tokens=local, scale=scale,
        )

    def _attend_explicit(self, store: SequenceStore, staged: StagedEntries, queries: torch.Tensor,
                         result: torch.Tensor, scale: float, sinks: torch.Tensor | None) -> None:
        """New queries of one sequence when the model soft-caps its attention logits, has attention sinks or slides a
        window on every layer: every head through `token_attention` (the fused kernels have none of them), ring heads
        over the ring and the staged entries.

        Args:
            queries, result: [Hkv, g, n, D] views of the step's queries and of the output rows.
            sinks: [Hkv, g] sink logits, or None.
        """
        window = self.cache.window
        length, count = store.length, queries.shape[2]
        query_positions = torch.arange(length - count, length, device=queries.device)
        rule = dict(sink_tokens=window.sink_tokens, local_tokens=window.local_tokens, scale=scale,
                    softcap=self.cache.softcap, window_tokens=self.cache.model_window)
        if store.full_heads.numel():
            heads, kept = store.full_heads, store.full_count
            result[heads] = token_attention(
                queries[heads], store.full_keys[:, :kept], store.full_values[:, :kept], query_positions,
                torch.arange(store.full_first, length, device=queries.device),
                torch.zeros_like(heads, dtype=torch.bool), **rule, sinks=None if sinks is None else sinks[heads],
            )
        if store.ring_heads.numel():
            heads = store.ring_heads
            result[heads] = token_attention(
                queries[heads], torch.cat([store.ring_keys, staged.keys], dim=1),
                torch.cat([store.ring_values, staged.values], dim=1), query_positions,
                torch.cat([store.ring_positions, query_positions]), torch.ones_like(heads, dtype=torch.bool), **rule,
                sinks=None if sinks is None else sinks[heads],
            )

    def _attend_one(self, store: SequenceStore, staged: StagedEntries, queries: torch.Tensor, result: torch.Tensor,
                    scale: float) -> None:
        """A single new query (a decode step) of one sequence: every kept entry is visible, so no mask is needed.

        A full-store head sees all its entries. A ring head sees its sink and the last ``local_tokens`` positions,
        which is the whole ring once the step's entry is written, since that entry takes the slot of position
        ``p - local_tokens``, the one that just left the window; empty slots (a ring not yet filled) are masked.

        Args:
            queries, result: [Hkv, g, 1, D] views of the step's queries and of the output rows.
        """
        if store.full_heads.numel():
            heads = store.full_heads
            result[heads] = attend_single_query(queries[heads], store.full_keys[:, : store.length],
                                                store.full_values[:, : store.length], scale)
        if store.ring_heads.numel():
            write_ring(store, staged.keys, staged.values, staged.first, self.cache.window)
            heads = store.ring_heads
            window = self.cache.window
            filled = None if store.length >= window.ring_size else store.ring_positions >= 0
            result[heads] = attend_single_query(queries[heads], store.ring_keys, store.ring_values, scale, filled)

    # -- static mode (captured decode steps) ---------------------------------------------------------------------

    def begin_static(self, capacity: int) -> None:
        """Preallocate every store for positions ``0 .. capacity - 1`` (a ring at ``min(capacity, sink + local)``
        slots) and build the address table once; until `end_static` a step only writes device state (the kernels
        count each segment's length), so it can be captured and replayed."""
        self.commit()
        for store in self.sequences:
            reserve_full(store, capacity - store.full_first, spare=False)
            reserve_ring(store, capacity, self.cache.window.ring_size, spare=False)
        self._segments = self._build_segments()
        self._static = (self._longest_segment(capacity), self._entries_read())

    def end_static(self, steps: int) -> None:
        """Leave static mode after ``steps`` replayed steps: count them in the host-side lengths. The address table
        is dropped (the next fused step builds its own from those lengths): a captured step keeps it, and may
        give it to another cache (`adopt_static_table`)."""
        for store in self.sequences:
            store.length += steps
        self.physical_length += steps
        self.fused_steps += steps
        self._static, self._segments = None, None

    def static_table(self) -> tuple[DecodeSegments, tuple[int, int]]:
        """In static mode: the address table the steps read and advance, and (the most entries a segment can reach,
        the entries of all segments when static mode began), which fix the fused kernel's key splits."""
        return self._segments, self._static

    def adopt_static_table(self, segments: DecodeSegments, static: tuple[int, int]) -> None:
        """In static mode: copy this layer's address table into ``segments`` (a captured step's table, of the same
        shape, read by its kernels at every replay) and make it this layer's, with the captured step's ``static``
        (`static_table`; its most entries at least this layer's), so that the step replays over this layer's
        storage."""
        segments.copy_(self._segments)
        self._segments, self._static = segments, static

    def device_lengths(self) -> torch.Tensor:
        """int64 [N * Hkv] each segment's length on the device (static mode), which every step advances."""
        return self._segments.lengths

    # -- the fused decode step ----------------------------------------------------------------------------------

    def _is_fused_decode_step(self, layout, key_states: torch.Tensor) -> bool:
        """True when this step is one new token per sequence (sequence n in batch row n) that the fused path takes."""
        if not self.cache.fused_decode or key_states.stride(3) != 1 or not layout.is_single_token_step:
            return False
        if key_states.dtype != self.sequences[0].ring_keys.dtype:
            return False
        return triton_decode_available(key_states.device, key_states.dtype)

    def _reserve_step(self) -> None:
        """Make room for one more entry in every store; storage that moves invalidates the address table."""
        for store in self.sequences:
            moved_full = reserve_full(store, store.full_count + 1, spare=True)
            if reserve_ring(store, store.length + 1, self.cache.window.ring_size, spare=True) or moved_full:
                self._segments = None
        if self._segments is None:
            self._segments = self._build_segments()

    def _build_segments(self) -> DecodeSegments:
        """The address table of this layer's (sequence, KV head) segments, lengths as they are before the step."""
        columns: list[list[int]] = [[], [], [], []]  # key, value and position addresses, lengths
        num_kv = 0
        head_lists = self._head_lists()
        for store, (full_heads, ring_heads) in zip(self.sequences, head_lists):
            where = {}  # KV head -> (its store, its index there)
            for kind, heads in (("full", full_heads), ("ring", ring_heads)):
                for index, head in enumerate(heads):
                    where[head] = (kind, index)
            num_kv = len(where)
            for head in range(num_kv):
                kind, index = where[head]
                keys, values = (store.full_keys, store.full_values) if kind == "full" else (store.ring_keys,
                                                                                            store.ring_values)
                head_bytes = keys.stride(0) * keys.element_size()
                columns[0].append(keys.data_ptr() + index * head_bytes)
                columns[1].append(values.data_ptr() + index * head_bytes)
                columns[2].append(store.ring_positions.data_ptr() if kind == "ring" else 0)
                columns[3].append(store.length)
        return DecodeSegments.from_columns(*columns, num_kv_heads=num_kv, device=self.device)

    def _head_lists(self) -> list[tuple[list[int], list[int]]]:
        """Per sequence, its full and its streaming KV heads as host lists, in the order of its stores
        (`ElasticCache.head_lists`): building an address table never waits for the GPU."""
        return [self.cache.head_lists(self.layer_index, sequence, store.full_heads.numel() + store.ring_heads.numel())
                for sequence, store in enumerate(self.sequences)]

    def _write_pending(self) -> None:
        keys, values = self._pending
        window = self.cache.window
        write_step_entries(keys, values, self._segments, sink_tokens=window.sink_tokens,
                           local_tokens=window.local_tokens)
        self._pending = None

    def _attend_fused(self, query: torch.Tensor, scale: float) -> torch.Tensor:
        """The fused decode step: write every sequence's new entries and attend them (`triton_decode.decode_step`)."""
        (keys, values), self._pending = self._pending, None
        window = self.cache.window
        if self._static is not None:  # the steps are counted when static mode ends
            max_entries, total_entries = self._static
        else:
            self.fused_steps += 1
            max_entries = self._longest_segment()
            total_entries = self._entries_read()
        return decode_step(query, keys, values, self._segments, scale, sink_tokens=window.sink_tokens,
                           local_tokens=window.local_tokens, max_entries=max_entries, total_entries=total_entries,
                           options=self.cache.kernel_options)

    def commit(self) -> None:
        """Store a prefill's entries (its stores built from the routing, full stores with room for the decode steps
        to come: `ElasticCache.prefill_capacity`), then write the staged entries of the streaming heads into their
        rings (sink slots and the window)."""
        if self._prefill is not None:
            key_states, value_states, spans = self._prefill
            self._prefill = None
            capacity = self.cache.prefill_capacity(max(span.query_count for span in spans), self.device, self.dtype)
            self.sequences = [self._new_store(n, key_states, capacity) for n in range(len(spans))]
            self._store(key_states, value_states, spans, stage=False)
        if self._pending is not None:
            self._write_pending()
        for store, staged in zip(self.sequences, self._staged):
            if staged is not None:
                write_ring(store, staged.keys, staged.values, staged.first, self.cache.window)
        self._staged = []

    def nbytes(self) -> int:
        return sum(store.nbytes() for store in self.sequences)

    # -- storage -------------------------------------------------------------------------------------------------

    def _new_store(self, sequence: int, key_states: torch.Tensor, full_capacity: int = 0) -> SequenceStore:
        """An empty store for ``sequence``, its heads split by the routing; room for ``full_capacity`` entries in its
        full store."""
        num_kv, head_dim = key_states.shape[1], key_states.shape[3]
        full_heads, ring_heads = self.cache.head_split(self.layer_index, sequence, num_kv, key_states.device)
        full_capacity = full_capacity if full_heads.numel() else 0  # no full head: nothing to hold
        new = lambda heads, size=0: key_states.new_zeros(heads.numel(), size, head_dim)  # noqa: E731
        return SequenceStore(
            full_heads=full_heads,
            full_keys=new(full_heads, full_capacity),
            full_values=new(full_heads, full_capacity),
            ring_heads=ring_heads,
            ring_keys=new(ring_heads),
            ring_values=new(ring_heads),
            ring_positions=torch.full((0,), -1, dtype=torch.long, device=key_states.device),
        )

    def _longest_segment(self, capacity: int | None = None) -> int:
        """The most entries a segment of this layer holds in this step, counting its entry (with ``capacity``: can
        hold in any step up to position ``capacity - 1``): a full store's every position, a ring at most its size.
        The fused step's key splits cover it."""
        ring_size = self.cache.window.ring_size
        return max(length if store.full_heads.numel() else min(length, ring_size)
                   for store in self.sequences for length in [capacity or store.length])

    def _entries_read(self) -> int:
        """Entries a decode step of this layer reads over every sequence and head (`SequenceStore.kept_entries`)."""
        return sum(store.kept_entries(self.cache.window.ring_size) for store in self.sequences)
