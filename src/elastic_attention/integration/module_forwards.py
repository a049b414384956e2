"""Modules' ``forward`` replaced for the length of a block."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def replaced_forwards(replacements: list[tuple]):
    """Inside the block each ``(module, forward)`` pair's module calls ``forward``; after it, its own again (an
    instance attribute it had, such as an accelerate hook's, is put back)."""
    previous = [(module, module.__dict__.get("forward")) for module, _ in replacements]
    for module, forward in replacements:
        module.forward = forward
    try:
        yield
    finally:
        for module, own in previous:
            if own is None:
                del module.forward
            else:
                module.forward = own
