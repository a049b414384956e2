"""Attention backends behind one small interface (`AttentionBackend`), resolved by name.

Backends are imported lazily: importing this package never imports an optional kernel library.
"""

from __future__ import annotations

import logging

from elastic_attention.backends.base import AttentionBackend
from elastic_attention.backends.reference import ReferenceBackend
from elastic_attention.errors import BackendUnavailableError

logger = logging.getLogger(__name__)

#: Backends in the order `auto` tries them.
BACKEND_NAMES = ("reference",)

_AUTO_CHOICE_LOGGED = False


def get_backend(name: str = "auto") -> AttentionBackend:
    """The backend called ``name``; ``"auto"`` picks the fastest one that can run here and logs its choice once.

    Raises:
        BackendUnavailableError: ``name`` is unknown or cannot run here (the message says why).
    """
    global _AUTO_CHOICE_LOGGED
    if name == "auto":
        backend = ReferenceBackend()
        if not _AUTO_CHOICE_LOGGED:
            logger.info("elastic-attention: backend 'auto' chose %r", backend.name)
            _AUTO_CHOICE_LOGGED = True
        return backend
    if name == "reference":
        return ReferenceBackend()
    raise BackendUnavailableError(
        f"unknown attention backend {name!r}; available: {['auto', *BACKEND_NAMES]}"
    )


__all__ = ["AttentionBackend", "BACKEND_NAMES", "ReferenceBackend", "get_backend"]
