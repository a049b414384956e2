"""elastic-attention: per-input, per-KV-head routing between full and sparse attention for Hugging Face decoders."""

from elastic_attention.adapters import load_router, save_router
from elastic_attention.cache import ElasticCache
from elastic_attention.config import ElasticConfig
from elastic_attention.errors import (
    AdapterMismatchError,
    BackendUnavailableError,
    ConfigError,
    ElasticAttentionError,
    InputError,
    UnsupportedModelError,
)
from elastic_attention.integration import (
    RoutingReport,
    attach,
    detach,
    force_routing,
    is_attached,
    routers_of,
    routing_report,
)
from elastic_attention.pretrained import from_pretrained, save_pretrained
from elastic_attention.router import AttentionRouter

__version__ = "0.1.0"

__all__ = [
    "AdapterMismatchError",
    "AttentionRouter",
    "BackendUnavailableError",
    "ConfigError",
    "ElasticAttentionError",
    "ElasticCache",
    "ElasticConfig",
    "InputError",
    "RoutingReport",
    "UnsupportedModelError",
    "attach",
    "detach",
    "force_routing",
    "from_pretrained",
    "is_attached",
    "load_router",
    "routers_of",
    "routing_report",
    "save_pretrained",
    "save_router",
]
