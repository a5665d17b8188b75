"""Pretrained weights into a :class:`VisionTransformer`: the position grid resampled, a head of another class
count dropped (timm's ``load_pretrained`` adaptations), and the weights a run starts from, ``--model.pretrained``.

``--model.pretrained`` takes any checkpoint of this project (a ``.ckpt``, or a run folder: its ``last.ckpt``), a
``vit export`` folder (its ``model.safetensors``), or a timm weights file (``.safetensors``, ``.pth``, ``.bin``,
``.pt``), loaded into the config's model by :func:`load_pretrained`: a head of another class count replaced by the
model's new one, the position grid resampled to the new image size (timm's ``resample_abs_pos_embed``, bicubic),
every other tensor kept as it is. :func:`start_from` says what was kept, replaced and resampled in one line. A file
that holds no ViT weights, and weights of another architecture than the config's (another width, depth, patch size,
channel count, class token), are one error line each, naming the file and what differs.

Files are read by :mod:`~vit.checkpoints.files` (``torch.load(weights_only=True)`` or safetensors: a pickle that
needs arbitrary code to load is refused). It lives with the checkpoint readers, above :mod:`vit.models`: the model
layer never imports the checkpoints package, which builds models.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from ..errors import CheckpointFolderError, IncompatibleCheckpointError
from ..layers import resample_pos_embed
from .files import load_file
from .loading import WEIGHTS_FILE
from .naming import find_checkpoint
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


OPTION = "--model.pretrained"
FORMS = (
    "a .ckpt or a run folder of `vit fit`, a `vit export` folder, or a timm weights file (.safetensors, .pth, .bin) "
    "with timm's parameter names"
)
"""What ``--model.pretrained`` takes, in the words of its errors."""


def read_pretrained(path: str | Path) -> dict[str, torch.Tensor]:
    """The network's weights in ``path`` (see the module docstring), by timm's parameter names.

    Raises:
        CheckpointFolderError: If ``path`` is a folder that is neither an export folder nor a run folder.
        MissingCheckpointError: If ``path`` does not exist.
        CorruptCheckpointError: If the file is not a weights file (text, random bytes, truncated).
        UnsafeCheckpointError: If its pickle needs arbitrary code (never executed).
        IncompatibleCheckpointError: If it holds no ViT weights.
    """
    path = Path(path)
    if path.is_dir():
        if (path / WEIGHTS_FILE).is_file():
            path = path / WEIGHTS_FILE
        else:
            try:
                path = Path(find_checkpoint(path, option=OPTION))
            except CheckpointFolderError:
                raise CheckpointFolderError(
                    f"{OPTION} {path} is a folder holding neither {WEIGHTS_FILE} (a `vit export` folder) nor a run's "
                    f"checkpoints/last.ckpt: pass {FORMS}"
                ) from None
    state = extract_state_dict(load_file(path))
    if not any(k.startswith("patch_embed.") for k in state) or not any(k.startswith("blocks.") for k in state):
        raise IncompatibleCheckpointError(
            f"{OPTION} {path} holds no ViT weights (no patch_embed.* and blocks.* tensors, timm names): pass {FORMS}"
        )
    return state


def architecture(state: Mapping[str, torch.Tensor]) -> dict[str, object]:
    """What the shapes of a ViT's weights say of its architecture: width, depth, patch size, channels, class token."""
    depth = 1 + max((int(k.split(".")[1]) for k in state if k.startswith("blocks.")), default=-1)
    width = next((state[k].shape[0] for k in ("norm.weight", "blocks.0.norm1.weight") if k in state), None)
    proj = state.get("patch_embed.proj.weight")
    patch = "x".join(map(str, proj.shape[2:])) if proj is not None and proj.ndim == 4 else None
    return {
        "embed_dim": width,
        "depth": depth,
        "patch_size": patch,
        "in_chans": proj.shape[1] if proj is not None and proj.ndim == 4 else None,
        "class_token": "cls_token" in state,
    }


def _describe(arch: Mapping[str, object]) -> str:
    return ", ".join(f"{k} {v}" for k, v in arch.items())


