"""The retrieval-signal teacher: a label-free target for the routers, measured on the model's own attention.

Under full attention, a KV head whose prompt's last queries put at least a threshold tau of their attention where SSA
cannot see them (`router.retrieval_signal`) needs full attention for that prompt; the others can stream. The teacher
runs one no-grad forward of a pack with every head full, reading per routed layer what the routers would read (the
pooled keys) and the signal of each sample and KV head, and gives the routers a cross-entropy against it: a
per-head router against each of its heads' need, a `HeadSetRouter` against the sparsest of its sets that keeps
every needed head full (the densest when none does). Any long text teaches it: a row needs no task or target.
The per-prompt teacher reads one layer instead: a prompt whose signal there reaches tau needs every head, else none.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from elastic_attention.errors import ConfigError
from elastic_attention.integration import force_routing, routers_of, runtime_of
from elastic_attention.router import HeadSetRouter
from elastic_attention.router.retrieval_signal import retrieval_signal
from elastic_attention.training.data import Pack
from elastic_attention.training.losses import forward_pack


@contextmanager
def reading_signals(model):
    """While open, every prefill of the attached ``model`` records, per routed layer, its routers' input
    (``inputs[layer]``: [N, Hkv, D] pooled keys, detached) and the signal of each sequence and KV head
    (``signals[layer]``: [N, Hkv] float32), measured with the model's `ElasticConfig` pattern, ``signal_queries``
    and ``signal_statistic``. Yields ``(inputs, signals)``."""
    runtime = runtime_of(model)
    routing, config = runtime.routing, runtime.config
    inputs: dict[int, torch.Tensor] = {}
    signals: dict[int, torch.Tensor] = {}
    attend, route = runtime.attention, routing.route

    def attention(module, query, key, value, scaling, sinks=None):
        layout = runtime.layout
        if layout is not None and layout.is_prefill and module.layer_idx in routing.routed_layers:
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            signals[module.layer_idx] = retrieval_signal(
                query.detach(), key.detach(), layout, scale, queries=config.signal_queries,
                block_size=config.block_size, sink_tokens=config.sink_tokens, local_tokens=config.local_tokens,
                statistic=config.signal_statistic, prompt_lengths=routing.prompt_lengths)
        return attend(module, query, key, value, scaling, sinks)

    def routed(layer_index, keys, layout):
        inputs[layer_index] = routing.pooled(keys, layout).detach()
        return route(layer_index, keys, layout)

    runtime.attention, routing.route = attention, routed
    try:
        yield inputs, signals
    finally:
        del runtime.attention, routing.route  # the class's methods again


def teacher_targets(model, pack: Pack, device: torch.device, threshold: float,
                    layer: int | None = None) -> tuple[dict, torch.Tensor]:
    """One no-grad forward of ``pack`` with every routed head full.

    ``layer`` None: each head is needed when its own signal reaches ``threshold``. ``layer`` a routed layer: the
    per-prompt teacher, every head of a sample is needed when that layer's signal, the largest over its KV heads,
    reaches ``threshold``, and none otherwise (a head-set router then learns its densest set or its sparsest).

    Returns:
        (inputs, needed): layer -> [N, Hkv, D] the routers' input per routed layer, and [N, R, Hkv] bool, the
        heads needed (R routed layers, in order).

    Raises:
        ConfigError: ``layer`` is not a routed layer.
    """
    runtime = runtime_of(model)
    if layer is not None and layer not in runtime.routed_layers:
        raise ConfigError(f"`signal_teacher_layer` {layer} is not a routed layer of this model "
                          f"({list(runtime.routed_layers)}): give one of them, or null for the per-head teacher")
    forced = runtime.routing.forced
    force_routing(model, "full")
    try:
        with reading_signals(model) as (inputs, signals), torch.no_grad():
            forward_pack(model, pack, device, logits_to_keep=1)
    finally:
        runtime.routing.forced = forced
    if layer is not None:
        prompt = signals[layer].amax(dim=1) >= threshold  # [N]
        return inputs, prompt[:, None, None].expand(-1, len(runtime.routed_layers), runtime.num_kv_heads).clone()
    needed = torch.stack([signals[index] >= threshold for index in runtime.routed_layers], dim=1)
    return inputs, needed


def sparsest_covering_set(needed: torch.Tensor, sets: torch.Tensor, msrs: torch.Tensor) -> torch.Tensor:
    """The head-set teacher's target per sample: the sparsest set keeping every needed head full, the densest when
    none does.

    Args:
        needed: [N, R, Hkv] bool, the heads the teacher keeps full.
        sets: [C, R, Hkv] bool, the router's sets (True = full attention).
        msrs: [C] each set's MSR.

    Returns:
        [N] long, set indices.
    """
    covers = ~(needed[:, None] & ~sets[None]).flatten(2).any(dim=2)  # [N, C]
    score = torch.where(covers, msrs[None].float(), -1.0 - msrs[None].float())
    return score.argmax(dim=1)


def teacher_loss(model, inputs: dict, needed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The routers' cross-entropy against the teacher, and each sample's expected MSR under the routers' softmax.

    Args:
        model: the attached model (its routers at their current temperature).
        inputs: layer -> [N, Hkv, D] what each routed layer's router reads (`teacher_targets`).
        needed: [N, R, Hkv] bool, the heads the teacher keeps full.

    Returns:
        (scalar loss with the routers' gradient, [N] expected MSR).
    """
    routers = routers_of(model)
    layers = runtime_of(model).routed_layers
    if len(routers) == 1 and isinstance(next(iter(routers.values())), HeadSetRouter):
        (layer, router), = routers.items()
        sets = router.head_sets.bool()  # [C, R, Hkv]
        msrs = router.set_msrs().to(sets.device)
        target = sparsest_covering_set(needed.to(sets.device), sets, msrs)
        logits = router.choice_logits(inputs[layer]) / router.temperature
        loss = torch.nn.functional.cross_entropy(logits, target)
        return loss, torch.softmax(logits, dim=-1) @ msrs.to(logits.dtype)
    losses, full, counted = [], [], 0
    for position, layer in enumerate(layers):
        router = routers[layer]
        logits = router.logits(inputs[layer]) / router.temperature  # [N, Hkv, 2]
        target = needed[:, position].to(logits.device).long()
        pinned = router.pinned_heads()
        keep = torch.ones_like(target, dtype=torch.bool) if pinned is None else ~pinned[None].expand_as(target)
        losses.append(torch.nn.functional.cross_entropy(logits[keep], target[keep], reduction="sum"))
        counted += int(keep.sum())
        probability = torch.softmax(logits, dim=-1)[..., 1]
        full.append(torch.where(keep, probability, torch.zeros_like(probability)))
    return torch.stack(losses).sum() / max(counted, 1), 1.0 - torch.stack(full, dim=1).mean(dim=(1, 2))
