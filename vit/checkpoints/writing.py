"""Checkpoint files written atomically and read safely: a Lightning ``CheckpointIO`` plugin.

A process killed at any moment of a write leaves either the previous file or the new one, never half of one; every
read goes through :func:`vit.checkpoints.read_checkpoint` (``weights_only=True``, one sentence for a
file that is not a checkpoint).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from ..atomic import atomic_write, remove_stale_temporaries
from .files import checkpoint_errors, read_checkpoint


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoint files written atomically and read safely.

    ``save_checkpoint`` writes through :func:`vit.atomic.atomic_write` (a temporary file beside ``<path>``, fsynced,
    renamed over it) and fsyncs the folder; temporaries of writers that were killed are removed. ``load_checkpoint``
    always reads with ``weights_only=True``: a pickle that needs arbitrary code
    is refused and a file that is not a checkpoint is named (:mod:`vit.checkpoints.files`). Remote paths
    (``s3://`` ...) go through Lightning's ``TorchCheckpointIO``.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        with atomic_write(path, "wb") as f:
            torch.save(checkpoint, f)
        _fsync_dir(path.parent)
        remove_stale_temporaries(path)

    def load_checkpoint(
        self,
        path: Any,
        map_location: Callable | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        if "://" in str(path):
            with checkpoint_errors(path):
                return super().load_checkpoint(path, map_location=map_location, weights_only=True)
        return read_checkpoint(path, map_location=map_location)


def with_atomic_checkpoint_io(plugins: Any) -> list[Any]:
    """The trainer's ``plugins`` plus an :class:`AtomicCheckpointIO`, unless one of them already is a
    ``CheckpointIO``.

    Args:
        plugins: ``Trainer(plugins=...)``: ``None``, one plugin or a list.
    """
    items = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if not any(isinstance(plugin, CheckpointIO) for plugin in items):
        items.append(AtomicCheckpointIO())
    return items


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem (nor Windows) can fsync a directory
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
