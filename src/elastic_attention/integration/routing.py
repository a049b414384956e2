"""`ModelRouting`: the routers of one attached model and what they decided for the current prompt.

A prefill routes every routed layer once, from that layer's pre-RoPE keys (`route`; a `SignalSetRouter`'s decision
layer from its queries and keys, `route_signal`); the decisions are kept for the
decode steps that follow, reordered with the batch (`select_sequences`). A router decides its own layer and the
routed layers after it, up to the next router (`build_routers` places them): a per-head router its layer alone,
a `HeadSetRouter` in the first routed layer every routed layer, from one head set per prompt. Routing can be forced
(every head full or sparse, or a fixed head set) instead of asking the routers; a `HeadSetRouter` can also be made to
run one of its own sets for every prompt while what it would read is kept (``forced_set``, for training on the
expected objective). In train mode each layer draws its Gumbel noise from a seed taken once per forward, so a layer
recomputed in the backward pass (gradient checkpointing) routes the same.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from elastic_attention.config import ElasticConfig
from elastic_attention.errors import ConfigError, InputError
from elastic_attention.integration.report import HeadSetReport, RoutingReport
from elastic_attention.patterns import SequenceLayout
from elastic_attention.router import AttentionRouter, HeadSetRouter, boundary_pool, is_retrieval
from elastic_attention.router.head_set_router import SetDecision
from elastic_attention.router.retrieval_signal import retrieval_signal
from elastic_attention.router.signal_router import SignalSetRouter


def build_routers(config: ElasticConfig, routed_layers: tuple[int, ...], head_dim: int,
                  num_kv_heads: int) -> dict[int, AttentionRouter]:
    """The routers of ``config``, by the routed layer each sits in and reads the pooled keys of: the one place that
    decides which router type a configuration gets.

    ``config.head_set_choices`` C gives one `HeadSetRouter` in the first routed layer, choosing among C sets that
    cover every routed layer (with ``config.signal_layer``: one `SignalSetRouter` in that layer); otherwise one
    `AttentionRouter` per routed layer decides each KV head of its layer.

    Args:
        config: the configuration (router width, standardizing, head sets, safety floor).
        routed_layers: the routed layers, ascending.
        head_dim: D.
        num_kv_heads: Hkv.

    Returns:
        Layer index -> router (new, on the CPU, in training mode).

    Raises:
        ConfigError: ``config.signal_layer`` is not a routed layer.
    """
    if config.signal_layer is not None:
        if config.signal_layer not in routed_layers:
            raise ConfigError(f"`signal_layer` {config.signal_layer} is not a routed layer of this model "
                              f"(routed: {list(routed_layers)})")
        return {config.signal_layer: SignalSetRouter(num_kv_heads, config.signal_thresholds, len(routed_layers),
                                                     routed_layers.index(config.signal_layer))}
    if config.head_set_choices:
        return {routed_layers[0]: HeadSetRouter(
            head_dim, config.router_width, num_kv_heads, config.head_set_choices, len(routed_layers),
            standardize=config.router_standardize, floor_set=config.floor_set, floor_confidence=config.floor_confidence,
        )}
    standardize = num_kv_heads if config.router_standardize else None
    return {index: AttentionRouter(head_dim, config.router_width, standardize) for index in routed_layers}


class ModelRouting:
    """Routers per layer, the forced routing, the noise seeds and the decisions of the last prefill.

    Args:
        config: the attached configuration (pooling spans; which mode streams).
        routers: layer index -> router, by the routed layer it reads (`build_routers`).
        routed_layers: the routed layers, ascending.
        num_kv_heads: Hkv.

    Attributes:
        forced: None (the routers decide), or [routed layers, Hkv] bool, True = full attention for every sequence.
        decisions: layer index -> [N, Hkv] float32 decisions of the last prefill (1.0 = retrieval; carries the
            straight-through gradient in training).
        set_decision: with a `HeadSetRouter` in eval mode, the last prefill's `SetDecision` (its probabilities and
            where the safety floor acted; None otherwise).
        forced_set: with a `HeadSetRouter`, None (it chooses), or the index of the set every prompt runs.
        set_router_input: with ``forced_set``, [N, Hkv, D] what the router read for the last prefill's prompts (the
            first routed layer's pooled keys, which no set changes; None otherwise).
    """

    def __init__(self, config: ElasticConfig, routers: dict[int, AttentionRouter], routed_layers: tuple[int, ...],
                 num_kv_heads: int) -> None:
        self.config = config
        self.routers = routers
        self.routed_layers = tuple(routed_layers)
        self.num_kv_heads = num_kv_heads
        self.forced: torch.Tensor | None = None
        self.decisions: dict[int, torch.Tensor] = {}
        self._outputs: dict[int, torch.Tensor] = {}  # the routers' outputs in this prefill, by the layer each reads
        # routed layer -> the layer of the router that decides it: the nearest router at or before it (a
        # `SignalSetRouter` also decides the routed layers before its own, where its sets agree)
        self._readers = {layer: max((index for index in routers if index <= layer), default=min(routers))
                         for layer in self.routed_layers}
        self.set_decision: SetDecision | None = None
        self.forced_set: int | None = None
        self.set_router_input: torch.Tensor | None = None
        self._prompt_lengths: list[int] | None = None
        self._noise_seed: int | None = None
        self._noise_source: torch.Generator | None = None
        self._noise_seeds: dict[int, int] = {}

    @property
    def prompt_lengths(self) -> list[int] | None:
        """How many first tokens of each sequence of this forward are its prompt (None: all of them)."""
        return self._prompt_lengths

    def begin_prefill(self, prompt_lengths: list[int] | None, noise_seed: int | None) -> None:
        """Forget the previous prompt's decisions; pool only each sequence's first ``prompt_lengths`` tokens (None:
        all of them) and draw this forward's noise from ``noise_seed`` (None: torch's global generator)."""
        self.decisions = {}
        self._outputs = {}
        self.set_decision = None
        self.set_router_input = None
        self._noise_seeds = {}
        self._prompt_lengths, self._noise_seed, self._noise_source = prompt_lengths, noise_seed, None

    def check_decode(self, layout: SequenceLayout) -> None:
        """Raise unless a prefill of the same sequences routed before this decode step."""
        if not self.decisions:
            raise InputError("a decode step arrived before any prefill; run the prompt through the model first")
        routed = next(iter(self.decisions.values()))
        if routed.shape[0] != layout.num_sequences:
            raise InputError(
                f"this decode step has {layout.num_sequences} sequences but the prefill routed "
                f"{routed.shape[0]}; the batch must keep its rows from prefill to the last decode step "
                "(rows cannot be dropped or added between them)"
            )

    def route(self, layer_index: int, keys: torch.Tensor, layout: SequenceLayout) -> torch.Tensor:
        """Decide one layer at a prefill.

        Args:
            layer_index: a routed layer.
            keys: [B, S, Hkv, D] the layer's pre-RoPE keys.
            layout: the sequences of this forward.

        Returns:
            [N, Hkv] float32 decisions (also kept in ``decisions``); None for the decision layer of a
            `SignalSetRouter`, which is decided from its queries and keys (`route_signal`).
        """
        position = self.routed_layers.index(layer_index)
        if self.forced is not None:
            z = self.forced[position].to(keys.device, torch.float32).expand(layout.num_sequences, -1)
        else:
            reader = self._readers[layer_index]
            router = self.routers[reader]
            if isinstance(router, SignalSetRouter) and layer_index < reader:
                z = router.prefix_decisions(position).to(keys.device).expand(layout.num_sequences, -1)
                self.decisions[layer_index] = z
                return z
            if self.routes_in_attention(layer_index):
                return None
            if layer_index == reader and self.forced_set is not None:
                self._outputs[reader] = self._score_forced_set(router, keys, layout)
            elif layer_index == reader:
                self._outputs[reader] = self._ask(router, layer_index, keys, layout)
                self.set_decision = None if router.training else router.last_decision
            elif reader not in self._outputs:
                raise InputError(f"layer {layer_index} routes before layer {reader}, whose router decides it")
            z = router.decisions(self._outputs[reader], position)
        self.decisions[layer_index] = z
        return z

    def routes_in_attention(self, layer_index: int) -> bool:
        """True for the decision layer of a `SignalSetRouter` when the routers decide: the layer is routed from its
        queries and keys (`route_signal`), not from its pooled keys."""
        router = self.routers.get(layer_index)
        return self.forced is None and isinstance(router, SignalSetRouter)

    def route_signal(self, layer_index: int, query: torch.Tensor, key: torch.Tensor, layout: SequenceLayout,
                     scale: float) -> torch.Tensor:
        """Decide a `SignalSetRouter`'s layer at a prefill from its `retrieval_signal`.

        Args:
            layer_index: the router's decision layer.
            query: [B, Hq, S, D] the layer's queries; key: [B, Hkv, S, D] its keys (both after position encoding).
            layout: the sequences of this forward.
            scale: the softmax scale.

        Returns:
            [N, Hkv] float32 decisions (also kept in ``decisions``).
        """
        if self.forced_set is not None:
            raise InputError("a signal router has no weights to train: forcing one of its sets is not supported")
        router = self.routers[layer_index]
        config = self.config
        with torch.no_grad():
            signal = retrieval_signal(query, key, layout, scale, queries=config.signal_queries,
                                      block_size=config.block_size, sink_tokens=config.sink_tokens,
                                      local_tokens=config.local_tokens, statistic=config.signal_statistic,
                                      prompt_lengths=self.prompt_lengths)
        self._outputs[layer_index] = router(signal)
        self.set_decision = router.last_decision
        z = router.decisions(self._outputs[layer_index], self.routed_layers.index(layer_index))
        self.decisions[layer_index] = z
        return z

    def _ask(self, router: AttentionRouter, layer_index: int, keys: torch.Tensor, layout: SequenceLayout):
        """The router's output for this prefill's sequences, from the layer's pooled keys."""
        generator = self._noise_generator(layer_index, keys.device) if router.training else None
        return router(self.pooled(keys, layout), generator=generator)

    def pooled(self, keys: torch.Tensor, layout: SequenceLayout) -> torch.Tensor:
        """[N, Hkv, D] what a router reads: the mean of each prompt's first and last keys (`boundary_pool`)."""
        return boundary_pool(keys, layout, self.config.pool_first, self.config.pool_last, self._prompt_lengths)

    def _score_forced_set(self, router, keys: torch.Tensor, layout: SequenceLayout) -> torch.Tensor:
        """[N, C] one-hot ``forced_set`` for every prompt; what the router would have read goes to
        ``set_router_input``."""
        self.set_router_input = self.pooled(keys, layout).detach()
        index = torch.full((layout.num_sequences,), self.forced_set, dtype=torch.long, device=keys.device)
        return torch.nn.functional.one_hot(index, router.choices).float()

    def streaming(self, z: torch.Tensor) -> torch.Tensor:
        """[N, Hkv] bool: the heads that stream (SSA keeps its sink and window; XA heads read every block)."""
        if self.config.sparse_mode != "ssa":
            return torch.zeros(z.shape, dtype=torch.bool, device=z.device)
        return ~is_retrieval(z)

    def streaming_heads(self, layer_index: int, sequence: int) -> torch.Tensor:
        """[Hkv] bool on the CPU: the KV heads of ``sequence`` that run SSA in ``layer_index`` (none in a layer
        without a router)."""
        z = self.decisions.get(layer_index)
        if z is None:
            return torch.zeros(self.num_kv_heads, dtype=torch.bool)
        return self.streaming(z[sequence : sequence + 1])[0].cpu()

    def select_sequences(self, index: torch.Tensor) -> None:
        """Keep the decisions of the sequences at ``index`` ([N'] int64, repeats allowed), in that order: what a
        cache that was reordered (beam search), repeated or trimmed along the batch needs for its later steps."""
        self.decisions = {layer: z.index_select(0, index.to(z.device)) for layer, z in self.decisions.items()}
        if self.set_decision is not None:
            decision = self.set_decision
            self.set_decision = SetDecision(*(None if part is None else part.index_select(0, index.to(part.device))
                                              for part in (decision.choice, decision.probabilities,
                                                           decision.preferred, decision.signal)))

    def report(self, layout: SequenceLayout, sparsity: dict[int, torch.Tensor]) -> RoutingReport:
        """The `RoutingReport` of the last prefill, given each routed layer's ESR per sequence ([N] each)."""
        z = torch.stack([self.decisions[index] for index in self.routed_layers], dim=1)
        esr = torch.stack([sparsity[index] for index in self.routed_layers], dim=1)
        head_sets = None
        if self.set_decision is not None and self.forced is None:
            (router,) = self.routers.values()  # a head-set or signal router is the model's only router
            head_sets = HeadSetReport(decision=self.set_decision, head_sets=router.head_sets,
                                      floor_set=router.floor_set, floor_confidence=router.floor_confidence,
                                      thresholds=getattr(router, "thresholds", None))
        return RoutingReport(layers=self.routed_layers, rows=layout.row.clone(), z=z, msr=1.0 - z.mean(dim=(1, 2)),
                             esr_per_layer=esr, head_sets=head_sets)

    def _noise_generator(self, layer_index: int, device: torch.device) -> torch.Generator:
        """The Gumbel-noise generator of a layer: its seed drawn once per forward, from the forward's noise seed
        when given (else from torch's global generator)."""
        seed = self._noise_seeds.get(layer_index)
        if seed is None:
            if self._noise_seed is not None and self._noise_source is None:
                self._noise_source = torch.Generator(device).manual_seed(self._noise_seed)
            source = self._noise_source
            seed = int(torch.randint(0, 2**62, (1,), generator=source, device=source.device if source else "cpu"))
            self._noise_seeds[layer_index] = seed
        return torch.Generator(device).manual_seed(seed)


class _RouterInputRead(Exception):
    """Raised by `read_router_input`'s hook once the router holds its input: the rest of the forward is not needed."""


def read_router_input(router: torch.nn.Module, forward: Callable[[], object]) -> torch.Tensor:
    """[N, Hkv, D] float32 on the CPU: what ``router`` (a router of an attached model) reads in the forward that
    ``forward`` runs, its layer's pooled pre-RoPE keys. The forward stops there: nothing after the router's input is
    computed, so a first routed layer's input costs the embeddings and one projection.

    Raises:
        RuntimeError: the forward never reached the router (not a router of the model ``forward`` runs).
    """
    seen: list[torch.Tensor] = []

    def capture(module, args):
        seen.append(args[0].detach().float().cpu())
        raise _RouterInputRead

    hook = router.register_forward_pre_hook(capture)
    try:
        with torch.no_grad():
            forward()
    except _RouterInputRead:
        pass
    finally:
        hook.remove()
    if not seen:
        raise RuntimeError("the forward never reached the router: is it a router of this model?")
    return seen[0]
