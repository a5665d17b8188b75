"""Safe loading of weight files and of pretrained weights into a :class:`VisionTransformer`.

Every file is read with ``torch.load(weights_only=True)`` or from safetensors: a pickle that needs
arbitrary code to load is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from ..layers import resample_pos_embed
from .checkpoint_errors import (
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    MissingCheckpointError,
    UnsafeCheckpointError,
    describe_mismatch,
    read_checkpoint,
)

log = logging.getLogger(__name__)

_WRAPPER_KEYS = ("state_dict", "model", "state_dict_ema", "model_ema")


def load_file(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """Read a ``.safetensors`` file or a torch pickle with ``weights_only=True`` (:func:`read_checkpoint`).

    Raises:
        MissingCheckpointError: If ``path`` does not exist (a ``FileNotFoundError``).
        CorruptCheckpointError: If the file is not a PyTorch checkpoint (text, random bytes, empty, truncated).
        UnsafeCheckpointError: If the pickle needs arbitrary code (it is never executed).
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        if not path.is_file():
            raise MissingCheckpointError(f"checkpoint file not found: {path}")
        from safetensors import SafetensorError
        from safetensors.torch import load_file as load_safetensors

        try:
            return load_safetensors(str(path), device=str(map_location))
        except SafetensorError as err:
            raise CorruptCheckpointError(f"{path} is not a safetensors file ({err})") from None
    return read_checkpoint(path, map_location=map_location)


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
    for prefix in ("model_ema.module.", "model.", "_orig_mod.", "module."):
        if not any(k.startswith("patch_embed.") for k in state):
            inner = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            state = inner or state
    return state


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


__all__ = [
    "CorruptCheckpointError",
    "IncompatibleCheckpointError",
    "MissingCheckpointError",
    "UnsafeCheckpointError",
    "describe_mismatch",
    "extract_state_dict",
    "load_file",
    "load_pretrained",
    "read_checkpoint",
]
