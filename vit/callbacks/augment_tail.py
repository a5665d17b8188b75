"""The last epochs with the basic augmentation: ``data.augment strong`` regularises a small ViT for most of its run,
then the last epochs see images much like the test images (crop and flip only, no colour, affine or Cutout), so the
final weights are tuned to them, as the unmasked tail tunes them to the full token grid (YOLOX turns its strong
augmentation off for its last epochs for the same reason)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from ..errors import ConfigError
from ..schedule import TimePlan


def check_basic_tail(epochs: int, data: Any) -> None:
    """Refuse ``model.basic_augment_epochs`` where it cannot run: a negative count, or data that is not augmented
    ``strong`` by the batched augmentation of images decoded once (:class:`~vit.data.batch_augment.BatchAugment`,
    the only one switched during a run) in ``data``, the data module (``None``: not known yet). Data augmented
    ``basic`` is accepted: every epoch is already what the tail would switch to, so it changes nothing (a recipe with
    the tail still runs with ``--data.augment basic``)."""
    if epochs < 0:
        raise ConfigError(f"model.basic_augment_epochs must be >= 0, got {epochs}")
    if not epochs or data is None:
        return
    augment, decoded = getattr(data, "augment", None), getattr(data, "decoded", False)
    if augment == "basic":
        return
    if augment != "strong":
        how = f"data.augment is {augment}: set data.augment strong"
    elif not decoded:
        how = "these images are not decoded once: set data.decode_once true (images up to 64 px)"
    else:
        return
    raise ConfigError(
        f"model.basic_augment_epochs {epochs} switches data.augment strong to basic for the last epochs of images "
        f"decoded once and augmented in batches, but {how}, or model.basic_augment_epochs 0"
    )


class BasicAugmentTail(Callback):
    """Switch the training loader's batched augmentation from ``strong`` to ``basic`` for the last ``epochs`` of
    ``trainer.max_epochs``, or, with a time-budgeted schedule (``plan``), for the plan's last ``epochs`` epochs' worth
    of steps, from the step a measured plan reaches them (the same step on every rank; Lightning has already fetched
    the next batch then, so it is the one after that which is basic). Once begun the tail stays, as the unmasked tail
    does, and a resumed run starts where it was.

    Args:
        epochs: Epochs at the end trained with the basic augmentation.
        plan: Returns the module's :class:`~vit.schedule.TimePlan` (``model.schedule: time``); ``None``: epochs.
        steps_per_epoch: Returns the optimiser steps per epoch (with ``plan``).
    """

    def __init__(
        self,
        epochs: int,
        plan: Callable[[], TimePlan | None] | None = None,
        steps_per_epoch: Callable[[], float] | None = None,
    ) -> None:
        self.epochs, self.plan, self.steps_per_epoch = epochs, plan, steps_per_epoch
        self.start = -1  # the step the tail began at, -1 before it
        self.own = "strong"  # the loader's mode before the tail (basic already: the tail changes nothing)

    def in_tail(self, trainer: Trainer) -> bool:
        plan = self.plan() if self.plan is not None else None
        if plan is None:
            return trainer.current_epoch >= trainer.max_epochs - self.epochs
        if self.start < 0 and plan.in_last(trainer.global_step, self.epochs * self.steps_per_epoch()):
            self.start = trainer.global_step
        return self.start >= 0

    def _set(self, trainer: Trainer) -> None:
        augment = getattr(trainer.train_dataloader, "augment", None)  # the decoded loader's BatchAugment
        if augment is None:
            return
        wanted = "basic" if self.in_tail(trainer) else self.own
        if wanted == "basic" and augment.augment != "basic":
            rank_zero_info(f"step {trainer.global_step}: data.augment basic from here (model.basic_augment_epochs)")
        augment.augment = wanted

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        augment = getattr(trainer.train_dataloader, "augment", None)  # the decoded loader's BatchAugment
        source = augment if augment is not None else getattr(trainer, "datamodule", None)
        self.own = getattr(source, "augment", None) or "strong"
        if augment is None and self.own != "basic":
            rank_zero_warn(
                f"model.basic_augment_epochs {self.epochs} switches the batched augmentation of images decoded once, "
                "and this training loader has none: every epoch keeps its augmentation"
            )
        self._set(trainer)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._set(trainer)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: Any, **kwargs: Any) -> None:
        if self.plan is not None and self.start < 0:
            self._set(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.plan is not None and self.start < 0 and self.own != "basic" and not trainer.fast_dev_run:
            rank_zero_warn(
                f"training stopped at step {trainer.global_step}, before the plan reached its last {self.epochs} "
                "epochs (trainer.max_time or max_steps came first): model.basic_augment_epochs did not run"
            )

    def state_dict(self) -> dict[str, Any]:
        return {"start": self.start}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.start = int(state_dict.get("start", -1))
