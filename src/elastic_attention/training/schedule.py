"""Learning-rate schedule pieces shared by the router trainer and the pretraining recipe (factors of the peak lr)."""

from __future__ import annotations

import math


def linear_warmup(step: int, warmup_steps: int) -> float:
    """``(step + 1) / warmup_steps`` during the warm-up (0-based ``step``), 1 from then on."""
    return min(1.0, (step + 1) / max(1, warmup_steps))


def cosine_decay(progress: float, floor: float = 0.0) -> float:
    """Half a cosine from 1 at ``progress`` 0 down to ``floor`` at 1 (and ``floor`` past 1)."""
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return floor + (1.0 - floor) * cosine
