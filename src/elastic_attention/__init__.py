"""elastic-attention: per-input, per-KV-head routing between full and sparse attention for Hugging Face decoders.

The public names are loaded on first use (PEP 562), so importing the package, its errors or its command line loads
neither torch nor transformers until a name that needs them is used: `elastic-attention --help` answers at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "AdapterMismatchError": "elastic_attention.errors",
    "AttentionRouter": "elastic_attention.router",
    "BackendUnavailableError": "elastic_attention.errors",
    "ConfigError": "elastic_attention.errors",
    "ElasticAttentionError": "elastic_attention.errors",
    "ElasticCache": "elastic_attention.cache",
    "ElasticConfig": "elastic_attention.config",
    "InputError": "elastic_attention.errors",
    "NotAttachedError": "elastic_attention.errors",
    "RoutingReport": "elastic_attention.integration",
    "UnsupportedModelError": "elastic_attention.errors",
    "attach": "elastic_attention.integration",
    "detach": "elastic_attention.integration",
    "force_routing": "elastic_attention.integration",
    "from_pretrained": "elastic_attention.pretrained",
    "is_attached": "elastic_attention.integration",
    "load_router": "elastic_attention.adapters",
    "routers_of": "elastic_attention.integration",
    "routing_report": "elastic_attention.integration",
    "save_pretrained": "elastic_attention.pretrained",
    "save_router": "elastic_attention.adapters",
    "set_compile_decode": "elastic_attention.integration",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'elastic_attention' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:
    from elastic_attention.adapters import load_router, save_router
    from elastic_attention.cache import ElasticCache
    from elastic_attention.config import ElasticConfig
    from elastic_attention.errors import (
        AdapterMismatchError,
        BackendUnavailableError,
        ConfigError,
        ElasticAttentionError,
        InputError,
        NotAttachedError,
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
        set_compile_decode,
    )
    from elastic_attention.pretrained import from_pretrained, save_pretrained
    from elastic_attention.router import AttentionRouter
