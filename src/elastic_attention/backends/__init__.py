"""Attention backends behind one small interface (`AttentionBackend`), resolved by name.

Backends are imported lazily: importing this package never imports an optional kernel library.
"""

from __future__ import annotations

import logging

import torch

from elastic_attention.backends.base import AttentionBackend
from elastic_attention.backends.reference import ReferenceBackend
from elastic_attention.errors import BackendUnavailableError

logger = logging.getLogger(__name__)

#: Backends that can be asked for by name, fastest first ("auto" takes the first that can run here).
BACKEND_NAMES = ("fa4", "flex", "cpu", "reference")

_AUTO_CHOICE_LOGGED = False


def get_backend(name: str = "auto") -> AttentionBackend:
    """The backend called ``name``; ``"auto"`` picks one that can run here and logs its choice once.

    ``auto``: ``fa4`` on a Hopper-or-newer GPU with flash-attn-4 installed, else ``flex`` on any CUDA GPU, else
    ``cpu`` (SDPA over the attended blocks only; compiled FlexAttention is slower on a CPU).

    Raises:
        BackendUnavailableError: ``name`` is unknown or cannot run here (the message says why).
    """
    global _AUTO_CHOICE_LOGGED
    if name == "auto":
        backend, reasons = None, []
        for candidate in BACKEND_NAMES:
            if candidate == "flex" and not torch.cuda.is_available():
                reasons.append("flex: no CUDA GPU")
                continue
            try:
                backend = get_backend(candidate)
                break
            except BackendUnavailableError as error:
                reasons.append(str(error))
        if not _AUTO_CHOICE_LOGGED:
            logger.info("elastic-attention: backend 'auto' chose %r (%s)", backend.name, "; ".join(reasons) or "first")
            _AUTO_CHOICE_LOGGED = True
        return backend
    if name == "reference":
        return ReferenceBackend()
    if name == "cpu":
        from elastic_attention.backends.cpu_blocks import CPUBlockBackend

        return CPUBlockBackend()
    if name == "flex":
        from elastic_attention.backends.flex import FlexBackend

        return FlexBackend()
    if name == "fa4":
        from elastic_attention.backends.fa4 import FA4Backend

        return FA4Backend()
    raise BackendUnavailableError(
        f"unknown attention backend {name!r}; available: {['auto', *BACKEND_NAMES]}"
    )


__all__ = ["AttentionBackend", "BACKEND_NAMES", "ReferenceBackend", "get_backend"]
