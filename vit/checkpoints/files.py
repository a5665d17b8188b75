"""Reading checkpoint and weight files safely, with one clear sentence for each way a file can be wrong.

Every checkpoint and weight file of the project is read here: ``torch.load(weights_only=True)`` (a pickle that needs
arbitrary code is refused, never executed; the safe loading of PyTorch 2.6's ``torch.load``), or safetensors. The file
is sniffed first, so a text file, random bytes, an empty or a truncated file are named as "not a PyTorch checkpoint"
rather than as an unsafe pickle or a ``KeyError`` from deep inside ``torch.load``.
"""

from __future__ import annotations

import contextlib
import pickle
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import (
    CheckpointError,
    CheckpointFolderError,
    CorruptCheckpointError,
    MissingCheckpointError,
    UnsafeCheckpointError,
)

if TYPE_CHECKING:
    import torch

CHECKPOINT_FORMS = (
    "a .ckpt file, a run folder, or last / best (of the newest run of --config, or of every run under runs/)"
)
"""What every command's ``--ckpt_path`` takes (:mod:`vit.checkpoints.naming`), in the words of its errors and help."""

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
    :class:`~vit.errors.UnsafeCheckpointError`, a file that is not a checkpoint
    :class:`~vit.errors.CorruptCheckpointError`, each naming ``path``. Errors of the file system (missing file, no
    permission) and checkpoint errors raised inside pass through.

    Args:
        path: The file being read.
    """
    try:
        yield
    except CheckpointError:
        raise
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


def folder_message(path: Any, shown: int = 3) -> str:
    """The one message for a checkpoint path that is a folder: the ``.ckpt`` files found in it (newest first, a
    ``last.ckpt`` before the others), or where ``vit fit`` writes them.

    Args:
        path: The folder.
        shown: How many of the files found to name.
    """
    path = Path(path)
    found = sorted(path.rglob("*.ckpt"), key=lambda p: (p.name != "last.ckpt", -p.stat().st_mtime_ns))
    head = f"{path} is a folder, not a checkpoint file"
    if not found:
        return f"{head}, and holds no .ckpt file: pass the .ckpt written by `vit fit`, e.g. <run>/checkpoints/last.ckpt"
    more = f" and {len(found) - shown} more" if len(found) > shown else ""
    names = ", ".join(str(p.relative_to(path)) for p in found[:shown])
    return f"{head}: pass a .ckpt file inside it, e.g. {found[0]} (found: {names}{more})"


def check_checkpoint_path(path: str | Path) -> None:
    """Raise unless ``path`` is a file (remote ``s3://`` paths are not checked): one message for a folder
    (:func:`folder_message`) and one for a missing file, whichever command reads it.

    Raises:
        CheckpointFolderError: If ``path`` is a folder.
        MissingCheckpointError: If ``path`` does not exist.
    """
    if "://" in str(path):
        return
    path = Path(path)
    if path.is_dir():
        raise CheckpointFolderError(folder_message(path))
    if not path.is_file():
        raise MissingCheckpointError(f"checkpoint {path} not found: pass {CHECKPOINT_FORMS}")


def check_is_checkpoint(path: str | Path) -> None:
    """Raise unless ``path`` exists and looks like a ``torch.save`` file (remote ``s3://`` paths are not checked).

    Raises:
        CheckpointFolderError: If ``path`` is a folder.
        MissingCheckpointError: If ``path`` does not exist.
        CorruptCheckpointError: If it is not a PyTorch checkpoint (text, random bytes, empty, truncated).
    """
    if "://" in str(path):
        return
    check_checkpoint_path(path)
    path = Path(path)
    why = _sniff(path)
    if why is not None:
        raise CorruptCheckpointError(not_a_checkpoint_message(path, why))


def read_checkpoint(path: str | Path, map_location: str | torch.device | Callable | None = "cpu") -> dict[str, Any]:
    """``torch.load(path, weights_only=True)``, with one clear error for each way the file can be wrong.

    Args:
        path: A ``.ckpt``/``.pth``/``.pt`` file.
        map_location: As for ``torch.load``.

    Raises:
        CheckpointFolderError: If ``path`` is a folder.
        MissingCheckpointError: If ``path`` does not exist.
        CorruptCheckpointError: If it is not a PyTorch checkpoint (text, random bytes, empty, truncated).
        UnsafeCheckpointError: If its pickle needs arbitrary code (never executed).
    """
    import torch  # here, not at the top: checking a path answers before torch loads

    check_is_checkpoint(path)
    with checkpoint_errors(path):
        return torch.load(path, map_location=map_location, weights_only=True)


def load_file(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """Read a ``.safetensors`` file, or a torch pickle with ``weights_only=True`` (:func:`read_checkpoint`).

    Raises:
        CheckpointFolderError: If ``path`` is a folder (an ``IsADirectoryError``).
        MissingCheckpointError: If ``path`` does not exist (a ``FileNotFoundError``).
        CorruptCheckpointError: If the file is not a PyTorch checkpoint (text, random bytes, empty, truncated).
        UnsafeCheckpointError: If the pickle needs arbitrary code (it is never executed).
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        check_checkpoint_path(path)
        from safetensors import SafetensorError
        from safetensors.torch import load_file as load_safetensors

        try:
            return load_safetensors(str(path), device=str(map_location))
        except SafetensorError as err:
            raise CorruptCheckpointError(f"{path} is not a safetensors file ({err})") from None
    return read_checkpoint(path, map_location=map_location)
