"""Hugging Face glue: attach/detach, the registered attention function, per-family data."""

from elastic_attention.integration.attach import (
    attach,
    detach,
    force_head_set,
    force_routing,
    is_attached,
    routers_of,
    routing_report,
    runtime_of,
    set_compile_decode,
)
from elastic_attention.integration.families import FAMILIES, FamilySpec
from elastic_attention.integration.report import RoutingReport

__all__ = [
    "FAMILIES",
    "FamilySpec",
    "RoutingReport",
    "attach",
    "detach",
    "force_head_set",
    "force_routing",
    "is_attached",
    "routers_of",
    "routing_report",
    "runtime_of",
    "set_compile_decode",
]
