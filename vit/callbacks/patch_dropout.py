"""FLIP's unmasked tuning (Li et al., "Scaling Language-Image Pre-training via Masking", CVPR 2023): the last epochs
train on every patch, PatchDropout switched off, so the final weights are tuned to the full token grid that
evaluation sees."""

from __future__ import annotations

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn


class UnmaskedEpochs(Callback):
    """Switch the network's PatchDropout (timm's, ``pl_module.model.patch_drop``) off for the last
    ``unmasked_epochs`` of ``trainer.max_epochs``, and back to ``drop_rate`` before them (a resumed run included).

    Args:
        unmasked_epochs: Epochs at the end trained on every patch.
        drop_rate: The PatchDropout rate of the other epochs.
    """

    def __init__(self, unmasked_epochs: int, drop_rate: float) -> None:
        self.unmasked_epochs = unmasked_epochs
        self.drop_rate = drop_rate

    def _set(self, trainer: Trainer, pl_module: LightningModule) -> None:
        unmasked = trainer.current_epoch >= trainer.max_epochs - self.unmasked_epochs
        pl_module.model.patch_drop.prob = 0.0 if unmasked else self.drop_rate  # timm's PatchDropout skips at 0

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._set(trainer, pl_module)  # a fit resumed inside an epoch does not run on_train_epoch_start for that epoch
        if self.unmasked_epochs >= trainer.max_epochs and not trainer.fast_dev_run:
            rank_zero_warn(
                f"model.unmasked_epochs {self.unmasked_epochs} is not less than trainer.max_epochs "
                f"{trainer.max_epochs}: every epoch trains on all patches, PatchDropout never runs"
            )

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._set(trainer, pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.current_epoch < trainer.max_epochs:
            rank_zero_warn(
                f"training stopped at step {trainer.global_step}, before the end of trainer.max_epochs "
                f"{trainer.max_epochs} (max_time or max_steps), so model.unmasked_epochs {self.unmasked_epochs} did "
                "not run in full: the final weights were tuned with PatchDropout on"
            )
