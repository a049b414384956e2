"""The per-sequence storage of the bounded cache (`cache.bounded`), and the operations that grow and trim it.

One `SequenceStore` holds what one layer keeps of one sequence: a full store (keys/values [F, capacity, D] for its F
retained heads, entries in position order) and a ring store (keys/values [P, capacity, D] for its P streaming heads,
plus the logical position of each slot, [capacity], -1 when empty). The functions here reserve room in either store,
append to the full store, write a ring and, under a model window, forget what no later query can see; none needs the
cache layer that owns the store (`cache.layer.ElasticCacheLayer`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SequenceStore:
    """What one layer keeps of one sequence.

    ``full_keys[:, i]`` holds position ``full_first + i``. ``full_first`` is 0 except under a model window on every
    layer, where a full head forgets what no later query can see (and every step takes
    `ElasticCacheLayer._attend_explicit`).

    Attributes:
        full_heads: [F] the KV heads that keep every entry.
        full_keys, full_values: [F, capacity, D] their entries in position order (the first ``full_count`` used).
        ring_heads: [P] the streaming (SSA) KV heads.
        ring_keys, ring_values: [P, capacity, D] their ring slots (capacity at most sink + local).
        ring_positions: [capacity] int64, the position each slot holds (-1 when empty).
        length: tokens of the sequence so far.
        full_first: the position of the full store's first entry.
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


def reserve_ring(store: SequenceStore, needed: int, ring_size: int, *, spare: bool) -> bool:
    """Room in a sequence's ring for positions ``0 .. needed - 1`` (at most sink + local slots).

    Before a ring is full, slot p holds position p, so growing keeps every slot.

    Args:
        store: the sequence's storage; its ring keys/values [P, capacity, D] and positions [capacity] may be
            replaced by larger ones (new slots zero, their positions -1).
        needed: positions the ring must have room for.
        ring_size: most slots a ring holds (sink + local, `StreamingWindow.ring_size`).
        spare: add 1/32 for the decode steps to come (see `capacity_for`).

    Returns:
        True when its storage moved.
    """
    capacity = store.ring_keys.shape[1]
    if not store.ring_heads.numel() or min(needed, ring_size) <= capacity:
        return False
    grown_capacity = min(ring_size, capacity_for(needed, spare))
    for name in ("ring_keys", "ring_values"):
        old = getattr(store, name)
        grown = old.new_zeros(old.shape[0], grown_capacity, old.shape[2])
        grown[:, :capacity] = old
        setattr(store, name, grown)
    positions = store.ring_positions.new_full((grown_capacity,), -1)
    positions[:capacity] = store.ring_positions
    store.ring_positions = positions
    return True


def write_ring(store: SequenceStore, keys: torch.Tensor, values: torch.Tensor, first: int, window: StreamingWindow,
               heads: torch.Tensor | None = None) -> None:
    """Write entries at positions ``first .. first + n - 1`` into a sequence's ring: those that fall in the sink and
    the last ``local_tokens`` (nothing when it has no streaming head).

    Slots are computed from host integers, so no step waits for the GPU.

    Args:
        store: the sequence's storage; its ring may grow (`reserve_ring`).
        keys, values: [P, n, D] the entries of its P streaming heads, or with ``heads`` [Hkv, n, D] every KV head's
            (a prefill's, a view): the ring's entries are picked first and its heads second, so that the entries a
            ring never keeps (all but sink + local of a long prompt) are not copied.
        first: the position of the first entry.
        window: what a streaming head keeps.
        heads: [P] the streaming heads among ``keys``' (the store's ``ring_heads``); None: ``keys`` holds only them.
    """
    count = keys.shape[1]
    if not store.ring_heads.numel() or count == 0:
        return
    sink, local = window.sink_tokens, window.local_tokens
    reserve_ring(store, first + count, window.ring_size, spare=count == 1)
    if count == 1:
        slot = first if first < sink else sink + (first - sink) % local
        key, value = (keys[:, 0], values[:, 0]) if heads is None else (keys[heads, 0], values[heads, 0])
        store.ring_keys[:, slot] = key
        store.ring_values[:, slot] = value
        store.ring_positions[slot : slot + 1].fill_(first)  # a kernel, not a host-to-device copy
        return
    sink_end = min(count, max(0, sink - first))  # entries [0, sink_end) fall in the sink
    window_start = max(sink_end, count - local)  # entries [window_start, count) fall in the window
    device = keys.device
    index = torch.cat([torch.arange(sink_end, device=device), torch.arange(window_start, count, device=device)])
    positions = index + first
    slots = torch.where(positions < sink, positions, sink + (positions - sink) % local)
    if heads is None:
        store.ring_keys[:, slots] = keys[:, index]
        store.ring_values[:, slots] = values[:, index]
    else:
        store.ring_keys[:, slots] = keys[:, index][heads]
        store.ring_values[:, slots] = values[:, index][heads]
    store.ring_positions[slots] = positions


