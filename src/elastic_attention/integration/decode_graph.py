"""Decode steps captured once as a CUDA graph and replayed per token, over the bounded cache.

`attach` installs `GraphedForward` as the model's ``forward``. A call that is a plain decode step (one new token per
sequence, over a prefilled `ElasticCache` whose steps take the fused kernels, no gradients, nothing asked beyond the
logits) goes to the cache's `DecodeGraph`; every other call runs the model's own forward unchanged. `generate` needs
no new code: its decode steps are such calls, whether it samples or not, and a sequence that stopped at EOS keeps
receiving the pad token, as it does without graphs.

`GraphedForward` puts the cache in static mode (`ElasticCache.begin_static`: storage for a capacity allocated once,
lengths advanced on the device by the kernels); its `DecodeGraph` runs the first step once eagerly to warm up (its
writes are the ones the real step makes, and the device lengths are put back after it), captures the model's forward
over static input buffers, and replays it. Per step the host copies the new tokens and positions into those buffers,
replays, and counts the step: nothing per layer, and nothing read back but one flag every `MASK_CHECK_INTERVAL` steps
(`DecodeGraph.check_masks`). When the longest sequence reaches the capacity, the
cache leaves static mode and the next step captures again with room for more (up to the cache's ``max_length``,
beyond which the step raises).

The kernels of a captured step find each cache entry through its layers' address tables, which are device tensors,
so a captured step can serve a later cache: `GraphedForward` keeps the last `KEPT_GRAPHS` captured steps of each batch
size, and a cache entering static mode whose tables fit one of them (`DecodeGraph.fits`: the same batch and heads,
segments no longer than the captured key splits cover) copies its tables into that step's and replays it at once; a
second `generate` call then pays no capture. A cache whose step is taken so leaves static mode first.

Turn graphs off with ``attach(model, config, cuda_graphs=False)`` or ``ElasticCache(model, cuda_graphs=False)``.
Unless ``attach(..., grouped_projections=False)``, the captured step of a small batch runs the decoder layers' linear
projections as grouped Triton launches (`decode_projections`: every group for one sequence, q/k/v and gate/up for
up to `GROUPED_ROWS`); once compiling pays (`CompilePolicy`: ``attach``'s ``compile_decode``, ``"auto"`` by default)
every decoder layer also runs through ``torch.compile`` (`compiled`), which fuses the elementwise work around the
projections (`decode_layers` sets up both).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import weakref
from typing import Any

import torch
from transformers.cache_utils import Cache

from elastic_attention.cache.stores import decode_capacity
from elastic_attention.errors import ConfigError, InputError
from elastic_attention.integration.decode_projections import grouped_projections
from elastic_attention.integration.module_forwards import replaced_forwards
from elastic_attention.integration.runtime import STATIC_STEP_KWARG

#: Captured decode steps `GraphedForward` keeps per batch size (and compile setting) for later caches.
KEPT_GRAPHS = 4
#: Keyword arguments a graphed decode step understands; any other one that is not None runs the model's own forward.
_STEP_ARGUMENTS = frozenset({"input_ids", "attention_mask", "position_ids", "past_key_values", "cache", "use_cache",
                             "return_dict", "logits_to_keep", "output_attentions", "output_hidden_states"})
#: Steps between two checks that every step's attention mask marked its new token as real (one host read each).
MASK_CHECK_INTERVAL = 32
#: Seconds a process spends compiling the decoder layers of a captured step for a batch size it has not compiled
#: (`compiled`), and seconds a compiled step then saves a decoder layer (`compile_after_steps`): measured with a
#: 28-layer model of Qwen2.5-1.5B's shape at 16K tokens, batch 1, in a fresh process (docs/how-it-works.md, "Numbers
#: behind the defaults").
COMPILE_SECONDS = 6.2
SAVED_SECONDS_PER_LAYER = 0.568e-3 / 28


class DecodeGraph:
    """One captured decode step of a model over one static `ElasticCache`, for a fixed batch size.

    Args:
        forward: the model's own forward.
        batch: sequences per step.
        device: the cache's device.
        capture: False runs every step eagerly through the same static path, with the model's modules as they are
            (the oracle of the replayed step, and what runs where graphs cannot be captured).
        layers: the decoder layers, as `decode_layers` runs them in the captured step (with ``compile_layers`` and
            ``group_projections``).
    """

    def __init__(self, forward, batch: int, device: torch.device, capture: bool = True, layers: list | None = None,
                 compile_layers: bool = False, group_projections: bool = False) -> None:
        self.forward = forward
        self.capture = capture
        self.layers = layers or []
        self.compile_layers = compile_layers
        self.group_projections = group_projections
        parameters = inspect.signature(forward).parameters
        # transformers renamed the forward's `past_key_values` argument to `cache`; use whichever it takes.
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self._arguments = {STATIC_STEP_KWARG: True}
        if "logits_to_keep" in parameters:  # a causal LM (a base model has no logits)
            self._arguments["logits_to_keep"] = 1
        self.input_ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position_ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        #: True once some step's attention mask marked its new token as padding (checked every few steps).
        self.padded_step = torch.zeros((), dtype=torch.bool, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self._output_type: type | None = None
        self._outputs: dict[str, torch.Tensor] = {}
        self._cache_fields: list[str] = []
        #: Per layer, the address table the steps read and the bounds of its key splits (`ElasticCache.static_tables`
        #: of the first cache served; later caches copy theirs in); None before the first.
        self.tables: list[tuple] | None = None
        self._served: weakref.ref | None = None

    def fits(self, cache) -> bool:
        """Whether this step can serve ``cache`` (static, not yet served): its tables have the same segments (batch
        and KV heads) per layer, no longer than the captured key splits cover, and 16-byte aligned where the
        captured ones were."""
        if self.tables is None or cache.num_sequences != self.input_ids.shape[0]:
            return False
        tables = cache.static_tables()
        return len(tables) == len(self.tables) and all(
            theirs.num_segments == mine.num_segments and theirs.num_kv_heads == mine.num_kv_heads
            and (theirs.aligned or not mine.aligned) and their_bounds[0] <= my_bounds[0]
            for (mine, my_bounds), (theirs, their_bounds) in zip(self.tables, tables))

    def covered_entries(self) -> int:
        """Entries the captured key splits cover over all layers (a tighter fit wastes fewer programs)."""
        return sum(bounds[0] for _, bounds in self.tables or [])

    def serve(self, cache) -> None:
        """Make this the step of ``cache`` (static; `fits` it once this step has served a cache): the cache it served
        before leaves static mode, ``cache``'s address tables are copied into this step's (the first cache's
        become them)."""
        before = self._served() if self._served is not None else None
        if before is not None and before is not cache and before.decode_graph is self:
            before.end_static()
        if self.tables is None:
            self.tables = cache.static_tables()
        else:
            cache.adopt_static_tables(self.tables)
        self.padded_step.zero_()
        self._served = weakref.ref(cache)
        cache.decode_graph = self

    def step(self, cache, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
             position_ids: torch.Tensor | None):
        """One decode step: input_ids [B, 1]; attention_mask [B, past + 1] or None; position_ids [B or 1, 1] or None
        (the model's default: the cache's length). Returns the model's output (its tensors copied out)."""
        self.input_ids.copy_(input_ids)
        if position_ids is None:
            self.position_ids.fill_(cache.get_seq_length())
        else:
            self.position_ids.copy_(position_ids.expand_as(self.position_ids))
        if attention_mask is not None:
            self.padded_step.logical_or_((attention_mask[:, -1] == 0).any())
        if not self.capture:
            self._keep_output(self._run(cache))
        else:
            if self.graph is None:
                self._capture(cache)
            self.graph.replay()
        cache.static_steps += 1
        if cache.static_steps % MASK_CHECK_INTERVAL == 0:
            self.check_masks()
        output = self._output_type(**{name: tensor.clone() for name, tensor in self._outputs.items()})
        for name in self._cache_fields:
            output[name] = cache
        return output

    def check_masks(self) -> None:
        """Raise if a step's attention mask marked its new token as padding: a static step appends one real token
        per sequence, so such a mask asks for something it does not do."""
        if bool(self.padded_step):
            raise InputError(
                "a graphed decode step got an attention_mask whose new column has zeros (a padding token); each "
                "decode step appends one real token per sequence (generate passes ones); turn CUDA graphs off "
                "(ElasticCache(model, cuda_graphs=False)) to decode with padding steps"
            )

    def _run(self, cache):
        return self.forward(input_ids=self.input_ids, position_ids=self.position_ids, use_cache=True,
                            return_dict=True, **{self._cache_argument: cache}, **self._arguments)

    def _keep_output(self, output) -> None:
        """Keep a step's output tensors, and which fields held the cache (so that a graph never holds its cache)."""
        self._output_type = type(output)
        self._outputs = {name: value for name, value in output.items() if isinstance(value, torch.Tensor)}
        self._cache_fields = [name for name, value in output.items() if isinstance(value, Cache)]

    def _capture(self, cache) -> None:
        with decode_layers(self.layers, self.compile_layers, self.group_projections):
            self.graph, output = capture_graph(lambda: self._run(cache), cache.device_lengths())
        self._keep_output(output)


