"""FLIP's unmasked tuning (Li et al., "Scaling Language-Image Pre-training via Masking", CVPR 2023): the last epochs
train on every patch, PatchDropout switched off, so the final weights are tuned to the full token grid that
evaluation sees."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn

from ..schedule import TimePlan


class UnmaskedEpochs(Callback):
    """Switch the network's PatchDropout (timm's, ``pl_module.model.patch_drop``) off for the last
    ``unmasked_epochs`` of ``trainer.max_epochs``, and back to ``drop_rate`` before them (a resumed run included).

    With a time-budgeted schedule (``plan``) the tail is the plan's last ``unmasked_epochs`` epochs' worth of steps,
    switched on at the step the plan reaches it (:meth:`vit.schedule.TimePlan.in_tail`), the same step on every rank.

    Args:
        unmasked_epochs: Epochs at the end trained on every patch.
        drop_rate: The PatchDropout rate of the other epochs.
        plan: Returns the module's :class:`~vit.schedule.TimePlan` (``model.schedule: time``); ``None``: epochs.
    """

    def __init__(
        self, unmasked_epochs: int, drop_rate: float, plan: Callable[[], TimePlan | None] | None = None
    ) -> None:
        self.unmasked_epochs = unmasked_epochs
        self.drop_rate = drop_rate
        self.plan = plan

    def _set(self, trainer: Trainer, pl_module: LightningModule) -> None:
        plan = self.plan() if self.plan is not None else None
        if plan is not None:
            unmasked = plan.in_tail(trainer.global_step)
            if unmasked and plan.tail_start < 0:
                plan.tail_start = trainer.global_step
        else:
            unmasked = trainer.current_epoch >= trainer.max_epochs - self.unmasked_epochs
        pl_module.model.patch_drop.prob = 0.0 if unmasked else self.drop_rate  # timm's PatchDropout skips at 0

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: Any, **kwargs: Any) -> None:
        if self.plan is not None:
            self._set(trainer, pl_module)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._set(trainer, pl_module)  # a fit resumed inside an epoch does not run on_train_epoch_start for that epoch
        if self.plan is not None:
            return
        if self.unmasked_epochs >= trainer.max_epochs and not trainer.fast_dev_run:
            rank_zero_warn(
                f"model.unmasked_epochs {self.unmasked_epochs} is not less than trainer.max_epochs "
                f"{trainer.max_epochs}: every epoch trains on all patches, PatchDropout never runs"
            )

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._set(trainer, pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        plan = self.plan() if self.plan is not None else None
        if plan is not None and plan.tail_start < 0:
            rank_zero_warn(
                f"training stopped at step {trainer.global_step}, before step {plan.total_steps - plan.tail_steps}, "
                f"where the plan put the unmasked tail (trainer.max_time came first), so model.unmasked_epochs "
                f"{self.unmasked_epochs} did not run: the final weights were tuned with PatchDropout on"
            )
        elif plan is None and trainer.current_epoch < trainer.max_epochs:
            rank_zero_warn(
                f"training stopped at step {trainer.global_step}, before the end of trainer.max_epochs "
                f"{trainer.max_epochs} (max_time or max_steps), so model.unmasked_epochs {self.unmasked_epochs} did "
                "not run in full: the final weights were tuned with PatchDropout on"
            )
