"""The random source every task suite draws from: :class:`SampleRandom` draws depend only on the seed, and
:func:`sample_seed` derives each sample's seed from (task, length, seed, index), so rows are identical across
processes, platforms and Python versions.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from elastic_attention.errors import InputError

T = TypeVar("T")


class SampleRandom:
    """A seeded random source whose draws depend only on the seed, not on the Python version.

    Only ``random.Random.getrandbits`` is used (its Mersenne Twister stream for an integer seed has been fixed since
    Python 3.2); integers are drawn by rejection sampling, exactly as CPython does today, but without relying on it.

    Args:
        seed: a non-negative integer.
    """

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def below(self, bound: int) -> int:
        """A uniform integer in ``[0, bound)``; ``bound`` must be positive."""
        bits = bound.bit_length()
        while True:
            draw = self._random.getrandbits(bits)
            if draw < bound:
                return draw

    def integer(self, low: int, high: int) -> int:
        """A uniform integer in ``[low, high]`` (both inclusive)."""
        return low + self.below(high - low + 1)

    def fraction(self) -> float:
        """A uniform float in ``[0, 1)`` with 53 random bits."""
        return self._random.getrandbits(53) / float(1 << 53)

    def choice(self, items: Sequence[T]) -> T:
        """A uniformly chosen element of a non-empty sequence."""
        return items[self.below(len(items))]

    def shuffle(self, items: list[Any]) -> None:
        """Shuffle ``items`` in place (Fisher-Yates)."""
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]

    def sample(self, items: Sequence[T], count: int, exclude: Iterable[T] = ()) -> list[T]:
        """``count`` distinct elements of ``items`` not in ``exclude``, in random order."""
        excluded = set(exclude)
        pool = [item for item in items if item not in excluded]
        if count > len(pool):
            raise InputError(f"cannot draw {count} distinct items from a pool of {len(pool)}")
        for i in range(count):
            j = i + self.below(len(pool) - i)
            pool[i], pool[j] = pool[j], pool[i]
        return pool[:count]


def sample_seed(task: str, length: int, seed: int, index: int) -> int:
    """The seed of sample ``index`` of ``generate(task, length, seed, n)``.

    Args:
        task: task name.
        length: requested rendered prompt length in tokens.
        seed: the caller's seed (any integer).
        index: sample index, ``0 <= index < n``.

    Returns:
        A 64-bit non-negative integer: the first 8 bytes (big endian) of SHA-256 of ``"{task}|{length}|{seed}|{index}"``.
    """
    digest = hashlib.sha256(f"{task}|{length}|{seed}|{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big")
