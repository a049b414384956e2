"""attach / detach elastic attention on a Hugging Face decoder, force routing, read the routing report."""

from __future__ import annotations

import dataclasses
import logging

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from elastic_attention.backends import get_backend
from elastic_attention.attached import RUNTIME_ATTRIBUTE, attached_runtime
from elastic_attention.config import ElasticConfig
from elastic_attention.errors import BackendUnavailableError, ConfigError, InputError, UnsupportedModelError
from elastic_attention.integration.decode_graph import GraphedForward, check_compile_setting
from elastic_attention.integration.families import (
    attention_modules,
    decoder_layers,
    decoder_of,
    family_of,
    layer_kinds,
    model_window,
)
from elastic_attention.integration.report import RoutingReport
from elastic_attention.integration.attention_function import (
    ATTENTION_NAME,
    WINDOWED_ATTENTION_NAME,
    elastic_attention_forward,
)
from elastic_attention.integration.routing import build_routers
from elastic_attention.integration.runtime import ElasticRuntime
from elastic_attention.router import AttentionRouter
from elastic_attention.router.signal_router import SignalSetRouter

logger = logging.getLogger(__name__)

ROUTER_ATTRIBUTE = "elastic_router"

AttentionInterface.register(ATTENTION_NAME, elastic_attention_forward)


def _sliding_layer_mask(*args, local_size: int | None = None, **kwargs):
    """The mask function of models with sliding-window layers: their sliding layers get transformers' own SDPA mask
    (window and padding) for the model's attention; full-attention layers get none, since elastic attention reads
    the padding from the sequence layout and never needs an S x S mask."""
    if local_size is None:
        return None
    return sdpa_mask(*args, local_size=local_size, **kwargs)


AttentionInterface.register(WINDOWED_ATTENTION_NAME, elastic_attention_forward)
AttentionMaskInterface.register(WINDOWED_ATTENTION_NAME, _sliding_layer_mask)


