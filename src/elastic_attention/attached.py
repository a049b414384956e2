"""Where `attach` keeps a model's runtime, for the modules that need it without the integration.

The bounded cache finds the runtime here when it is built (window sizes, soft-cap, sinks, sliding layers) and tells
it when the batch is reordered; its routing is pushed to it (`begin_forward`, `route_layer`). So the cache never
imports the integration that drives it.
"""

from __future__ import annotations

from typing import Any

from elastic_attention.errors import NotAttachedError

#: The attribute on an attached model (and on its attention modules) that holds its runtime.
RUNTIME_ATTRIBUTE = "_elastic_runtime"


def attached_runtime(model: Any) -> Any:
    """The runtime `attach` put on ``model``.

    Raises:
        NotAttachedError: elastic attention is not attached.
    """
    runtime = getattr(model, RUNTIME_ATTRIBUTE, None)
    if runtime is None:
        raise NotAttachedError("elastic attention is not attached to this model; call attach(model, config)")
    return runtime
