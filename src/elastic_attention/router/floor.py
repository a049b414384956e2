"""Calibrating a head-set router's safety floor on validation rows.

A `HeadSetRouter` with a floor (``floor_set``, ``floor_confidence``) sends a prompt whose most probable set is sparser
than the floor set, chosen with a probability under ``floor_confidence``, to the floor set instead. The threshold is
chosen here from validation rows of the training generator (never from the rows a result is reported on): the
smallest one under which the floor catches the rows that need it, up to an allowed share of misses. A
`SignalSetRouter`'s floor is its last threshold on the retrieval signal (`signal_floor_threshold`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FloorCalibration:
    """A calibrated threshold and what it does on the validation rows it was chosen on.

    Attributes:
        threshold: ``floor_confidence``: a row whose most probable set is sparser than the floor set falls back when
            that set's probability is below it.
        rows: validation rows whose most probable set is sparser than the floor set (the rows the floor can act on).
        need: of those, the rows that need the floor (their set fails them, the floor set does not).
        caught: of those, the rows the threshold sends to the floor.
        moved_without_need: rows sent to the floor that did not need it (what the floor costs in sparsity).
    """

    threshold: float
    rows: int
    need: int
    caught: int
    moved_without_need: int


def floor_threshold(confidence: torch.Tensor, needs_floor: torch.Tensor, max_missed: float = 0.0) -> FloorCalibration:
    """The smallest threshold under which the floor catches all but ``max_missed`` of the rows that need it.

    Args:
        confidence: [N] the probability of each validation row's most probable set, for the rows whose most probable
            set is sparser than the floor set.
        needs_floor: [N] bool, True where that set fails the row and the floor set keeps it.
        max_missed: the share of the rows that need the floor allowed to keep their set, in [0, 1).

    Returns:
        The `FloorCalibration`; its threshold is 0.0 when no row needs the floor.

    Raises:
        ValueError: tensors of different shapes, or ``max_missed`` outside [0, 1).
    """
    confidence = confidence.double().flatten()
    needs_floor = needs_floor.bool().flatten()
    if confidence.shape != needs_floor.shape:
        raise ValueError(f"confidence {list(confidence.shape)} and needs_floor {list(needs_floor.shape)} must match")
    if not 0.0 <= max_missed < 1.0:
        raise ValueError(f"max_missed must be in [0, 1), got {max_missed}")
    needed = confidence[needs_floor].sort(descending=True).values
    allowed_misses = math.floor(max_missed * len(needed))
    if len(needed) == 0 or allowed_misses >= len(needed):
        threshold = 0.0
    else:
        # the highest confidence that must still fall back, and the next float above it: `p < threshold` catches it
        threshold = min(1.0, math.nextafter(float(needed[allowed_misses]), math.inf))
    moved = confidence < threshold
    return FloorCalibration(threshold=threshold, rows=len(confidence), need=int(needs_floor.sum()),
                            caught=int((moved & needs_floor).sum()), moved_without_need=int((moved & ~needs_floor).sum()))


def signal_floor_threshold(signal: torch.Tensor, needs_floor: torch.Tensor, recall: float) -> float:
    """The largest threshold on the retrieval signal that keeps at least ``recall`` of the rows that need the floor
    at or above it (a `SignalSetRouter` runs its sparsest set only below its last threshold).

    Args:
        signal: [N] each validation row's signal.
        needs_floor: [N] bool, True where the sparsest set fails the row.
        recall: the share of those rows the threshold must keep, in (0, 1].

    Returns:
        The threshold (a signal value of a row that needs the floor); 0.0 when no row needs it.

    Raises:
        ValueError: tensors of different shapes, or ``recall`` outside (0, 1].
    """
    signal = signal.double().flatten()
    needs_floor = needs_floor.bool().flatten()
    if signal.shape != needs_floor.shape:
        raise ValueError(f"signal {list(signal.shape)} and needs_floor {list(needs_floor.shape)} must match")
    if not 0.0 < recall <= 1.0:
        raise ValueError(f"recall must be in (0, 1], got {recall}")
    needed = signal[needs_floor].sort(descending=True).values
    if len(needed) == 0:
        return 0.0
    return float(needed[max(0, math.ceil(len(needed) * recall - 1e-9) - 1)])