def attach(
    model: nn.Module, config: ElasticConfig | None = None, *, backend: str = "auto", cache: str = "bounded",
    cuda_graphs: bool = True, compile_decode: bool | str = "auto", grouped_projections: bool = True,
    compile_prefill: bool = False,
) -> nn.Module:
    """Attach Elastic Attention to a Hugging Face decoder, in place.

    Adds the routers `build_routers` gives ``config`` (each as ``<attention module>.elastic_router`` of the layer
    it reads: one `AttentionRouter` per routed layer, or one `HeadSetRouter` in the first), freezes the backbone
    (the routers are the only trainable parameters), and switches the model to the ``"elastic_attention"``
    attention implementation.

    Args:
        model: a causal LM (or its base model) of a supported family.
        config: the configuration; defaults to ``ElasticConfig()``.
        backend: attention backend name (``"auto"``, ``"fa4"``, ``"flex"``, ``"cpu"``, ``"reference"``); for a model
            that soft-caps its attention logits (Gemma 2) or has attention sinks (gpt-oss) ``"auto"`` takes
            ``"reference"`` where its first choice lacks them.
        cache: ``"bounded"`` (default): `generate` and other eval-mode forwards that cache use an `ElasticCache`,
            where SSA heads keep only their sink and window; ``"full"``: the model's own cache, every key kept.
        cuda_graphs: decode steps over the bounded cache on a CUDA GPU are captured once as a CUDA graph and
            replayed (`integration.decode_graph`); False runs every step eagerly.
        compile_decode: with ``cuda_graphs``, whether every decoder layer runs through ``torch.compile`` in the
            captured step (norms, projections, rotary embedding, MLP; the cache update and attention stay outside
            the compiled graphs), which fuses their elementwise work into fewer kernels. Compiling costs seconds
            per batch size and saves a share of each step, so it pays only after many steps: ``"auto"`` (default)
            compiles a batch size once the process has decoded enough steps of it uncompiled to have paid for the
            compile (`decode_graph.CompilePolicy`), ``True`` from the first capture, ``False`` never.
        grouped_projections: with ``cuda_graphs``, a captured step of one sequence runs the decoder layers' linear
            projections as grouped Triton launches (`integration.decode_projections`: q, k and v in one, gate and
            up in one, no split reductions), and a step of 2 to `decode_projections.GROUPED_ROWS` sequences its
            q/k/v and gate/up groups; False leaves them to torch (cuBLAS). docs/how-it-works.md ("Captured decode
            steps") gives what compiling and grouping cost and save.
        compile_prefill: every no-grad eval-mode forward that is not a captured decode step (a prefill, an eager
            step) runs each decoder layer through ``torch.compile`` (`decode_graph.compiled`; the key hook, the cache
            update and the attention stay outside the compiled graphs), which fuses the layer's elementwise work
            (norms, rotary embedding, the MLP's activation, residual adds). A process compiles once per model shape,
            and once more for dynamic lengths at the second prompt length it sees. Off by default: not yet measured
            on a GPU.

    Returns:
        The same model.

    Raises:
        UnsupportedModelError: the family is not supported, has only sliding-window layers, or is already attached.
        ConfigError: ``cache`` is not a known kind, ``compile_decode`` is not True, False or ``"auto"``, or
            ``routed_layers`` names layers the model does not have or its sliding-window layers.
        BackendUnavailableError: the backend cannot run here, or lacks a feature the model needs (soft-capping or
            attention sinks).
    """
    config = config or ElasticConfig()
    if cache not in ("bounded", "full"):
        raise ConfigError(f"cache must be 'bounded' or 'full', got {cache!r}")
    check_compile_setting(compile_decode)
    if getattr(model, RUNTIME_ATTRIBUTE, None) is not None:
        raise UnsupportedModelError("elastic attention is already attached to this model; call detach(model) first")
    _, family = family_of(model)
    decoder = decoder_of(model, family)
    modules = attention_modules(decoder, family)
    kinds = layer_kinds(model)
    config = _with_routed_layers(config, kinds)
    routed = config.routed_layers if config.routed_layers is not None else tuple(range(len(kinds)))
    if not model._can_set_attn_implementation():
        raise UnsupportedModelError(f"{type(model).__name__} does not dispatch attention through AttentionInterface")
    softcap = getattr(model.config, "attn_logit_softcapping", None)
    attention_backend = _backend_for(backend, softcap, family.attention_sinks)

    head_dim = modules[0].head_dim
    num_kv_heads = model.config.num_key_value_heads
    frozen = {name: parameter.requires_grad for name, parameter in model.named_parameters()}
    for parameter in model.parameters():
        parameter.requires_grad_(False)

    routers = build_routers(config, routed, head_dim, num_kv_heads)
    for index, router in routers.items():
        router.to(getattr(modules[index], family.key_source).weight.device).train(model.training)
        modules[index].add_module(ROUTER_ATTRIBUTE, router)
    runtime = ElasticRuntime(
        config, family, attention_backend, routers, routed, num_kv_heads, head_dim, num_layers=len(modules),
        cache_kind=cache,
        sliding_window=getattr(model.config, "sliding_window", None) if "sliding" in kinds else None,
        sliding_layers=frozenset(index for index, kind in enumerate(kinds) if kind == "sliding"),
        softcap=softcap, has_sinks=family.attention_sinks, model_window=model_window(model), cuda_graphs=cuda_graphs,
    )
    runtime.previous_implementation = model.config._attn_implementation
    runtime.requires_grad_before = frozen
    _hook_runtime(model, decoder, modules, family, runtime)
    model.forward = GraphedForward(model, runtime, decoder_layers(decoder, family), compile_layers=compile_decode,
                                   group_projections=grouped_projections, compile_prefill=compile_prefill)
    model.set_attn_implementation(WINDOWED_ATTENTION_NAME if runtime.sliding_layers else ATTENTION_NAME)
    return model