@contextlib.contextmanager
def decode_layers(layers: list, compile_layers: bool, group_projections: bool):
    """Inside the block the decoder ``layers`` run as a captured decode step runs them: their linear projections
    grouped for one row of input (`decode_projections.grouped_projections`) when ``group_projections``, and each
    layer through ``torch.compile`` (`compiled`) when ``compile_layers``."""
    with contextlib.ExitStack() as stack:
        if group_projections:
            stack.enter_context(grouped_projections(layers))
        if compile_layers:
            stack.enter_context(compiled(layers))
        yield


@contextlib.contextmanager
def compiled(modules: list):
    """Run each module's forward through ``torch.compile`` (Inductor, without CUDA graphs of its own) inside the
    block, to capture it: the elementwise work of a decoder layer (norms, rotary embedding, residual adds, the MLP's
    activation) fuses into a few kernels around the projections. The cache update, the attention function and the
    key hook are ``torch.compiler.disable``d, so they run as they are between the compiled graphs (the grouped
    projections are a custom operator, called as they are too). Modules of one class share their compiled graphs:
    integers read from a module (a layer's index) become graph inputs after the second layer, so one recompile
    serves every layer. Outside the block the modules run uncompiled; a prefill runs inside one only with
    ``attach(..., compile_prefill=True)``."""
    with replaced_forwards([(module, torch.compile(module.forward, dynamic=None)) for module in modules]):
        with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True):
            yield


