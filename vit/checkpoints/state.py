"""The weights inside a checkpoint: the model's state dict out of its wrappers, and whether it fits a module."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..errors import IncompatibleCheckpointError

_WRAPPER_KEYS = ("state_dict", "model", "state_dict_ema", "model_ema")
EMA_PREFIX = "model_ema.module."
"""Where :class:`vit.ImageClassifier` keeps the EMA copy of its network in a Lightning checkpoint."""
MODEL_PREFIX = "model."
"""Where :class:`vit.ImageClassifier` keeps its network in a Lightning checkpoint."""


def extract_state_dict(checkpoint: Mapping) -> dict[str, torch.Tensor]:
    """The model state dict inside a checkpoint: timm/our ``.pth`` files, wrapped dicts, Lightning ``.ckpt``.

    A Lightning checkpoint of :class:`vit.ImageClassifier` stores the network under ``model.`` and, with EMA,
    the averaged copy under ``model_ema.module.``, which is preferred (it is what was validated); the prefix (and
    ``_orig_mod.`` from ``torch.compile``, ``module.`` from DDP wrappers) is stripped.
    """
    state = checkpoint
    for key in _WRAPPER_KEYS:
        if isinstance(state.get(key), Mapping) and not isinstance(state.get(key), torch.Tensor):
            state = state[key]
            break
    state = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    for prefix in (EMA_PREFIX, MODEL_PREFIX, "_orig_mod.", "module."):
        if not any(k.startswith("patch_embed.") for k in state):
            inner = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            state = inner or state
    return state


def module_weights(state: Mapping[str, torch.Tensor], ema: bool) -> dict[str, torch.Tensor]:
    """The network's weights in a Lightning checkpoint's ``state_dict``: the EMA copy or the trained one, without
    its prefix and without ``torch.compile``'s ``_orig_mod.``."""
    prefix = EMA_PREFIX if ema else MODEL_PREFIX
    weights = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    return {k.replace("_orig_mod.", ""): v for k, v in weights.items()}


def has_ema(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether a Lightning checkpoint's ``state_dict`` holds EMA weights."""
    return any(k.startswith(EMA_PREFIX) for k in state)


def describe_mismatch(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> str:
    """A readable list of missing, unexpected and mis-shaped keys; empty when the state dict fits."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    misshaped = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(state_dict))
        if own[k].shape != state_dict[k].shape
    ]
    parts = []
    for title, items in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)):
        if items:
            shown = ", ".join(items[:20]) + (f", ... ({len(items) - 20} more)" if len(items) > 20 else "")
            parts.append(f"{len(items)} {title} key(s): {shown}")
    return "; ".join(parts)


def check_checkpoint_fits(module: nn.Module, checkpoint: Mapping[str, Any], source: Any = None) -> None:
    """Raise one clear error when a Lightning checkpoint's weights do not fit ``module``.

    Args:
        module: The module about to load ``checkpoint["state_dict"]``.
        checkpoint: The loaded checkpoint.
        source: The checkpoint's path, named in the message.

    Raises:
        IncompatibleCheckpointError: Listing the missing, unexpected and mis-shaped keys, and the model the
            checkpoint was trained with when it says so.
    """
    name = str(source) if source else "the checkpoint"
    state = checkpoint.get("state_dict")
    if not isinstance(state, Mapping):
        raise IncompatibleCheckpointError(
            f"{name} has no 'state_dict': it is not a Lightning checkpoint of this module "
            "(for a bare weights file, pass it as --model.pretrained instead)"
        )
    problem = describe_mismatch(module, state)
    if not problem:
        return
    hparams = checkpoint.get("hyper_parameters") or {}
    trained = ", ".join(f"{k}={hparams[k]!r}" for k in ("model", "model_overrides", "img_size") if k in hparams)
    origin = f" It was trained with {trained}." if trained else ""
    raise IncompatibleCheckpointError(
        f"{name} does not fit this model: {problem}.{origin} Resume with the config the checkpoint was "
        "trained with, or start a new run from its weights with --model.pretrained <checkpoint>."
    )