def _with_routed_layers(config: ElasticConfig, kinds: list[str]) -> ElasticConfig:
    """``config``, with ``routed_layers`` set to the full-attention layers when it names none and the model (its
    layer ``kinds``, "full" or "sliding") has sliding-window layers.

    Raises:
        ConfigError: ``routed_layers`` names layers the model does not have, or sliding-window layers.
    """
    full_layers = tuple(index for index, kind in enumerate(kinds) if kind == "full")
    routed = config.routed_layers if config.routed_layers is not None else full_layers
    if max(routed) >= len(kinds):
        raise ConfigError(f"`routed_layers` {list(routed)} names layers beyond the model's {len(kinds)} layers")
    sliding = sorted(set(routed) - set(full_layers))
    if sliding:
        raise ConfigError(
            f"`routed_layers` names the sliding-window layers {sliding}; only full-attention layers "
            f"{list(full_layers)} can be routed"
        )
    if config.routed_layers is None and len(full_layers) < len(kinds):
        config = dataclasses.replace(config, routed_layers=full_layers)
    return config


def _hook_runtime(model: nn.Module, decoder: nn.Module, modules: list[nn.Module], family,
                  runtime: ElasticRuntime) -> None:
    """Register the runtime's hooks (around the decoder, on each routed layer's key source, before the output head)
    and point the model and its attention modules at it."""
    handles = [
        decoder.register_forward_pre_hook(runtime.before_decoder, with_kwargs=True),
        decoder.register_forward_hook(runtime.after_decoder, with_kwargs=True),
    ]
    for index in runtime.routed_layers:
        source = getattr(modules[index], family.key_source)
        handles.append(source.register_forward_hook(_key_hook(runtime, index)))
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, nn.Linear):
        handles.append(head.register_forward_pre_hook(_with_standard_strides))
    runtime.handles = handles
    for module in modules:
        object.__setattr__(module, RUNTIME_ATTRIBUTE, runtime)
    object.__setattr__(model, RUNTIME_ATTRIBUTE, runtime)


def _with_standard_strides(module: nn.Module, args: tuple) -> tuple:
    """A forward pre-hook of the output head: its input with the strides of a fresh tensor (a view of one sequence's
    last token; a copy of the last tokens of a batch).

    ``logits_to_keep`` hands the head a slice of the hidden states ([B, 1, hidden] with the strides of [B, S,
    hidden]). With a frozen weight (attach freezes the backbone), torch's matmul does not fold such an input into one
    matrix product: it multiplies by a batched copy of the whole weight instead (seen with torch 2.13 on a CPU: 0.6 s
    of a Qwen2.5-0.5B prefill, against 0.02 s folded).
    """
    hidden = args[0]
    return (hidden.contiguous().reshape(-1, hidden.shape[-1]).view(hidden.shape), *args[1:])


def _backend_for(name: str, softcap: float | None, sinks: bool):
    """The backend ``name`` resolves to, for a model that soft-caps its attention logits (``softcap`` set) or has
    attention sinks: ``"auto"`` then skips a backend without them (``cpu`` for both; ``flex`` and ``fa4`` for sinks)
    for ``reference``; a backend asked for by name that lacks them is refused."""
    backend = get_backend(name)
    needs = [feature for feature, used, supported in (
        (f"logit soft-capping (attn_logit_softcapping={softcap})", softcap is not None, backend.supports_softcap),
        ("attention sinks", sinks, backend.supports_sinks),
    ) if used and not supported]
    if not needs:
        return backend
    if name != "auto":
        raise BackendUnavailableError(
            f"backend {name!r} lacks {' and '.join(needs)}, which this model uses; use 'reference' (which has both), "
            "or for soft-capping 'flex' or 'fa4' (which hands such calls to flex)"
        )
    logger.info("elastic-attention: backend 'auto' takes 'reference' instead of %r, which lacks %s",
                backend.name, " and ".join(needs))
    return get_backend("reference")


def detach(model: nn.Module) -> nn.Module:
    """Remove elastic attention: routers, hooks, the attention implementation; restore ``requires_grad``."""
    runtime = runtime_of(model)
    _, family = family_of(model)
    for module in attention_modules(decoder_of(model, family), family):
        if hasattr(module, ROUTER_ATTRIBUTE):
            delattr(module, ROUTER_ATTRIBUTE)
        module.__dict__.pop(RUNTIME_ATTRIBUTE, None)
    for handle in runtime.handles:
        handle.remove()
    model.__dict__.pop(RUNTIME_ATTRIBUTE, None)
    graphed = model.__dict__.get("forward")
    if isinstance(graphed, GraphedForward):
        graphed.restore(model)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(runtime.requires_grad_before.get(name, True))
    model.set_attn_implementation(runtime.previous_implementation)
    return model


