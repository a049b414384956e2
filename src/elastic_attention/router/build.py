"""`build_routers`: the one place that decides which router type a configuration gets and where it sits."""

from __future__ import annotations

from elastic_attention.config import ElasticConfig
from elastic_attention.router.head_set_router import HeadSetRouter
from elastic_attention.router.router import AttentionRouter


def build_routers(config: ElasticConfig, routed_layers: tuple[int, ...], head_dim: int,
                  num_kv_heads: int) -> dict[int, AttentionRouter]:
    """The routers of ``config``, by the routed layer each sits in and reads the pooled keys of.

    A router decides its own layer and the routed layers after it, up to the next router (`ModelRouting`):
    ``config.head_set_choices`` C gives one `HeadSetRouter` in the first routed layer, choosing among C sets that
    cover every routed layer; otherwise one `AttentionRouter` per routed layer decides each KV head of its layer.

    Args:
        config: the configuration (router width, standardizing, head sets, safety floor).
        routed_layers: the routed layers, ascending.
        head_dim: D.
        num_kv_heads: Hkv.

    Returns:
        Layer index -> router (new, on the CPU, in training mode).
    """
    if config.head_set_choices:
        return {routed_layers[0]: HeadSetRouter(
            head_dim, config.router_width, num_kv_heads, config.head_set_choices, len(routed_layers),
            standardize=config.router_standardize, floor_set=config.floor_set, floor_confidence=config.floor_confidence,
        )}
    standardize = num_kv_heads if config.router_standardize else None
    return {index: AttentionRouter(head_dim, config.router_width, standardize) for index in routed_layers}
