"""Reading checkpoint files safely, and one clear sentence for each way a file can be wrong.

Every checkpoint and weight file of the project is read by :func:`read_checkpoint`: ``torch.load(weights_only=True)``
(a pickle that needs arbitrary code is refused, never executed), after checking that the file is a PyTorch
checkpoint at all, so a text file, random bytes, an empty or a truncated file are named as "not a PyTorch
checkpoint" rather than as an unsafe pickle or a ``KeyError`` from deep inside ``torch.load``.
:func:`check_checkpoint_fits` turns a checkpoint of another architecture into a list of its mismatched keys.
"""

from __future__ import annotations

import contextlib
import pickle
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file that cannot be loaded without running arbitrary code."""


class IncompatibleCheckpointError(RuntimeError):
    """A checkpoint whose keys or shapes do not fit the model."""


class CorruptCheckpointError(RuntimeError):
    """A file that is not a PyTorch checkpoint: another kind of file, empty, truncated or corrupt."""


class MissingCheckpointError(FileNotFoundError):
    """A checkpoint path that does not exist."""


CHECKPOINT_ERRORS = (UnsafeCheckpointError, IncompatibleCheckpointError, CorruptCheckpointError, MissingCheckpointError)
"""Everything a bad checkpoint raises; the CLI turns each into one line and exit status 2."""

_PICKLE_PROTOCOL_2 = b"\x80\x02"  # torch.save's legacy (pre-zip) format starts with a protocol-2 pickle


def unsafe_message(path: Any) -> str:
    """The one message for a pickle that needs arbitrary code to load."""
    return (
        f"refusing to load {path}: it is a pickle that needs arbitrary code to load (never executed here). "
        "Only tensors and plain containers are accepted; if you trust the file, load it in Python, re-save its "
        "state dict with torch.save(...) or convert it to .safetensors."
    )


def not_a_checkpoint_message(path: Any, why: str) -> str:
    """The one message for a file that is not a PyTorch checkpoint, saying ``why``."""
    return f"{path} is not a PyTorch checkpoint ({why}); pass a .ckpt written by `vit fit` or a .pth/.safetensors file"


def _sniff(path: Path) -> str | None:
    """Why ``path`` cannot be a ``torch.save`` file, or ``None`` when it may be one."""
    size = path.stat().st_size
    if size == 0:
        return "the file is empty"
    if zipfile.is_zipfile(path):
        return None
    with open(path, "rb") as f:
        head = f.read(2)
    if head == _PICKLE_PROTOCOL_2:
        return None  # torch's legacy format
    if head[:2] == b"PK":
        return "a zip archive cut short: truncated by a crash or a full disk, or copied incompletely"
    return "neither torch.save's zip archive nor its legacy format: another kind of file, or corrupt"


@contextlib.contextmanager
def checkpoint_errors(path: Any) -> Iterator[None]:
    """Around a ``torch.load(path, weights_only=True)``: a pickle needing code becomes
    :class:`UnsafeCheckpointError`, a file that is not a checkpoint :class:`CorruptCheckpointError`, each naming
    ``path``. Errors of the file system (missing file, no permission) pass through.

    Args:
        path: The file being read.
    """
    try:
        yield
    except pickle.UnpicklingError as err:
        text = str(err)
        if "Unsupported global" in text or "GLOBAL" in text:
            raise UnsafeCheckpointError(unsafe_message(path)) from None
        raise CorruptCheckpointError(not_a_checkpoint_message(path, "its pickle is corrupt")) from None
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except (RuntimeError, EOFError, OSError, KeyError, ValueError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CorruptCheckpointError(not_a_checkpoint_message(path, f"truncated or corrupt: {first}")) from None


def check_is_checkpoint(path: str | Path) -> None:
    """Raise unless ``path`` exists and looks like a ``torch.save`` file (remote ``s3://`` paths are not checked).

    Raises:
        MissingCheckpointError: If ``path`` does not exist.
        CorruptCheckpointError: If it is not a PyTorch checkpoint (text, random bytes, empty, truncated).
    """
    if "://" in str(path):
        return
    path = Path(path)
    if not path.is_file():
        raise MissingCheckpointError(f"checkpoint file not found: {path}")
    why = _sniff(path)
    if why is not None:
        raise CorruptCheckpointError(not_a_checkpoint_message(path, why))


def read_checkpoint(path: str | Path, map_location: str | torch.device | Callable | None = "cpu") -> dict[str, Any]:
    """``torch.load(path, weights_only=True)``, with one clear error for each way the file can be wrong.

    Args:
        path: A ``.ckpt``/``.pth``/``.pt`` file.
        map_location: As for ``torch.load``.

    Raises:
        MissingCheckpointError: If ``path`` does not exist.
        CorruptCheckpointError: If it is not a PyTorch checkpoint (text, random bytes, empty, truncated).
        UnsafeCheckpointError: If its pickle needs arbitrary code (never executed).
    """
    check_is_checkpoint(path)
    with checkpoint_errors(path):
        return torch.load(path, map_location=map_location, weights_only=True)


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
