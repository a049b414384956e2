"""Temperature schedules of the straight-through Gumbel-softmax (the temperature scales the gradient only)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from elastic_attention.errors import ConfigError


@dataclass(frozen=True)
class TemperatureSchedule:
    """Temperature against training step.

    Attributes:
        kind: ``"cosine"`` (from ``start`` to ``end`` over the first ``fraction`` of the steps, then ``end``; what the
            reference code does) or ``"exponential"`` (``start * decay**step``, floored at ``end``; the paper's form).
        start: initial temperature.
        end: final (or minimum) temperature.
        fraction: share of the steps the cosine spans.
        decay: per-step factor of the exponential schedule.
    """

    kind: str = "cosine"
    start: float = 1.5
    end: float = 1.0
    fraction: float = 0.6
    decay: float = 0.99

    def __post_init__(self) -> None:
        if self.kind not in ("cosine", "exponential"):
            raise ConfigError(f"temperature `kind` must be 'cosine' or 'exponential', got {self.kind!r}")
        if self.start <= 0 or self.end <= 0:
            raise ConfigError(f"temperatures must be positive, got start={self.start}, end={self.end}")
        if not 0 < self.fraction <= 1:
            raise ConfigError(f"temperature `fraction` must be in (0, 1], got {self.fraction}")
        if not 0 < self.decay <= 1:
            raise ConfigError(f"temperature `decay` must be in (0, 1], got {self.decay}")

    def at(self, step: int, total_steps: int) -> float:
        """Temperature at ``step`` (0-based) of ``total_steps``."""
        if self.kind == "exponential":
            return max(self.end, self.start * self.decay**step)
        span = max(1, round(self.fraction * total_steps))
        progress = min(1.0, step / span)
        return self.end + (self.start - self.end) * 0.5 * (1.0 + math.cos(math.pi * progress))
