"""Readers of the units a user types: token counts ('4k'), comma lists, counts, fractions and MSRs.

Argument types for argparse: each takes the text as typed and returns the value, or raises
`argparse.ArgumentTypeError` with a one-line message that says what it expected (argparse turns it into a usage
error). Imports nothing of the package, so every command line (the CLI, the benchmarks) can use them.
"""

from __future__ import annotations

import argparse

_TOKEN_SUFFIXES = {"k": 1 << 10, "m": 1 << 20}


def parse_length(text: str) -> int:
    """A positive token count: '4k' -> 4096, '1m' -> 1048576, '3000' -> 3000.

    Raises:
        argparse.ArgumentTypeError: anything else (argparse turns it into a one-line usage error).
    """
    cleaned = text.strip().lower()
    try:
        value = int(cleaned[:-1]) * _TOKEN_SUFFIXES[cleaned[-1]] if cleaned[-1:] in _TOKEN_SUFFIXES else int(cleaned)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"cannot read length {text!r}: use a token count like 3000, 4k or 1m") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a length must be at least 1 token, got {text!r}")
    return value


def comma_list(text: str) -> list[str]:
    """The non-empty, stripped items of a comma list: ' a, b,,c' -> ['a', 'b', 'c']."""
    return [part.strip() for part in text.split(",") if part.strip()]


def length_list(text: str) -> list[int]:
    """A comma list of lengths ('2k,4k' -> [2048, 4096]), at least one.

    Raises:
        argparse.ArgumentTypeError: no length, or an item `parse_length` cannot read.
    """
    lengths = [parse_length(part) for part in comma_list(text)]
    if not lengths:
        raise argparse.ArgumentTypeError(f"no length in {text!r}: give a comma list like 2k,4k")
    return lengths


def positive_int(text: str) -> int:
    """An integer of at least 1.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """An integer of at least 0.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    return _int_at_least(text, 0, "an integer of at least 0")


def _int_at_least(text: str, minimum: int, expected: str) -> int:
    """``text`` as an integer of at least ``minimum``; the error says ``expected ...``."""
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A number in [0, 1] (an MSR, a share).

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def msr_list(text: str) -> list[float]:
    """A comma list of MSRs, each in (0, 1] ('0.5,0.6' -> [0.5, 0.6]), at least one.

    Raises:
        argparse.ArgumentTypeError: no number, or one that is not in (0, 1].
    """
    try:
        msrs = [float(part) for part in comma_list(text)]
    except ValueError:
        msrs = []
    if not msrs or any(not 0.0 < msr <= 1.0 for msr in msrs):
        raise argparse.ArgumentTypeError(f"expected a comma list of numbers in (0, 1], e.g. 0.5,0.6, got {text!r}")
    return msrs