def capture_graph(run, device_state: list[torch.Tensor]):
    """Capture ``run()`` as a CUDA graph after one eager run on a side stream (Triton compiles, cuBLAS picks its
    kernels). The eager run must leave the same writes as the captured one will (the same step's inputs), and
    ``device_state`` (tensors it advances, such as the cache's lengths) is put back before the capture.

    Returns:
        (the graph, ``run``'s output as captured: tensors that every replay overwrites).
    """
    saved = [tensor.clone() for tensor in device_state]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    for tensor, before in zip(device_state, saved):
        tensor.copy_(before)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = run()
    return graph, output


def check_compile_setting(setting):
    """``setting`` when it is True, False or ``"auto"`` (`CompilePolicy`), else a ConfigError."""
    if not (isinstance(setting, bool) or setting == "auto"):
        raise ConfigError(f"compile_decode must be True, False or 'auto', got {setting!r}")
    return setting


class CompilePolicy:
    """Whether captured decode steps run their layers compiled (`compiled`): always (``True``), never (``False``),
    or ``"auto"``: for each batch size, once the steps run uncompiled at that size would have paid for compiling
    (compiling is per batch size), by the rule of renting skis until the rent reaches the price: after
    ``after_steps`` uncompiled steps (compile seconds over the seconds a compiled step saves) the next capture
    compiles, and a graph captured uncompiled is captured again. Whatever the number of steps to come, a process
    then pays at most about twice what it would had it known that number.

    Args:
        setting: ``True``, ``False`` or ``"auto"``.
        after_steps: with ``"auto"``, the uncompiled steps of one batch size after which its captures compile.
    """

    def __init__(self, setting: bool | str, after_steps: int) -> None:
        self.setting = check_compile_setting(setting)
        self.after_steps = after_steps
        #: batch size -> decode steps run so far through uncompiled captured steps (every cache of the model).
        self.uncompiled_steps: dict[int, int] = {}

    def compile(self, batch: int) -> bool:
        """Whether the next capture of a step of ``batch`` sequences compiles its layers."""
        if self.setting == "auto":
            return self.uncompiled_steps.get(batch, 0) >= self.after_steps
        return self.setting

    def count(self, batch: int, compiled: bool) -> None:
        """Count one step of ``batch`` sequences, run by a graph captured with (``compiled``) or without compiled
        layers."""
        if not compiled:
            self.uncompiled_steps[batch] = self.uncompiled_steps.get(batch, 0) + 1


def compile_after_steps(num_layers: int) -> int:
    """Uncompiled decode steps that cost what compiling a ``num_layers``-layer model's layers does (the threshold of
    `CompilePolicy` ``"auto"``): `COMPILE_SECONDS` over ``num_layers`` x `SAVED_SECONDS_PER_LAYER` (10,916 steps for
    28 layers, 9,552 for 32)."""
    return math.ceil(COMPILE_SECONDS / (num_layers * SAVED_SECONDS_PER_LAYER))


