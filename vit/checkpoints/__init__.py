"""One home for checkpoints: reading files safely, the state dict inside, the description a checkpoint carries of
its model, loading a model from a checkpoint or an export folder, and rebuilding the data module of its run.

- :mod:`~vit.checkpoints.files`: :func:`read_checkpoint` / :func:`load_file` (``weights_only=True`` or
  safetensors; one sentence for a file that is not a checkpoint);
- :mod:`~vit.checkpoints.state`: :func:`extract_state_dict` and :func:`check_checkpoint_fits`;
- :mod:`~vit.checkpoints.metadata`: the schema under :data:`METADATA_KEY` (:func:`inference_metadata`);
- :mod:`~vit.checkpoints.loading`: :func:`load` (``vit.load``) and :class:`Loaded`;
- :mod:`~vit.checkpoints.data`: :func:`rebuild_datamodule` from a checkpoint's data settings.

The errors are :class:`vit.errors.CheckpointError` and its subclasses.
"""

from ..errors import (
    CheckpointError,
    CheckpointFolderError,
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    MissingCheckpointError,
    UnsafeCheckpointError,
)
from .data import data_settings, rebuild_datamodule
from .files import (
    check_checkpoint_path,
    check_is_checkpoint,
    checkpoint_errors,
    folder_message,
    load_file,
    read_checkpoint,
)
from .loading import CONFIG_FILE, WEIGHTS_FILE, Loaded, build, load, load_any, load_checkpoint, load_export
from .metadata import (
    METADATA_KEY,
    inference_metadata,
    model_args,
    pretrained_cfg,
    read_metadata,
)
from .state import check_checkpoint_fits, describe_mismatch, extract_state_dict

__all__ = [
    "CONFIG_FILE",
    "METADATA_KEY",
    "WEIGHTS_FILE",
    "CheckpointError",
    "CheckpointFolderError",
    "CorruptCheckpointError",
    "IncompatibleCheckpointError",
    "Loaded",
    "MissingCheckpointError",
    "UnsafeCheckpointError",
    "build",
    "check_checkpoint_fits",
    "check_checkpoint_path",
    "check_is_checkpoint",
    "checkpoint_errors",
    "data_settings",
    "describe_mismatch",
    "extract_state_dict",
    "folder_message",
    "inference_metadata",
    "load",
    "load_any",
    "load_checkpoint",
    "load_export",
    "load_file",
    "model_args",
    "pretrained_cfg",
    "read_checkpoint",
    "read_metadata",
    "rebuild_datamodule",
]
