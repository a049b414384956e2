"""`ElasticCache`: a Hugging Face KV cache that keeps, per layer, sequence and KV head, only what that head reads again.

Heads on full attention (and XA, which attends every key after the prompt) keep every entry. Heads on SSA keep the
``sink_tokens`` first entries and the last ``local_tokens`` entries in a ring buffer: exactly what the token rule of
`patterns.tokens` lets their later queries see. The rest is never stored, so the memory is released, not masked.

The cache takes its routing explicitly from the runtime that drives it: the layout of each forward
(`ElasticCache.begin_forward`) and, at a prefill, each layer's streaming heads per sequence (`route_layer`).

Storage is per sequence (one sequence per batch row), so every sample keeps its own routing:
  full store: keys/values [F, capacity, D] for its F retained heads, entries in position order;
  ring store: keys/values [P, capacity, D] for its P streaming heads, plus the logical position of each slot
  ([capacity], -1 when empty). Position p < sink goes to slot p; later positions to slot sink + (p - sink) mod local.
  A ring grows with its sequence up to sink + local slots (until then slot p holds position p), so no store ever
  holds more than a full cache of the same sequence would.

A step's new entries are staged by `update`. A chunk of several tokens writes them to the ring after its attention
(`commit`), so a chunk longer than the window still sees its own earlier tokens; a single-token step writes first and
then attends the whole ring, whose slots then hold exactly its visible window. Full-store heads are appended at once.
Under a model window on every layer (Mistral 7B v0.1) a full store forgets the entries no later query can see, so it
holds at most about twice that window, and every step attends in torch by the composed token rule.

In static mode (`ElasticCache.begin_static`, entered by `integration.decode_graph` to capture decode steps as a CUDA
graph) every full store is allocated for a capacity up front (the longest sequence plus max(256, 1/32) tokens) and
every ring at its sink + local slots; lengths then advance on the device, and the host-side ones catch up when static
mode ends.

A decode step (one new token per sequence) on a CUDA GPU with Triton takes the fused path of
`cache.triton_decode`: whatever the batch size, one launch per layer writes the new entries of every sequence and
head and attends them all, split over the keys, and a second merges the splits and counts the entries, through a
table of the layer's storage addresses that is rebuilt only when storage moves (a full store grows, the batch is
reordered). Elsewhere, and with ``fused_decode=False``, the step runs per sequence in torch, which is also the
oracle of the fused path.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicSlidingWindowLayer

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
from elastic_attention.attached import attached_runtime
from elastic_attention.errors import InputError
from elastic_attention.patterns import SequenceLayout


@dataclass
class SequenceStore:
    """What one layer keeps of one sequence.

    ``full_keys[:, i]`` holds position ``full_first + i``. ``full_first`` is 0 except under a model window on every
    layer, where a full head forgets what no later query can see (and every step takes `_attend_explicit`).
    """

    full_heads: torch.Tensor
    full_keys: torch.Tensor
    full_values: torch.Tensor
    ring_heads: torch.Tensor
    ring_keys: torch.Tensor
    ring_values: torch.Tensor
    ring_positions: torch.Tensor
    length: int = 0
    full_first: int = 0

    @property
    def full_count(self) -> int:
        """Entries the full store holds: positions ``full_first .. length - 1``."""
        return self.length - self.full_first

    def kept_entries(self, ring_size: int, length: int | None = None) -> int:
        """Entries a decode step reads over all heads once the sequence has ``length`` tokens (None: ``self.length``):
        every full-store entry and every filled slot of a ring of ``ring_size`` slots."""
        length = self.length if length is None else length
        return (self.full_heads.numel() * (length - self.full_first)
                + self.ring_heads.numel() * min(length, ring_size))

    def clone(self) -> SequenceStore:
        return SequenceStore(*(t.clone() for t in (self.full_heads, self.full_keys, self.full_values,
                                                    self.ring_heads, self.ring_keys, self.ring_values,
                                                    self.ring_positions)), self.length, self.full_first)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.full_keys, self.full_values, self.ring_keys,
                                                           self.ring_values, self.ring_positions))


@dataclass
class StagedEntries:
    """A step's new entries for one sequence's ring heads: keys/values [P, n, D] at positions ``first .. first+n-1``."""

    keys: torch.Tensor
    values: torch.Tensor
    first: int


@dataclass(frozen=True)
class StreamingWindow:
    """What a streaming (SSA) head keeps: its first ``sink_tokens`` positions and its last ``local_tokens``."""

    sink_tokens: int
    local_tokens: int

    @property
    def ring_size(self) -> int:
        """Slots of a streaming head's ring: sink + local."""
        return self.sink_tokens + self.local_tokens


