"""Learning-rate schedules: warm-up then cosine in optimiser steps, and the plan that fits one to a time budget.

A schedule counted in steps cannot fit a budget counted in minutes: the same 32 epochs take 26 minutes on one 2-core
machine and more than an hour on another. :class:`TimePlan` is the schedule of ``model.schedule: time``: the cosine
runs to ``total_steps``, which :func:`plan_total_steps` re-estimates from the measured cost of a step and of a
validation as the run goes (:class:`vit.callbacks.TimeBudget`), so that the learning rate reaches ``min_lr`` as the
budget ends, on a fast machine as on a slow or busy one. The warm-up stays counted in steps: what it protects
against (large early updates) depends on how many updates were made, not on how long they took.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> float:
    """Learning-rate factor at optimiser step ``step``: linear warm-up, then cosine decay to ``min_ratio``.

    Step ``s < warmup_steps`` gets ``(s + 1) / warmup_steps`` (the first step already moves, the last warm-up
    step reaches 1); from ``warmup_steps`` on the factor follows a half cosine from 1 down to ``min_ratio``,
    reached at ``total_steps`` and held afterwards.

    Args:
        step: Optimiser steps taken so far (0 for the first step).
        warmup_steps: Length of the linear warm-up, 0 for none.
        total_steps: Step at which the cosine reaches ``min_ratio``.
        min_ratio: Final learning rate relative to the peak (``min_lr / lr``).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class TimePlan:
    """The state of a time-budgeted schedule, and its learning-rate factor (``LambdaLR`` calls it with the step).

    ``LambdaLR`` saves the ``__dict__`` of a callable object in its state dict and restores it on load, so a
    resumed run continues with the plan it had (its ``total_steps``, ``tail_start``) until the next re-plan.

    Attributes:
        warmup_steps: Linear warm-up in optimiser steps (kept, not re-planned).
        total_steps: Step at which the run ends and the cosine reaches ``min_ratio``; re-planned as the run goes.
        min_ratio: ``min_lr / lr``.
        tail_steps: Steps at the end trained without PatchDropout (``unmasked_epochs`` × steps per epoch).
        tail_cost: Cost of a tail step relative to a step before it, until one is measured (PatchDropout at rate
            ``p`` keeps ``1 - p`` of the patches: about ``1 / (1 - p)``).
        tail_start: Step at which that tail began, ``-1`` before it; once begun it stays (a plan that shrinks
            later does not switch PatchDropout back on).
        planned: Whether ``total_steps`` comes from a measurement (``False``: the first guess before one).
    """

    warmup_steps: int
    total_steps: int
    min_ratio: float
    tail_steps: int = 0
    tail_cost: float = 1.0
    tail_start: int = -1
    planned: bool = False

    def __call__(self, step: int) -> float:
        return warmup_cosine(step, min(self.warmup_steps, self.total_steps), self.total_steps, self.min_ratio)

    def in_last(self, step: int, steps: float) -> bool:
        """Whether a measured plan (not the first guess made before a step was timed) puts step ``step`` within its
        last ``steps`` steps: where a tail of that length begins."""
        return self.planned and step >= self.total_steps - steps

    def in_tail(self, step: int) -> bool:
        """Whether step ``step`` trains on every patch: the tail has begun, or the plan puts it there
        (:meth:`in_last`)."""
        return self.tail_steps > 0 and (self.tail_start >= 0 or self.in_last(step, self.tail_steps))


def plan_total_steps(
    step: int,
    seconds_left: float,
    step_seconds: float,
    validation_seconds: float,
    steps_per_validation: float,
    tail_steps_left: int = 0,
    tail_cost: float = 1.0,
) -> int:
    """The total number of optimiser steps that ``seconds_left`` buys, counted from step ``step``.

    The remaining time is spent on ``s`` training steps of ``step_seconds`` each (those of the tail, at most
    ``tail_steps_left`` of them, cost ``tail_cost`` times more), ``s / steps_per_validation`` validations of
    ``validation_seconds`` each, and one validation more at the end (a run stopped by its plan is validated before it
    stops)::

        seconds_left = s * step_seconds + min(s, tail) * step_seconds * (tail_cost - 1)
                       + (s / steps_per_validation + 1) * validation_seconds

    Args:
        step: Optimiser steps taken so far.
        seconds_left: Budget left for training and validation (the final checkpoint's reserve already taken off).
        step_seconds: Measured seconds per training step (data loading, logging and checkpoints included).
        validation_seconds: Seconds per validation run.
        steps_per_validation: Training steps between two validations (``inf`` when the run never validates).
        tail_steps_left: Steps of the unmasked tail not yet trained.
        tail_cost: Cost of a tail step relative to ``step_seconds``.

    Returns:
        ``step + s``, at least ``step + 1``: the plan never ends before the step under way.
    """
    per_step = step_seconds + validation_seconds / steps_per_validation
    extra = max(0.0, tail_cost - 1.0) * step_seconds
    available = seconds_left - validation_seconds
    steps = available / per_step
    if tail_steps_left and extra:  # the tail's extra cost, for the part of the tail that fits
        tail = min(tail_steps_left, max(0.0, steps))
        steps = (available - tail * extra) / per_step
        if steps < tail:  # the whole remainder is tail: every step costs tail_cost
            steps = available / (per_step + extra)
    return step + max(1, math.floor(steps + 1e-9))  # 98 / 0.14 is 699.99... in floating point
