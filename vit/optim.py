"""The optimiser's side of training: AdamW parameter groups (weight decay, layer-wise learning-rate decay) and when
its fused CUDA kernel may run.

The groups come from timm (``param_groups_weight_decay``, ``param_groups_layer_decay``, as its training script uses
them); :class:`~vit.ImageClassifier` builds ``torch.optim.AdamW`` over them, and the learning-rate schedule is
:mod:`vit.schedule`'s.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.plugins.precision import MixedPrecision
from timm.optim import param_groups_layer_decay, param_groups_weight_decay
from torch import nn


def param_groups(
    model: nn.Module, lr: float, *, weight_decay: float, layer_decay: float | None = None
) -> list[dict[str, Any]]:
    """AdamW parameter groups: no decay on 1-D parameters, biases and ``model.no_weight_decay()``; with
    ``layer_decay`` one group per depth carrying its ``lr_scale``; every group's ``lr`` is already scaled.

    Args:
        model: The network (a :class:`~vit.VisionTransformer`, whose ``group_matcher`` orders the layers).
        lr: Peak learning rate of the last layer (the head).
        weight_decay: AdamW's decoupled weight decay of the decayed groups.
        layer_decay: Each layer's learning rate is this times the next one's (BEiT's layer-wise decay); ``None``:
            one learning rate.
    """
    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    if layer_decay is not None:
        groups = param_groups_layer_decay(model, weight_decay, no_weight_decay_list=skip, layer_decay=layer_decay)
    else:
        groups = param_groups_weight_decay(model, weight_decay, no_weight_decay_list=skip)
    for group in groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    return groups


def fused_adamw(device: torch.device, trainer: Trainer | None) -> bool:
    """Whether AdamW runs its fused kernel: on CUDA, unless Lightning's mixed precision clips the gradients. Its AMP
    plugin (``bf16-mixed``, ``16-mixed``) refuses to clip for an optimiser that unscales gradients inside its own step,
    as the fused one does, and stops the first training step; there the ``foreach`` implementation runs instead."""
    if device.type != "cuda":
        return False
    clips = trainer is not None and bool(trainer.gradient_clip_val)
    return not (clips and isinstance(trainer.precision_plugin, MixedPrecision))