class ElasticCacheLayer(CacheLayerMixin):
    """The bounded cache of one decoder layer."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    @property
    def cache(self) -> ElasticCache:
        cache = self._cache()
        if cache is None:
            raise InputError("this cache layer's ElasticCache is gone; keep the cache while its layers are used")
        return cache

    def __init__(self, cache: ElasticCache, layer_index: int) -> None:
        super().__init__()
        # A weak reference: a cache and its layers must not form a reference cycle, or a dropped cache keeps its
        # tensors until Python's cycle collector happens to run (GPU memory grew by every generate call's cache).
        self._cache = weakref.ref(cache)
        self.layer_index = layer_index
        self.sequences: list[SequenceStore] = []
        self.physical_length = 0
        self._staged: list[StagedEntries | None] = []
        #: Storage addresses for the fused decode step (None: rebuild before the next one).
        self._segments: DecodeSegments | None = None
        #: A fused decode step's new keys and values [B, Hkv, 1, D], between `update` and `attend`.
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None
        #: Decode steps this layer ran through the fused kernels.
        self.fused_steps = 0
        #: In static mode (`ElasticCache.begin_static`): (capacity, entries of all segments when it began), which fix
        #: the fused kernel's key splits; None otherwise.
        self._static: tuple[int, int] | None = None

    # -- the Hugging Face layer interface ------------------------------------------------------------------------

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Store a step's new entries ([B, Hkv, S_new, D]); returns them unchanged (a prefill attends them)."""
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
        if not self.sequences:
            self.sequences = [self._new_store(n, key_states) for n in range(layout.num_sequences)]
        elif len(self.sequences) != layout.num_sequences:
            raise InputError(
                f"the cache holds {len(self.sequences)} sequences but this step has {layout.num_sequences}; "
                "keep the batch rows from prefill to the last step"
            )
        spans = layout.spans()
        for span in spans:
            self._check_limit(span.key_len)
        if self._is_fused_decode_step(layout, key_states):
            self._reserve_step()
            self._pending = (key_states, value_states)
            for store in self.sequences:
                store.length += 1
            self.physical_length += 1
            return key_states, value_states
        self._segments = None
        for store, span in zip(self.sequences, spans):
            count = span.query_count
            new_keys = key_states[span.row, :, span.first_query_row : span.first_query_row + count]
            new_values = value_states[span.row, :, span.first_query_row : span.first_query_row + count]
            self._append_full(store, new_keys[store.full_heads], new_values[store.full_heads],
                              self.cache.model_window)
            self._staged.append(StagedEntries(new_keys[store.ring_heads], new_values[store.ring_heads], store.length))
            store.length += count
        self.physical_length += key_states.shape[2]
        return key_states, value_states

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
        self.sequences, self._staged, self.physical_length = [], [], 0
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
            self._write_ring(store, staged)
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
            self._reserve_full(store, capacity - store.full_first, spare=False)
            self._reserve_ring(store, capacity, spare=False)
        self._segments = self._build_segments()
        self._static = (capacity, self._entries_read())

    def end_static(self, steps: int) -> None:
        """Leave static mode after ``steps`` replayed steps: count them in the host-side lengths."""
        for store in self.sequences:
            store.length += steps
        self.physical_length += steps
        self.fused_steps += steps
        self._static = None

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
            moved_full = self._reserve_full(store, store.full_count + 1, spare=True)
            if self._reserve_ring(store, store.length + 1, spare=True) or moved_full:
                self._segments = None
        if self._segments is None:
            self._segments = self._build_segments()

    def _build_segments(self) -> DecodeSegments:
        """The address table of this layer's (sequence, KV head) segments, lengths as they are before the step."""
        columns: list[list[int]] = [[], [], [], []]  # key, value and position addresses, lengths
        num_kv = 0
        for store in self.sequences:
            where = {}  # KV head -> (its store, its index there)
            for kind, heads in (("full", store.full_heads), ("ring", store.ring_heads)):
                for index, head in enumerate(heads.tolist()):
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
            max_entries = max(store.length for store in self.sequences)  # counting this step's entry
            total_entries = self._entries_read()
        return decode_step(query, keys, values, self._segments, scale, sink_tokens=window.sink_tokens,
                           local_tokens=window.local_tokens, max_entries=max_entries, total_entries=total_entries,
                           options=self.cache.kernel_options)

    def commit(self) -> None:
        """Write the staged entries of the streaming heads into their rings (sink slots and the window)."""
        if self._pending is not None:
            self._write_pending()
        for store, staged in zip(self.sequences, self._staged):
            if staged is not None:
                self._write_ring(store, staged)
        self._staged = []

    def _write_ring(self, store: SequenceStore, staged: StagedEntries) -> None:
        """Write a step's entries into a sequence's ring: those in the sink and the last ``local_tokens``.

        Slots are computed from host integers, so no step waits for the GPU.
        """
        count = staged.keys.shape[1]
        if not store.ring_heads.numel() or count == 0:
            return
        window = self.cache.window
        sink, local = window.sink_tokens, window.local_tokens
        first = staged.first
        self._reserve_ring(store, first + count, spare=count == 1)
        if count == 1:
            slot = first if first < sink else sink + (first - sink) % local
            store.ring_keys[:, slot] = staged.keys[:, 0]
            store.ring_values[:, slot] = staged.values[:, 0]
            store.ring_positions[slot : slot + 1].fill_(first)  # a kernel, not a host-to-device copy
            return
        sink_end = min(count, max(0, sink - first))  # entries [0, sink_end) fall in the sink
        window_start = max(sink_end, count - local)  # entries [window_start, count) fall in the window
        device = staged.keys.device
        index = torch.cat([torch.arange(sink_end, device=device), torch.arange(window_start, count, device=device)])
        positions = index + first
        slots = torch.where(positions < sink, positions, sink + (positions - sink) % local)
        store.ring_keys[:, slots] = staged.keys[:, index]
        store.ring_values[:, slots] = staged.values[:, index]
        store.ring_positions[slots] = positions

    def nbytes(self) -> int:
        return sum(store.nbytes() for store in self.sequences)

    # -- storage -------------------------------------------------------------------------------------------------

    def _new_store(self, sequence: int, key_states: torch.Tensor) -> SequenceStore:
        num_kv, head_dim = key_states.shape[1], key_states.shape[3]
        streaming = self.cache.streaming_heads(self.layer_index, sequence, num_kv).to(key_states.device)
        full_heads, ring_heads = (~streaming).nonzero().flatten(), streaming.nonzero().flatten()
        new = lambda heads: key_states.new_zeros(heads.numel(), 0, head_dim)  # noqa: E731
        return SequenceStore(
            full_heads=full_heads,
            full_keys=new(full_heads),
            full_values=new(full_heads),
            ring_heads=ring_heads,
            ring_keys=new(ring_heads),
            ring_values=new(ring_heads),
            ring_positions=torch.full((0,), -1, dtype=torch.long, device=key_states.device),
        )

    def _entries_read(self) -> int:
        """Entries a decode step of this layer reads over every sequence and head (`SequenceStore.kept_entries`)."""
        return sum(store.kept_entries(self.cache.window.ring_size) for store in self.sequences)

    def _reserve_ring(self, store: SequenceStore, needed: int, *, spare: bool) -> bool:
        """Room in a sequence's ring for positions ``0 .. needed - 1`` (at most sink + local slots); returns True
        when its storage moved. Before a ring is full, slot p holds position p, so growing keeps every slot.
        ``spare`` adds 1/32 for the decode steps to come (see `_capacity`)."""
        size = self.cache.window.ring_size
        capacity = store.ring_keys.shape[1]
        if not store.ring_heads.numel() or min(needed, size) <= capacity:
            return False
        grown_capacity = min(size, _capacity(needed, spare))
        for name in ("ring_keys", "ring_values"):
            old = getattr(store, name)
            grown = old.new_zeros(old.shape[0], grown_capacity, old.shape[2])
            grown[:, :capacity] = old
            setattr(store, name, grown)
        positions = store.ring_positions.new_full((grown_capacity,), -1)
        positions[:capacity] = store.ring_positions
        store.ring_positions = positions
        return True

    @staticmethod
    def _reserve_full(store: SequenceStore, needed: int, *, spare: bool) -> bool:
        """Room for ``needed`` entries in a sequence's full store; returns True when its storage moved."""
        if not store.full_heads.numel() or needed <= store.full_keys.shape[1]:
            return False
        capacity = _capacity(needed, spare)
        for name in ("full_keys", "full_values"):
            old = getattr(store, name)
            grown = old.new_zeros(old.shape[0], capacity, old.shape[2])
            grown[:, : store.full_count] = old[:, : store.full_count]
            setattr(store, name, grown)
        return True

    @staticmethod
    def _forget_outside_window(store: SequenceStore, window: int) -> None:
        """Under a model window, drop the full store's entries that no query from position ``length`` on can see
        (positions <= length - window), once there are at least ``window`` of them, into storage for about twice the
        window: the store then holds at most about 2 x window entries after a prompt, copied once per ``window``
        steps."""
        drop = store.length - window + 1 - store.full_first
        if drop < window:
            return
        kept = store.full_count - drop
        for name in ("full_keys", "full_values"):
            old = getattr(store, name)
            fresh = old.new_zeros(old.shape[0], max(2 * window, kept + 1), old.shape[2])
            fresh[:, :kept] = old[:, drop : drop + kept]
            setattr(store, name, fresh)
        store.full_first += drop

    @classmethod
    def _append_full(cls, store: SequenceStore, keys: torch.Tensor, values: torch.Tensor,
                     window: int | None = None) -> None:
        if not store.full_heads.numel():
            return
        if window is not None:
            cls._forget_outside_window(store, window)
        kept = store.full_count
        needed = kept + keys.shape[1]
        cls._reserve_full(store, needed, spare=keys.shape[1] == 1)
        store.full_keys[:, kept:needed] = keys
        store.full_values[:, kept:needed] = values


