"""A run's time budget (``vit.train --time-budget``), without torch: the parser reads durations and checks what a
budget needs; the trainer plans the epochs at the end of ``PLAN_EPOCH`` with ``plan_epochs``."""

from __future__ import annotations

import math

# --time-budget: the epochs are planned at the end of the warmup, and not before this epoch (the first compiles,
# so its time says little); with the cosine the warmup must last at least this long, so that the steps before the
# plan trained at the planned run's rates.
PLAN_EPOCH = 2
BUDGET_MAX_EPOCHS = 10_000  # what a budgeted run may plan when --epochs does not bound it
MAX_BUDGET_SECONDS = 366 * 86_400
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_duration(text: str) -> float:
    """Seconds of a duration written as ``600``, ``600s``, ``10m``, ``1.5h`` or ``2d``; raises ValueError."""
    text = text.strip().lower()
    unit = _DURATION_UNITS.get(text[-1:]) if text else None
    value = float(text[:-1] if unit else text) * (unit or 1)
    if not 0 < value <= MAX_BUDGET_SECONDS:  # also false for NaN
        raise ValueError(text)
    return value


BUDGET_SAFETY = 1.02  # each planned epoch is taken to last this much longer than the one measured
# A plan is corrected when what fits differs from it by two epochs or more, and by this share of the budget.
BUDGET_TOLERANCE = 0.01
BUDGET_SPACING = 0.05  # and at least this share of the plan's epochs (and two) after the last plan or correction


def plan_epochs(budget: float, spent: float, epoch_seconds: float, done: int, most: int) -> int:
    """The epochs of a run with a wall-time ``budget`` (seconds from its launch), planned after ``done`` epochs
    and ``spent`` seconds, when an epoch takes ``epoch_seconds``: ``done`` plus the whole epochs that fit in what
    is left, ``BUDGET_SAFETY`` times as long each, and at most ``most`` in all."""
    more = math.floor(max(budget - spent, 0.0) / max(epoch_seconds * BUDGET_SAFETY, 1e-9))
    return int(min(most, done + more))