def check_architecture(model: nn.Module, state: Mapping[str, torch.Tensor], source: object) -> None:
    """Raise one error line when ``state`` comes from another architecture than ``model`` (:func:`architecture`).

    Raises:
        IncompatibleCheckpointError: Naming both architectures and what to change.
    """
    theirs, ours = architecture(state), architecture(model.state_dict())
    if theirs == ours:
        return
    differ = {k: v for k, v in theirs.items() if ours[k] != v}
    raise IncompatibleCheckpointError(
        f"{OPTION} {source} holds a ViT of {_describe(differ)} where the config's model has "
        f"{_describe({k: ours[k] for k in differ})}: give model.model and model.model_overrides of the model the "
        "weights come from (a run folder's config.yaml, an export folder's config.json name them)"
    )


def _grid(tokens: int, prefix: int) -> str:
    side = math.isqrt(max(tokens - prefix, 0))
    return f"{side}x{side}" if side * side == tokens - prefix else f"{tokens - prefix} positions"


def summary(model: nn.Module, state: Mapping[str, torch.Tensor], source: object) -> str:
    """One line: how many of ``model``'s tensors ``state`` gives as they are, and whether its head is replaced and
    its position grid resampled (computed before loading, on the shapes)."""
    own = model.state_dict()
    kept = [k for k in own if k in state and state[k].shape == own[k].shape and not k.startswith("head.")]
    parts = [f"kept {len(kept)} of {len(own)} tensors"]
    head, new_head = state.get("head.weight"), own.get("head.weight")
    if new_head is not None and (head is None or head.shape != new_head.shape):
        before = f"{head.shape[0]} classes" if head is not None else "none"
        parts.append(f"replaced the head ({before} -> {new_head.shape[0]} classes, trained from scratch)")
    elif new_head is not None:
        parts.append(f"kept the head ({new_head.shape[0]} classes)")
    pos, new_pos = state.get("pos_embed"), own.get("pos_embed")
    if pos is not None and new_pos is not None and pos.shape != new_pos.shape:
        prefix = 0 if getattr(model, "no_embed_class", False) else getattr(model, "num_prefix_tokens", 0)
        parts.append(
            f"resampled pos_embed from {_grid(pos.shape[1], prefix)} to {_grid(new_pos.shape[1], prefix)} patches"
        )
    return f"{OPTION} {source}: " + ", ".join(parts)


def start_from(model: nn.Module, path: str | Path) -> str:
    """Load the weights of ``path`` into ``model`` (:func:`load_pretrained`: head replaced, position grid
    resampled) and return the line that says what was kept, replaced and resampled.

    Raises:
        CheckpointError: If ``path`` is not a weights file of a ViT (:func:`read_pretrained`) or its architecture is
            not ``model``'s (:func:`check_architecture`), or its tensors do not fit otherwise.
    """
    state = read_pretrained(path)
    check_architecture(model, state, path)
    line = summary(model, state, path)
    try:
        load_pretrained(model, state)
    except IncompatibleCheckpointError as err:  # named "state dict" there: it was given the tensors, not the path
        raise IncompatibleCheckpointError(str(err).replace("checkpoint state dict", f"{OPTION} {path}", 1)) from None
    return line


def load_into(module: nn.Module) -> None:
    """Load ``module.hparams.pretrained`` (an :class:`vit.ImageClassifier`'s) into its network and EMA copy with
    :func:`start_from`, once (``vit fit`` loads it before the run starts, ``setup`` then finds it done), and say its
    line on stderr from the first process."""
    import sys

    from lightning.fabric.utilities.rank_zero import rank_zero_only
    from tqdm import tqdm

    path = module.hparams.get("pretrained")
    if not path or getattr(module, "pretrained_loaded", False):
        return
    line = start_from(module.model, path)
    if getattr(module, "model_ema", None) is not None:
        module.model_ema.module.load_state_dict(module.model.state_dict())
    module.pretrained_loaded = True
    if getattr(rank_zero_only, "rank", 0) == 0:
        tqdm.write(line, file=sys.stderr)  # above a progress bar, when one is drawn


__all__ = [
    "FORMS",
    "architecture",
    "check_architecture",
    "load_into",
    "load_pretrained",
    "read_pretrained",
    "start_from",
    "summary",
]