def reserve_full(store: SequenceStore, needed: int, *, spare: bool) -> bool:
    """Room for ``needed`` entries in a sequence's full store.

    Args:
        store: the sequence's storage; its full keys/values [F, capacity, D] may be replaced by larger ones that
            keep its ``full_count`` entries.
        needed: entries the full store must have room for.
        spare: add 1/32 for the decode steps to come (see `capacity_for`).

    Returns:
        True when its storage moved.
    """
    if not store.full_heads.numel() or needed <= store.full_keys.shape[1]:
        return False
    capacity = capacity_for(needed, spare)
    for name in ("full_keys", "full_values"):
        old = getattr(store, name)
        grown = old.new_zeros(old.shape[0], capacity, old.shape[2])
        grown[:, : store.full_count] = old[:, : store.full_count]
        setattr(store, name, grown)
    return True


def forget_outside_window(store: SequenceStore, window: int) -> None:
    """Under a model window, drop the full store's entries that no query from position ``length`` on can see
    (positions <= length - window), once there are at least ``window`` of them, into storage for about twice the
    window: the store then holds at most about 2 x window entries after a prompt, copied once per ``window``
    steps.

    Args:
        store: the sequence's storage; its full keys/values [F, capacity, D] may be replaced and its
            ``full_first`` advanced.
        window: the model's sliding window, in tokens.
    """
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


def append_full(store: SequenceStore, keys: torch.Tensor, values: torch.Tensor, window: int | None = None) -> None:
    """Append a step's entries to a sequence's full store (nothing when it has no full head).

    Args:
        store: the sequence's storage.
        keys, values: [F, n, D] the new entries of its F full heads, at positions ``length .. length + n - 1``.
        window: the model's sliding window on every layer (None: none); with one, the store first forgets what no
            later query can see (`forget_outside_window`).
    """
    if not store.full_heads.numel():
        return
    if window is not None:
        forget_outside_window(store, window)
    kept = store.full_count
    needed = kept + keys.shape[1]
    reserve_full(store, needed, spare=keys.shape[1] == 1)
    store.full_keys[:, kept:needed] = keys
    store.full_values[:, kept:needed] = values


def capacity_for(needed: int, spare: bool) -> int:
    """Entries to allocate for ``needed``: exactly that for a prompt or chunk; for a decode step 1/32 more (at least
    one), so a store is copied every few dozen steps at long lengths and never holds more than about 3% beyond what
    a full cache of the same sequence holds."""
    return needed + (needed // 32 + 1 if spare else 0)


def decode_capacity(longest: int, max_length: int | None) -> int:
    """Positions per sequence to hold once a prompt of ``longest`` tokens is stored, for the decode steps to come:
    room for ``max(256, longest / 32)`` more tokens (a multiple of 256), within ``max_length``. A prefill's full
    stores get it at once, and static mode (`ElasticCache.begin_static`) allocates it, so entering static mode after
    a prompt copies nothing."""
    room = max(256, -(-longest // 32))
    capacity = -(-(longest + room) // 256) * 256
    return capacity if max_length is None else min(capacity, max_length)
