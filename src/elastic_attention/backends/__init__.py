"""Attention backends behind one small interface (`AttentionBackend`), resolved by name.

Backends are imported lazily: importing this package never imports an optional kernel library.
"""

from __future__ import annotations

import logging

from elastic_attention.backends.base import AttentionBackend
from elastic_attention.backends.reference import ReferenceBackend
from elastic_attention.errors import BackendUnavailableError

logger = logging.getLogger(__name__)

#: Backends that can be asked for by name.
BACKEND_NAMES = ("reference", "flex")

_AUTO_CHOICE_LOGGED = False


def get_backend(name: str = "auto") -> AttentionBackend:
    """The backend called ``name``; ``"auto"`` picks one that can run here and logs its choice once.

    ``auto`` picks ``reference`` for now: ``flex`` is checked against it on CPU but has not been validated and timed
    on a GPU yet; ask for it by name.

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
    if name == "flex":
        from elastic_attention.backends.flex import FlexBackend

        return FlexBackend()
    raise BackendUnavailableError(
        f"unknown attention backend {name!r}; available: {['auto', *BACKEND_NAMES]}"
    )


__all__ = ["AttentionBackend", "BACKEND_NAMES", "ReferenceBackend", "get_backend"]
