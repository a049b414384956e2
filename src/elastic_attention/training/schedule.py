"""Schedule pieces: learning-rate factors shared by the router trainer and the pretraining recipe, and where a
router run's schedules stand under a time budget."""

from __future__ import annotations

import math


def linear_warmup(step: int, warmup_steps: int) -> float:
    """``(step + 1) / warmup_steps`` during the warm-up (0-based ``step``), 1 from then on."""
    return min(1.0, (step + 1) / max(1, warmup_steps))


def cosine_decay(progress: float, floor: float = 0.0) -> float:
    """Half a cosine from 1 at ``progress`` 0 down to ``floor`` at 1 (and ``floor`` past 1)."""
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return floor + (1.0 - floor) * cosine


def schedule_position(step: int, steps: int, train_seconds: float, max_seconds: float,
                      first_visit_seconds: float = 0.0, pending_first_visit_seconds: float = 0.0) -> float:
    """Where a run's schedules (warm-up, learning rate, temperature) stand, in steps, under a time budget: ``step``,
    or further when the budget would run out first: the seconds the steps themselves have spent, over what the
    budget leaves them once every first visit is paid, of ``steps``:
    ``max(step, (train_seconds - first_visit_seconds) / (max_seconds - first_visit_seconds - pending) * steps)``.

    First visits do work once per pack that later visits reuse (the C forwards of ``head_set_objective:
    expected``): ``first_visit_seconds`` were spent on them (within ``train_seconds``), ``pending_first_visit_seconds``
    are estimated still to come. They count against the budget but are not taken as the pace of the steps, so a run
    whose steps fit in what the first visits leave keeps its schedules on the steps, however long its first epoch,
    and one the budget stops reaches each schedule's end as it stops. When the first visits alone would spend the
    budget, the schedules follow the share of it spent, ``train_seconds / max_seconds * steps``.
    """
    left = max_seconds - first_visit_seconds - pending_first_visit_seconds
    if left <= 0:
        return max(float(step), train_seconds / max_seconds * steps)
    return max(float(step), (train_seconds - first_visit_seconds) / left * steps)