class GraphedForward:
    """An attached model's ``forward``: plain decode steps over a bounded cache replay a `DecodeGraph`; every other
    call goes to the model's own forward (``original``; its decoder layers compiled for no-grad eval-mode calls with
    ``compile_prefill``), which `restore` (called by `detach`) puts back."""

    def __init__(self, model, runtime, layers: list, compile_layers: bool | str = False,
                 group_projections: bool = False, compile_prefill: bool = False) -> None:
        #: The decoder layers, and how captured steps run them (`decode_layers`).
        self.layers = layers
        #: Whether the other no-grad eval-mode calls (prefill, eager steps) run the layers compiled (`compiled`).
        self.compile_prefill = compile_prefill
        self.compile_policy = CompilePolicy(compile_layers, compile_after_steps(len(layers)))
        self.group_projections = group_projections
        #: (batch, compiled layers) -> the last `KEPT_GRAPHS` decode steps set up, least recently served first.
        self.kept_graphs: dict[tuple[int, bool], list[DecodeGraph]] = {}
        #: The forward the model had (an instance attribute, such as accelerate's hook, stays one after `restore`).
        self.original = model.forward
        self._was_instance_attribute = "forward" in model.__dict__
        self._model = weakref.ref(model)
        self.runtime = runtime
        functools.update_wrapper(self, self.original)  # generate reads the forward's signature

    def restore(self, model) -> None:
        """Give ``model`` its own forward back."""
        if self._was_instance_attribute:
            model.forward = self.original
        else:
            del model.forward

    def __call__(self, *args, **kwargs):
        cache = self._graphable_cache(args, kwargs)
        if cache is None:
            if self.compile_prefill and not torch.is_grad_enabled() and not self._model().training:
                with compiled(self.layers):
                    return self.original(*args, **kwargs)
            return self.original(*args, **kwargs)
        input_ids = kwargs["input_ids"]
        compile_layers = self.compile_policy.compile(input_ids.shape[0])
        if cache.static_capacity is not None and (cache.longest + 1 > cache.static_capacity
                                                  or cache.decode_graph.compile_layers != compile_layers):
            cache.end_static()  # full, or the layers are to compile now: capture again
        if cache.static_capacity is None:
            capacity = decode_capacity(cache.longest, cache.max_length)
            if capacity <= cache.longest:
                raise InputError(
                    f"sequence length {cache.longest + 1} exceeds the cache's max_length {cache.max_length}; "
                    "create ElasticCache with a larger max_length (or None to grow as needed)"
                )
            cache.begin_static(capacity)
            self._decode_graph_for(cache, input_ids, compile_layers).serve(cache)
        output = cache.decode_graph.step(cache, input_ids, kwargs.get("attention_mask"), kwargs.get("position_ids"))
        self.compile_policy.count(input_ids.shape[0], cache.decode_graph.compile_layers)
        return output if kwargs.get("return_dict", True) is not False else output.to_tuple()

    def _decode_graph_for(self, cache, input_ids: torch.Tensor, compile_layers: bool) -> DecodeGraph:
        """A kept step that fits ``cache`` (static), the one covering the fewest entries; else a new one, kept in
        place of the least recently served beyond `KEPT_GRAPHS`."""
        kept = self.kept_graphs.setdefault((input_ids.shape[0], compile_layers), [])
        fitting = [graph for graph in kept if graph.fits(cache)]
        if fitting:
            graph = min(fitting, key=DecodeGraph.covered_entries)
            kept.remove(graph)
        else:
            graph = DecodeGraph(self.original, input_ids.shape[0], input_ids.device,
                                capture=input_ids.device.type == "cuda", layers=self.layers,
                                compile_layers=compile_layers, group_projections=self.group_projections)
        kept.append(graph)
        del kept[:-KEPT_GRAPHS]
        return graph

    def _graphable_cache(self, args: tuple, kwargs: dict[str, Any]):
        """The `ElasticCache` of a call that a graphed step can serve, else None."""
        from elastic_attention.cache import ElasticCache

        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if args or not isinstance(cache, ElasticCache) or not cache.cuda_graphs or cache.runtime is not self.runtime:
            return None
        if torch.is_grad_enabled() or self._model().training:
            return None
        if any(value is not None and name not in _STEP_ARGUMENTS for name, value in kwargs.items()):
            return None
        if kwargs.get("output_attentions") or kwargs.get("output_hidden_states") or kwargs.get("use_cache") is False:
            return None
        if kwargs.get("logits_to_keep") not in (None, 0, 1) or not cache.can_be_static:
            return None
        input_ids, mask, positions = kwargs.get("input_ids"), kwargs.get("attention_mask"), kwargs.get("position_ids")
        batch = cache.num_sequences
        if input_ids is None or tuple(input_ids.shape) != (batch, 1):
            return None
        if mask is not None and tuple(mask.shape) != (batch, cache.get_seq_length() + 1):
            return None
        if positions is not None and (positions.ndim != 2 or positions.shape[1] != 1
                                      or positions.shape[0] not in (1, batch)):
            return None
        graph = cache.decode_graph
        if graph is not None and graph.input_ids.shape[0] != batch:
            cache.end_static()
        return cache