class ElasticCache(Cache):
    """The bounded KV cache of a model with elastic attention attached (one `ElasticCacheLayer` per layer).

    `generate` uses it automatically after ``attach(model, config)`` (``cache="bounded"``, the default). Create one
    yourself to set ``max_length`` or to prefill a long prompt in chunks::

        cache = ElasticCache(model)
        for chunk in chunks:
            model(input_ids=chunk, past_key_values=cache, attention_mask=mask_so_far)

    Args:
        model: the attached model (or its runtime).
        max_length: most tokens per sequence (None: grows as needed); exceeding it raises.
        fused_decode: decode steps through the fused Triton kernels where they can run (a CUDA GPU with Triton);
            False keeps the per-sequence torch path everywhere.
        cuda_graphs: decode steps captured once as a CUDA graph and replayed (`integration.decode_graph`) where the
            fused kernels run; None takes the model's setting (``attach(..., cuda_graphs=...)``, default True).
        kernel_options: launch options of the fused decode kernel (None: `triton_decode.DEFAULT_KERNEL_OPTIONS`).
    """

    def __init__(self, model, max_length: int | None = None, fused_decode: bool = True,
                 cuda_graphs: bool | None = None, kernel_options: DecodeKernelOptions | None = None) -> None:
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < 1):
            raise InputError(f"`max_length` must be a positive number of tokens or None, got {max_length!r}")
        # The runtime itself, or a model that attach gave one.
        runtime = model if hasattr(model, "select_sequences") else attached_runtime(model)
        #: The runtime that routes for this cache: it pushes the layout of each forward (`begin_forward`) and each
        #: layer's routing at a prefill (`route_layer`), and is told when the batch is reordered.
        self.runtime = runtime
        self.window = StreamingWindow(runtime.config.sink_tokens, runtime.config.local_tokens)
        self.layout: SequenceLayout | None = None
        self._streaming: dict[int, torch.Tensor] = {}
        self.max_length = max_length
        #: The model's attention-logit soft-cap (None: none), whether it has attention sinks, and its sliding window
        #: on every layer (None: none): with any of them every step runs in torch (`token_attention`), never fused.
        self.softcap: float | None = runtime.softcap
        self.model_window: int | None = runtime.model_window
        #: True when steps must attend through `token_attention` (soft-cap, sinks or a model window).
        self.explicit_attention = self.softcap is not None or runtime.has_sinks or self.model_window is not None
        self.fused_decode = fused_decode and not self.explicit_attention
        self.cuda_graphs = runtime.cuda_graphs if cuda_graphs is None else cuda_graphs
        self.kernel_options = kernel_options
        #: Static mode (`begin_static`): the capacity in positions per sequence, else None; and the steps replayed
        #: since it began, which every layer's host-side lengths leave out until `end_static`.
        self.static_capacity: int | None = None
        self.static_steps = 0
        #: The captured decode step that replays this cache (set by `integration.decode_graph`; None without one).
        self.decode_graph = None
        # A model's sliding-window layers keep their own attention, so they keep transformers' own window cache.
        super().__init__(layers=[
            DynamicSlidingWindowLayer(sliding_window=runtime.sliding_window) if index in runtime.sliding_layers
            else ElasticCacheLayer(self, index) for index in range(runtime.num_layers)
        ])
        self._elastic_layers = [layer for layer in self.layers if isinstance(layer, ElasticCacheLayer)]

    def begin_forward(self, layout: SequenceLayout) -> None:
        """The sequences of the forward that is about to update this cache."""
        self.layout = layout

    @torch.compiler.disable  # a compiled decoder layer calls it as it is: its layer index stays a plain argument
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """transformers' `Cache.update`: layer ``layer_idx`` stores the step's entries (`ElasticCacheLayer.update`)."""
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def route_layer(self, layer_index: int, streaming: torch.Tensor) -> None:
        """A prefill's routing of one layer: ``streaming`` [N, Hkv] bool, True for the KV heads of each sequence
        that keep only their sink and window (SSA); the other heads keep every entry."""
        self._streaming[layer_index] = streaming.detach().to("cpu", torch.bool)

    def streaming_heads(self, layer_index: int, sequence: int, num_kv_heads: int) -> torch.Tensor:
        """[Hkv] bool (CPU): the routing of ``sequence`` in ``layer_index``; no streaming head when none was given."""
        streaming = self._streaming.get(layer_index)
        return torch.zeros(num_kv_heads, dtype=torch.bool) if streaming is None else streaming[sequence]

    # -- static mode -----------------------------------------------------------------------------------------------

    @property
    def can_be_static(self) -> bool:
        """True when decode steps can run in static mode: every layer bounded (no sliding-window layer), prefilled,
        its steps on the fused kernels."""
        layers = self._elastic_layers
        return (self.fused_decode and len(layers) == len(self.layers) and bool(layers[0].sequences)
                and triton_decode_available(layers[0].device, layers[0].dtype))

    @property
    def num_sequences(self) -> int:
        return len(self._elastic_layers[0].sequences)

    @property
    def longest(self) -> int:
        """Tokens of the longest sequence so far (static steps included)."""
        return max(store.length for store in self._elastic_layers[0].sequences) + self.static_steps

    def begin_static(self, capacity: int) -> None:
        """Enter static mode: storage for ``capacity`` positions per sequence, allocated now, and an address table
        that stays put, so that decode steps can be captured and replayed (`integration.decode_graph`). Every
        forward that is not a static step (and any reorder or reset) ends it first.

        Raises:
            InputError: the cache cannot be static (`can_be_static`), is already, or ``capacity`` leaves no room
                for another token or exceeds ``max_length``.
        """
        if self.static_capacity is not None or not self.can_be_static:
            raise InputError("this cache is already static or cannot be (it needs fused decode steps on every "
                             "layer, after a prefill)")
        if capacity <= self.longest or (self.max_length is not None and capacity > self.max_length):
            raise InputError(f"static capacity {capacity} must exceed the longest sequence ({self.longest} tokens) "
                             f"and stay within max_length ({self.max_length})")
        for layer in self._elastic_layers:
            layer.begin_static(capacity)
        self.static_capacity, self.static_steps = capacity, 0

    def end_static(self) -> None:
        """Leave static mode (nothing happens outside it): the host-side lengths count the replayed steps again and
        the captured step is dropped."""
        if self.static_capacity is None:
            return
        for layer in self._elastic_layers:
            layer.end_static(self.static_steps)
        self.static_capacity, self.static_steps, self.decode_graph = None, 0, None

    def device_lengths(self) -> list[torch.Tensor]:
        """Per layer, each segment's length on the device (static mode); see `ElasticCacheLayer.device_lengths`."""
        return [layer.device_lengths() for layer in self._elastic_layers]

    def reset(self) -> None:
        self.end_static()
        super().reset()

    def _select(self, index: torch.Tensor) -> None:
        index = index.to("cpu")
        self._streaming = {layer: streaming.index_select(0, index) for layer, streaming in self._streaming.items()}
        self.runtime.select_sequences(index)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.end_static()
        super().reorder_cache(beam_idx)
        self._select(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.end_static()
        super().batch_select_indices(indices)
        self._select(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.end_static()
        sequences = len(self._elastic_layers[0].sequences)
        super().batch_repeat_interleave(repeats)
        self._select(torch.arange(sequences).repeat_interleave(repeats))

    @property
    def fused_decode_steps(self) -> int:
        """Decode steps that ran through the fused kernels, replayed ones included (those of the first routed layer;
        every one takes the same path)."""
        return self._elastic_layers[0].fused_steps + self.static_steps

    def nbytes(self) -> int:
        """Bytes held by the stored keys, values and ring positions, all layers (sliding-window layers included)."""
        return sum(layer.nbytes() if isinstance(layer, ElasticCacheLayer) else _tensor_bytes(layer)
                   for layer in self.layers)


def cache_nbytes(cache) -> int:
    """Bytes of keys and values a cache holds: an `ElasticCache` (`ElasticCache.nbytes`), or a transformers cache
    of full tensors."""
    if isinstance(cache, ElasticCache):
        return cache.nbytes()
    return sum(_tensor_bytes(layer) for layer in cache.layers)


def _tensor_bytes(layer) -> int:
    """Bytes of a transformers cache layer's keys and values (0 before its first update)."""
    return sum(t.numel() * t.element_size() for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
               if isinstance(t, torch.Tensor))


def _capacity(needed: int, spare: bool) -> int:
    """Entries to allocate for ``needed``: exactly that for a prompt or chunk; for a decode step 1/32 more (at least
    one), so a store is copied every few dozen steps at long lengths and never holds more than about 3% beyond what
    a full cache of the same sequence holds."""
    return needed + (needed // 32 + 1 if spare else 0)
