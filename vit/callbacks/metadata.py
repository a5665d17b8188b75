"""Checkpoints that stand on their own: the description inference needs, written into every checkpoint."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn

from ..checkpoints.metadata import METADATA_KEY, inference_metadata, model_args
from ..models import VisionTransformer


class CheckpointMetadata(Callback):
    """Store under :data:`~vit.checkpoints.METADATA_KEY` what inference needs (class names, mean and std, image size,
    the eval transform's rule, every model argument, library versions; :func:`vit.checkpoints.inference_metadata`),
    read from the trainer's data module when there is one. A network that is not a :class:`vit.VisionTransformer`
    is not described (its arguments are not ours to know).
    """

    def __init__(self) -> None:
        self._model_args: tuple[Any, dict[str, Any] | None] = (None, None)  # (head, args): built once per head

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        model = getattr(pl_module, "model", None)
        if not isinstance(model, VisionTransformer):
            return
        head = (model.num_classes, model.global_pool)
        if self._model_args[0] != head:  # checked once (it builds a copy of the model)
            try:
                self._model_args = (head, model_args(model, pl_module.hparams))
            except ValueError as err:  # not recoverable: the checkpoint loads as before, through its hparams
                rank_zero_warn(f"the checkpoint will not describe its model for inference: {err}")
                self._model_args = (head, None)
        args = self._model_args[1]
        if args is None:
            return
        datamodule = getattr(trainer, "datamodule", None)
        names = getattr(datamodule, "class_names", None)
        mean, std = getattr(datamodule, "mean", None), getattr(datamodule, "std", None)
        rule = getattr(datamodule, "preset", None)
        checkpoint[METADATA_KEY] = inference_metadata(model, pl_module.hparams, names, mean, std, rule, args=args)
