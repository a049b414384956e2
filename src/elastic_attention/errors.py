"""Exception classes of elastic-attention.

Every error a user can trigger names the offending value and, where there is one, the fix.
"""


class ElasticAttentionError(Exception):
    """Base class of every error raised by elastic-attention."""


class ConfigError(ElasticAttentionError, ValueError):
    """A configuration field is missing, out of range or inconsistent with another field."""


class UnsupportedModelError(ElasticAttentionError, ValueError):
    """The model cannot be served: unknown family, unsupported attention variant, or not attached."""


class NotAttachedError(UnsupportedModelError):
    """Something that needs elastic attention on the model (routing, the registered attention function, saving the
    routers) met a model it is not attached to."""


class AdapterMismatchError(ElasticAttentionError, ValueError):
    """A saved router adapter does not fit the model it is loaded onto."""


class InputError(ElasticAttentionError, ValueError):
    """A forward pass received inputs that elastic attention cannot route (empty batch, bad mask, ...)."""


class BackendUnavailableError(ElasticAttentionError, RuntimeError):
    """An attention backend was requested by name but cannot run here."""
