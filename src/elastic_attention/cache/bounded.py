"""`ElasticCache`: a Hugging Face KV cache that keeps, per layer, sequence and KV head, only what that head reads again.

Heads on full attention (and XA, which attends every key after the prompt) keep every entry. Heads on SSA keep the
``sink_tokens`` first entries and the last ``local_tokens`` entries in a ring buffer: exactly what the token rule of
`patterns.tokens` lets their later queries see. The rest is never stored, so the memory is released, not masked.

The cache takes its routing explicitly from the runtime that drives it: the layout of each forward
(`ElasticCache.begin_forward`) and, at a prefill, each layer's streaming heads per sequence (`route_layer`). A
prefill's stores are sized from that routing, so they are built after the layer's attention is launched
(`ElasticCacheLayer.commit`) from a host copy made without waiting: the host waits for that copy alone, while the
GPU runs the layer's attention, never for the attention itself.

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
graph) every full store is allocated for a capacity up front (the longest sequence plus max(256, 1/32) tokens,
`stores.decode_capacity`) and every ring at its sink + local slots; lengths then advance on the device, and the
host-side ones catch up when static mode ends. Where such steps will follow (``cuda_graphs`` and the fused kernels),
a prefill already allocates its full stores for that capacity (`prefill_capacity`), so entering static mode after a
prompt copies none of them.

A decode step (one new token per sequence) on a CUDA GPU with Triton takes the fused path of
`cache.triton_decode`: whatever the batch size, one launch per layer writes the new entries of every sequence and
head and attends them all, split over the keys, and a second merges the splits and counts the entries, through a
table of the layer's storage addresses that is rebuilt only when storage moves (a full store grows, the batch is
reordered). Elsewhere, and with ``fused_decode=False``, the step runs per sequence in torch, which is also the
oracle of the fused path.

This module holds the cache itself; each decoder layer's part is `cache.layer.ElasticCacheLayer`, and the
per-sequence stores with the operations that grow and trim them are in `cache.stores`.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicSlidingWindowLayer

from elastic_attention.cache.layer import ElasticCacheLayer
from elastic_attention.cache.stores import StreamingWindow, decode_capacity
from elastic_attention.cache.triton_decode import DecodeKernelOptions, triton_decode_available
from elastic_attention.attached import attached_runtime
from elastic_attention.errors import InputError
from elastic_attention.patterns import SequenceLayout


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
        #: Per layer, a prefill's routing ([N, Hkv] bool, True = streaming head): on the host (copied without
        #: waiting, `_routing_copied` says when it has landed) and on the model's device.
        self._streaming: dict[int, torch.Tensor] = {}
        self._streaming_on_device: dict[int, torch.Tensor] = {}
        self._routing_copied: dict[int, torch.cuda.Event] = {}
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
        that keep only their sink and window (SSA); the other heads keep every entry.

        On a GPU the host copy is made without waiting (pinned memory, an event marks its arrival), so the host
        goes on launching the layer's attention; `head_split` waits for the copy alone, not for that attention."""
        streaming = streaming.detach().to(torch.bool)
        self._streaming_on_device[layer_index] = streaming
        if streaming.device.type == "cuda":
            host = torch.empty(streaming.shape, dtype=torch.bool, pin_memory=True)
            host.copy_(streaming, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(torch.cuda.current_stream(streaming.device))
            self._routing_copied[layer_index] = copied
        else:
            host = streaming.to("cpu", copy=True)
        self._streaming[layer_index] = host

    def streaming_heads(self, layer_index: int, sequence: int, num_kv_heads: int) -> torch.Tensor:
        """[Hkv] bool (CPU): the routing of ``sequence`` in ``layer_index``; no streaming head when none was given."""
        streaming = self._streaming.get(layer_index)
        if streaming is None:
            return torch.zeros(num_kv_heads, dtype=torch.bool)
        copied = self._routing_copied.pop(layer_index, None)
        if copied is not None:
            copied.synchronize()
        return streaming[sequence]

    def head_lists(self, layer_index: int, sequence: int, num_kv_heads: int) -> tuple[list[int], list[int]]:
        """The KV heads of ``sequence`` in ``layer_index`` that keep every entry and those that stream, each in head
        order, as host lists read from the routing's host copy (`head_split` gives the same on the device)."""
        streaming = self.streaming_heads(layer_index, sequence, num_kv_heads).tolist()
        return ([head for head in range(num_kv_heads) if not streaming[head]],
                [head for head in range(num_kv_heads) if streaming[head]])

    def head_split(self, layer_index: int, sequence: int, num_kv_heads: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """([F], [P]) int64 on ``device``: the KV heads of ``sequence`` in ``layer_index`` that keep every entry and
        those that stream, each in head order (as `head_lists`). Built on the device from the routing there; only the
        count F comes from the host copy, so nothing waits for work launched after the routing."""
        full_heads, _ = self.head_lists(layer_index, sequence, num_kv_heads)
        on_device = self._streaming_on_device.get(layer_index)
        if on_device is None:
            heads = torch.arange(num_kv_heads, device=device)
            return heads, heads[:0]
        full = len(full_heads)
        order = torch.sort(on_device[sequence].to(torch.uint8), stable=True).indices.to(device)  # full heads first
        return order[:full], order[full:]

    # -- static mode -----------------------------------------------------------------------------------------------

    @property
    def can_be_static(self) -> bool:
        """True when decode steps can run in static mode: every layer bounded (no sliding-window layer), prefilled,
        its steps on the fused kernels."""
        layers = self._elastic_layers
        return bool(layers[0].sequences) and self._static_capable(layers[0].device, layers[0].dtype)

    def _static_capable(self, device: torch.device, dtype: torch.dtype) -> bool:
        layers = self._elastic_layers
        return self.fused_decode and len(layers) == len(self.layers) and triton_decode_available(device, dtype)

    def prefill_capacity(self, longest: int, device: torch.device, dtype: torch.dtype) -> int:
        """Positions a prefill's full stores are allocated for, its longest sequence ``longest`` tokens: where its
        decode steps will be captured (``cuda_graphs`` and fused kernels on ``device``), static mode's capacity
        (`decode_capacity`), so that entering it copies nothing; else 0, just the prompt (eager steps add 1/32
        as they go, `capacity_for`)."""
        if self.cuda_graphs and self._static_capable(device, dtype):
            return decode_capacity(longest, self.max_length)
        return 0

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

    def static_tables(self) -> list[tuple]:
        """In static mode, per layer: its address table and the bounds of its kernel's key splits
        (`ElasticCacheLayer.static_table`)."""
        return [layer.static_table() for layer in self._elastic_layers]

    def adopt_static_tables(self, tables: list[tuple]) -> None:
        """In static mode: run on the address tables of ``tables`` (another cache's `static_tables`, which a captured
        step reads), each layer's own copied into them (`ElasticCacheLayer.adopt_static_table`)."""
        if len(tables) != len(self._elastic_layers):
            raise InputError(f"{len(tables)} static tables for a cache of {len(self._elastic_layers)} layers")
        for layer, (segments, static) in zip(self._elastic_layers, tables):
            layer.adopt_static_table(segments, static)

    def device_lengths(self) -> list[torch.Tensor]:
        """Per layer, each segment's length on the device (static mode); see `ElasticCacheLayer.device_lengths`."""
        return [layer.device_lengths() for layer in self._elastic_layers]

    def reset(self) -> None:
        self.end_static()
        super().reset()

    def _select(self, index: torch.Tensor) -> None:
        for copied in self._routing_copied.values():
            copied.synchronize()
        self._routing_copied = {}
        self._streaming = {layer: streaming.index_select(0, index.to("cpu"))
                           for layer, streaming in self._streaming.items()}
        self._streaming_on_device = {layer: streaming.index_select(0, index.to(streaming.device))
                                     for layer, streaming in self._streaming_on_device.items()}
        self.runtime.select_sequences(index.to("cpu"))

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
