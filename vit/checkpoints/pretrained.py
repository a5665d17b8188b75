"""Pretrained weights into a :class:`VisionTransformer`: the position grid resampled, a head of another class
count dropped (timm's ``load_pretrained`` adaptations).

Files are read by :mod:`~vit.checkpoints.files` (``torch.load(weights_only=True)`` or safetensors: a pickle that
needs arbitrary code to load is refused). It lives with the checkpoint readers, above :mod:`vit.models`: the model
layer never imports the checkpoints package, which builds models.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from ..errors import IncompatibleCheckpointError
from ..layers import resample_pos_embed
from .files import load_file
from .state import describe_mismatch, extract_state_dict

log = logging.getLogger(__name__)


def load_pretrained(
    model: nn.Module, checkpoint: str | Path | Mapping[str, torch.Tensor], strict: bool = True
) -> nn.Module:
    """Load timm or vit weights into ``model``, adapting what can be adapted.

    - The learned position grid is resampled (bicubic) when the checkpoint's image or patch grid differs.
    - A classification head whose class count differs is dropped (the model keeps its fresh head) with a log line.
    - Anything else that does not fit raises an error listing the missing, unexpected and mis-shaped keys.

    Args:
        model: A :class:`vit.VisionTransformer` (or anything with timm's parameter names).
        checkpoint: A state dict, or a ``.pth``/``.pt``/``.ckpt`` (read with ``weights_only=True``) or
            ``.safetensors`` file.
        strict: Raise on keys that do not fit (after the adaptations above).

    Returns:
        The same ``model``, for chaining.

    Raises:
        IncompatibleCheckpointError: If keys or shapes do not fit.
        UnsafeCheckpointError: If the file needs arbitrary code to load.
    """
    source = "state dict"
    if not isinstance(checkpoint, Mapping):
        source = str(checkpoint)
        checkpoint = load_file(checkpoint)
    state = extract_state_dict(checkpoint)
    own = model.state_dict()

    pos = state.get("pos_embed")
    if pos is not None and "pos_embed" in own and pos.shape != own["pos_embed"].shape:
        num_prefix = 0 if getattr(model, "no_embed_class", False) else getattr(model, "num_prefix_tokens", 1)
        state["pos_embed"] = resample_pos_embed(pos, model.patch_embed.grid_size, num_prefix_tokens=num_prefix)
        log.info("resampled pos_embed from %s to %s", tuple(pos.shape), tuple(state["pos_embed"].shape))

    head_w = state.get("head.weight")
    if head_w is not None and (own.get("head.weight") is None or head_w.shape != own["head.weight"].shape):
        state.pop("head.weight")
        state.pop("head.bias", None)
        log.info(
            "dropped the checkpoint's head (%d classes); the model keeps its new head (%s classes)",
            head_w.shape[0],
            getattr(model, "num_classes", "?"),
        )
        own_head = {k: v for k, v in own.items() if k.startswith("head.")}
        state.update(own_head)

    problem = describe_mismatch(model, state)
    if problem and strict:
        raise IncompatibleCheckpointError(
            f"checkpoint {source} does not fit {type(model).__name__}: {problem}. "
            "Check that the checkpoint and the model preset describe the same architecture."
        )
    own_shapes = {k: v.shape for k, v in own.items()}
    state = {k: v for k, v in state.items() if k in own_shapes and v.shape == own_shapes[k]}
    model.load_state_dict(state, strict=False)
    return model


__all__ = ["load_pretrained"]