def runtime_of(model: nn.Module) -> ElasticRuntime:
    """The runtime of an attached model.

    Raises:
        NotAttachedError: elastic attention is not attached.
    """
    return attached_runtime(model)


def is_attached(model: nn.Module) -> bool:
    return getattr(model, RUNTIME_ATTRIBUTE, None) is not None


def routers_of(model: nn.Module) -> dict[int, AttentionRouter]:
    """Layer index -> router of an attached model, by the layer each reads (`build_routers`: a head-set router
    sits in the first routed layer alone)."""
    return dict(runtime_of(model).routers)


def routing_report(model: nn.Module) -> RoutingReport:
    """The routing report of the model's last prefill.

    Raises:
        InputError: no prefill has run since attach.
    """
    report = runtime_of(model).report
    if report is None:
        raise InputError("no routing report yet: run a forward pass (or generate) first")
    return report


def set_compile_decode(model: nn.Module, setting: bool | str) -> None:
    """Change an attached model's ``compile_decode`` (`attach`: True, False or ``"auto"``); a cache whose captured
    step was compiled otherwise captures it again at its next step.

    Raises:
        NotAttachedError: elastic attention is not attached to ``model``.
        ConfigError: ``setting`` is not True, False or ``"auto"``.
    """
    runtime_of(model)  # attached, or a NotAttachedError that says so
    model.forward.compile_policy.setting = check_compile_setting(setting)


def force_routing(model: nn.Module, routing: str | torch.Tensor | None) -> None:
    """Override the routers, for baselines and tests.

    Args:
        routing: ``"full"`` (every routed head on retrieval attention), ``"sparse"`` (every routed head on sparse
            attention), a [L, Hkv] bool tensor over the routed layers (True = retrieval), or None to use the
            routers again.

    Raises:
        ConfigError: unknown string or wrong tensor shape.
    """
    runtime = runtime_of(model)
    shape = (len(runtime.routed_layers), runtime.num_kv_heads)
    if routing is None:
        runtime.forced = None
    elif isinstance(routing, str):
        if routing not in ("full", "sparse"):
            raise ConfigError(f"routing must be 'full', 'sparse', a bool tensor or None, got {routing!r}")
        runtime.forced = torch.full(shape, routing == "full", dtype=torch.bool)
    else:
        if tuple(routing.shape) != shape:
            raise ConfigError(
                f"forced routing must have shape [routed layers, KV heads] = {list(shape)}, got {list(routing.shape)}"
            )
        runtime.forced = routing.to(torch.bool).cpu()


def force_head_set(model: nn.Module, index: int | None) -> None:
    """Run the head set ``index`` of the model's `HeadSetRouter` for every prompt, keeping what the router would
    have read (each prefill's pooled keys in ``runtime_of(model).routing.set_router_input``); None lets it choose
    again. A routing forced by `force_routing` takes precedence.

    Raises:
        ConfigError: the model's routers decide each KV head (no head sets), or ``index`` is not one of its sets.
    """
    routing = runtime_of(model).routing
    router = routing.routers[min(routing.routers)]
    choices = router.choices
    if index is not None:
        if isinstance(router, SignalSetRouter):
            raise ConfigError("force_head_set serves training a HeadSetRouter; this model's SignalSetRouter has no "
                              "weights: use force_routing to run one of its sets")
        if not choices:
            raise ConfigError("force_head_set needs a head-set router (`head_set_choices`); this model's routers "
                              "decide each KV head: use force_routing")
        if not 0 <= index < choices:
            raise ConfigError(f"head set {index} does not exist: the router chooses among sets 0 to {choices - 1}")
    routing.forced_set = index


def _key_hook(runtime: ElasticRuntime, layer_index: int):
    @torch.compiler.disable  # a compiled layer (compile_decode) calls it as it is, without tracing into the runtime
    def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        runtime.after_key_source(layer_index, output)

    return hook
