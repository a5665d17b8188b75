"""Fit a run to ``trainer.max_time``: measure what a step and a validation cost, and re-plan the schedule's length.

Lightning's ``max_time`` only stops a run; with ``model.schedule: time`` this callback plans one. Every
``replan_every_n_steps`` steps, rank 0 measures the seconds per training step (the median of the last few windows,
validation time taken out; the first window after a start, which holds ``torch.compile`` and warm-up, is left out)
and per validation, computes how many steps the rest of the budget buys (:func:`vit.schedule.plan_total_steps`), and
broadcasts that one number: every rank and node then follows the same :class:`vit.schedule.TimePlan`, so their
learning rates agree at every step. One broadcast every few dozen steps instead of sharing the clock at each step: no
per-step synchronisation, and the plan still follows a machine that gets slower or faster.

When the step count reaches the plan, the run is validated (whatever ``check_val_every_n_epoch`` says), checkpointed
and stopped. Lightning's own ``max_time`` stays the hard limit behind it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import Timer

from ..schedule import TimePlan, plan_total_steps

RECENT_WINDOWS = 8  # step-time windows whose median is the cost of a step


def budget_seconds(trainer: Trainer) -> float | None:
    """``trainer.max_time`` in seconds, read from Lightning's :class:`~lightning.pytorch.callbacks.Timer`; ``None``
    without one."""
    for callback in trainer.callbacks:
        if isinstance(callback, Timer) and callback.time_remaining() is not None:
            return callback.time_elapsed() + callback.time_remaining()
    return None


def time_plan(pl_module: LightningModule) -> TimePlan:
    """The module's :class:`~vit.schedule.TimePlan` (``ImageClassifier`` with ``schedule="time"`` makes it in
    ``configure_optimizers``)."""
    plan = getattr(pl_module, "time_plan", None)
    if not isinstance(plan, TimePlan):
        raise TypeError(f"TimeBudget needs a module with a TimePlan in .time_plan; {type(pl_module).__name__} has none")
    return plan


class TimeBudget(Callback):
    """Plan the length of a ``model.schedule: time`` run so that it ends with its budget, ``trainer.max_time``.

    Logs ``train/budget_used`` (the fraction of ``max_time`` elapsed) at every step; the run summary says how many
    steps and epochs the budget bought (:meth:`summary`).

    Args:
        replan_every_n_steps: Steps between two plans (and the length of a timing window).
        reserve: Fraction of the budget kept back for the last checkpoint and the end of the fit.
        clock: Seconds, monotonic (a fake one in tests).
    """

    def __init__(
        self, replan_every_n_steps: int = 50, reserve: float = 0.01, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if replan_every_n_steps < 1:
            raise ValueError(f"replan_every_n_steps must be >= 1, got {replan_every_n_steps}")
        self.replan_every_n_steps = replan_every_n_steps
        self.reserve = reserve
        self.clock = clock
        self.budget: float | None = None
        self.elapsed_before = 0.0  # seconds of the budget spent before a resume
        self.step_seconds: deque[float] = deque(maxlen=RECENT_WINDOWS)
        self.tail_step_seconds: deque[float] = deque(maxlen=RECENT_WINDOWS)
        self.validation_seconds: list[float] = []
        self._start: float | None = None
        self._window: tuple[int, float, float, bool] | None = None  # step, time, validation seconds, in tail
        self._skip_window = True
        self._validation_start: float | None = None

    # ----------------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "elapsed": self.elapsed(),
            "step_seconds": list(self.step_seconds),
            "tail_step_seconds": list(self.tail_step_seconds),
            "validation_seconds": list(self.validation_seconds),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.elapsed_before = float(state_dict.get("elapsed", 0.0))
        self.step_seconds.extend(state_dict.get("step_seconds", []))
        self.tail_step_seconds.extend(state_dict.get("tail_step_seconds", []))
        self.validation_seconds = list(state_dict.get("validation_seconds", []))

    def elapsed(self) -> float:
        """Seconds of the budget spent, resumed runs included."""
        return self.elapsed_before + (self.clock() - self._start if self._start is not None else 0.0)

    # ----------------------------------------------------------------------------------------------------- hooks
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.budget = budget_seconds(trainer)
        if self.budget is None:
            raise ValueError("TimeBudget needs trainer.max_time")
        plan = time_plan(pl_module)
        self._start = self.clock()
        self._window = (trainer.global_step, self._start, 0.0, plan.tail_start >= 0)
        self._skip_window = True
        if self.step_seconds or self.tail_step_seconds:  # resumed: plan at once, for this budget and these caps
            self._replan(trainer, plan, trainer.global_step)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validation_start = self.clock()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or self._validation_start is None:
            return
        seconds = self.clock() - self._validation_start
        self._validation_start = None
        self.validation_seconds.append(seconds)
        if self._window is not None:
            step, start, validation, tail = self._window
            self._window = (step, start, validation + seconds, tail)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any, **kwargs: Any) -> None:
        plan, step = time_plan(pl_module), trainer.global_step
        pl_module.log("train/budget_used", torch.tensor(self.elapsed() / self.budget), on_step=True, on_epoch=False)
        if self._window is not None and step - self._window[0] >= self.replan_every_n_steps:
            self._close_window(step, plan)
            self._replan(trainer, plan, step)
        if step >= plan.total_steps:
            trainer.should_stop = True
            trainer.check_val_every_n_epoch = 1  # the epoch loop then validates the step the plan ends on

    # -------------------------------------------------------------------------------------------------- planning
    def _replan(self, trainer: Trainer, plan: TimePlan, step: int) -> None:
        """Rank 0 estimates, every rank takes its number (a collective: every rank calls this at the same step)."""
        total = self.estimate_total(trainer, plan, step) if trainer.is_global_zero else None
        total = trainer.strategy.broadcast(total, src=0)
        if total is not None:
            plan.total_steps, plan.planned = int(total), True
            for config in trainer.lr_scheduler_configs:  # the next step's rate, already set by the old plan
                scheduler = config.scheduler
                for group, base_lr, factor in zip(
                    scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
                ):
                    group["lr"] = base_lr * factor(scheduler.last_epoch)

    def _close_window(self, step: int, plan: TimePlan) -> None:
        start_step, start, validation, tail = self._window
        now = self.clock()
        in_tail = plan.tail_start >= 0
        if not self._skip_window and tail == in_tail:  # a window in which the tail began measures neither
            seconds = (now - start - validation) / (step - start_step)
            (self.tail_step_seconds if in_tail else self.step_seconds).append(seconds)
        self._skip_window = False
        self._window = (step, now, 0.0, in_tail)

    def estimate_total(self, trainer: Trainer, plan: TimePlan, step: int) -> int | None:
        """Steps the budget buys from ``step`` on, capped by ``max_steps`` / ``max_epochs``; ``None`` until a step
        has been timed."""
        in_tail = plan.tail_start >= 0
        measured = self.tail_step_seconds if in_tail else self.step_seconds
        if not measured:
            return None
        step_seconds = statistics.median(measured)
        steps_per_epoch = steps_in_epoch(trainer)
        if self.validation_seconds:
            validation = statistics.median(self.validation_seconds)
        else:  # a forward pass costs about a third of a training step
            validation = step_seconds / 3 * sum(trainer.num_val_batches or [0]) if trainer.enable_validation else 0.0
        every = trainer.check_val_every_n_epoch
        per_validation = steps_per_epoch * every if every and trainer.enable_validation else math.inf
        tail_cost = 1.0
        if plan.tail_steps and not in_tail:
            measured_tail = statistics.median(self.tail_step_seconds) / step_seconds if self.tail_step_seconds else None
            tail_cost = measured_tail or plan.tail_cost
        total = plan_total_steps(
            step,
            seconds_left=self.budget * (1.0 - self.reserve) - self.elapsed(),
            step_seconds=step_seconds,
            validation_seconds=validation,
            steps_per_validation=per_validation,
            tail_steps_left=0 if in_tail else plan.tail_steps,
            tail_cost=tail_cost,
        )
        if trainer.max_steps not in (None, -1):
            total = min(total, trainer.max_steps)
        if trainer.max_epochs not in (None, -1) and math.isfinite(steps_per_epoch):
            total = min(total, trainer.max_epochs * steps_per_epoch)
        return max(total, step + 1)

    def summary(self, trainer: Trainer) -> dict[str, float]:
        """What the budget bought: ``budget_s``, ``used_s``, ``steps``, ``epochs`` (steps over steps per epoch)."""
        steps_per_epoch = steps_in_epoch(trainer)
        return {
            "budget_s": self.budget or float("nan"),
            "used_s": self.elapsed(),
            "steps": trainer.global_step,
            "epochs": trainer.global_step / steps_per_epoch if math.isfinite(steps_per_epoch) else float("nan"),
        }


def steps_in_epoch(trainer: Trainer) -> float:
    """Optimiser steps per training epoch (``inf`` for an unsized loader)."""
    batches = trainer.num_training_batches
    return math.ceil(batches / trainer.accumulate_grad_batches) if math.isfinite(batches) else math.inf
