"""One home for checkpoints: reading files safely, the state dict inside, the description a checkpoint carries of
its model, loading a model from a checkpoint or an export folder, and rebuilding the data module of its run.

- :mod:`~vit.checkpoints.naming`: :func:`find_checkpoint`, the one way every command names a checkpoint (a file, a
  run folder, ``last`` / ``best``);
- :mod:`~vit.checkpoints.files`: :func:`read_checkpoint` / :func:`load_file` (``weights_only=True`` or
  safetensors; one sentence for a file that is not a checkpoint);
- :mod:`~vit.checkpoints.state`: :func:`extract_state_dict` and :func:`check_checkpoint_fits`;
- :mod:`~vit.checkpoints.pretrained`: :func:`load_pretrained` (``vit.load_pretrained``), timm or vit weights into a
  model, its position grid resampled and a head of another class count dropped;
- :mod:`~vit.checkpoints.metadata`: the schema under :data:`METADATA_KEY` (:func:`inference_metadata`);
- :mod:`~vit.checkpoints.loading`: :func:`load` (``vit.load``) and :class:`Loaded`;
- :mod:`~vit.checkpoints.data`: :func:`rebuild_datamodule` from a checkpoint's data settings;
- :mod:`~vit.checkpoints.writing`: :class:`~vit.checkpoints.writing.AtomicCheckpointIO`, the Lightning plugin that
  writes checkpoint files atomically and reads them through :mod:`~vit.checkpoints.files` (imported by ``vit.cli``
  only, not here: it imports Lightning).

The errors are :class:`vit.errors.CheckpointError` and its subclasses. Names are imported on first use (PEP 562):
``import vit.checkpoints.files`` and checking a path (:func:`check_checkpoint_path`) load no torch, so a command
answers a missing or misplaced checkpoint at once.
"""

from vit.lazy import attach

_NAMES = {
    "vit.errors": (
        "CheckpointError", "CheckpointFolderError", "CorruptCheckpointError", "IncompatibleCheckpointError",
        "MissingCheckpointError", "UnsafeCheckpointError",
    ),
    "vit.checkpoints.data": ("data_settings", "rebuild_datamodule"),
    "vit.checkpoints.files": (
        "CHECKPOINT_FORMS", "check_checkpoint_path", "check_is_checkpoint", "checkpoint_errors", "folder_message",
        "load_file", "read_checkpoint",
    ),
    "vit.checkpoints.loading": (
        "CONFIG_FILE", "WEIGHTS_FILE", "Loaded", "apply_temperature", "build", "load", "load_any", "load_checkpoint",
        "load_export",
    ),
    "vit.checkpoints.naming": ("add_checkpoint_arguments", "best_checkpoint", "find_checkpoint", "run_checkpoints"),
    "vit.checkpoints.metadata": (
        "METADATA_KEY", "TEMPERATURE_KEY", "inference_metadata", "model_args", "pretrained_cfg", "read_metadata",
    ),
    "vit.checkpoints.pretrained": ("load_pretrained",),
    "vit.checkpoints.state": ("check_checkpoint_fits", "describe_mismatch", "extract_state_dict"),
}  # fmt: skip
_LAZY = {name: module for module, names in _NAMES.items() for name in names}
__getattr__, __dir__ = attach(__name__, _LAZY)
__all__ = sorted(_LAZY)
