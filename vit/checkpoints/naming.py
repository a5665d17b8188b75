"""One way to name a checkpoint, the same in every subcommand: ``--ckpt_path`` (and ``vit explain``'s positional).

The forms, resolved by :func:`find_checkpoint`:

- a file: ``runs/quickstart/<run>/checkpoints/last.ckpt``, ``weights.pth``, ``model.safetensors``, as it is;
- a run folder (``runs/quickstart/<run>``) or its ``checkpoints/`` folder: the run's ``last.ckpt``;
- ``last`` / ``best``: the ``last.ckpt`` / the best checkpoint (``ModelCheckpoint``'s, as ``last.ckpt`` records it)
  of the newest run of the config given (``<runs_dir>/<config>/*``), or, without a config, of every run under
  ``<runs_dir>`` of the current folder. The newest run is the one whose ``last.ckpt`` was written last.

A missing file, a folder without a run's checkpoint and a ``last`` without runs are one sentence each, whichever
command reads them (:mod:`vit.checkpoints.files` words the file errors). Standard library only: a command answers a
misnamed checkpoint before torch loads (``best`` reads ``last.ckpt``, so it loads torch).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import MissingCheckpointError
from .files import CHECKPOINT_FORMS as FORMS
from .files import check_checkpoint_path

SHORT_NAMES = ("last", "best")
"""The names of a run's checkpoints that :func:`find_checkpoint` resolves."""
LAST_FILE = "last.ckpt"


def config_stem(config: str | Path | None) -> str | None:
    """The config name runs are filed under (``runs/<name>/``): ``quickstart`` for ``quickstart``,
    ``configs/quickstart.yaml`` or ``configs/quickstart``; ``None`` for ``None``."""
    return None if config is None else Path(str(config)).stem


def run_checkpoints(runs_dir: str | Path, config: str | None = None) -> list[Path]:
    """The ``last.ckpt`` of every run of ``config`` under ``runs_dir`` (``<runs_dir>/<config>/<run>/checkpoints/``),
    of every config when ``config`` is ``None``, newest first."""
    pattern = f"{config}/*/checkpoints/{LAST_FILE}" if config else f"*/*/checkpoints/{LAST_FILE}"
    found = [(p.stat().st_mtime_ns, p) for p in Path(runs_dir).glob(pattern)]
    return [path for _, path in sorted(found, key=lambda item: item[0], reverse=True)]


def run_folder_of(checkpoint: str | Path) -> Path | None:
    """The run folder holding ``checkpoint`` (``<run>/checkpoints/<file>``), or ``None``."""
    path = Path(checkpoint)
    return path.parent.parent if path.parent.name == "checkpoints" else None


def best_checkpoint(last: Path) -> Path:
    """The best checkpoint of ``last``'s run: the ``best_model_path`` its ``ModelCheckpoint`` recorded in ``last``,
    looked up beside ``last`` first (so it is named as ``last`` is, relative or absolute, and found when the run was
    moved since).

    Raises:
        MissingCheckpointError: If the run recorded none (no monitored metric) or the file is gone.
    """
    from .files import read_checkpoint

    states = (read_checkpoint(last).get("callbacks") or {}).items()
    recorded = [s.get("best_model_path") for key, s in states if str(key).startswith("ModelCheckpoint")]
    for text in filter(None, recorded):
        for candidate in (last.parent / Path(text).name, Path(text)):
            if candidate.is_file():
                return candidate
    raise MissingCheckpointError(
        f"best: the run {run_folder_of(last) or last.parent} has no best checkpoint (none recorded in {last}, or "
        f"the file is gone): use last, or pass a .ckpt file"
    )


def find_checkpoint(
    spec: str | Path, *, config: str | Path | None = None, runs_dir: str | Path = "runs", option: str = "--ckpt_path"
) -> Path | str:
    """The checkpoint file that ``spec`` names (the forms of the module docstring); a remote ``s3://`` path is
    returned unchanged.

    Args:
        spec: What the user gave.
        config: The config whose runs ``last`` / ``best`` search (a name or a file; only its stem counts); ``None``:
            every run under ``runs_dir``.
        runs_dir: The folder of all runs.
        option: The option's name, for the error messages.

    Raises:
        MissingCheckpointError: If ``spec`` is missing, or ``last`` / ``best`` finds no run.
        CheckpointFolderError: If ``spec`` is a folder without a run's ``last.ckpt`` (naming the files it holds).
    """
    text = str(spec)
    if "://" in text:
        return text
    path = Path(text)
    if text in SHORT_NAMES and not path.exists():
        name = config_stem(config)
        found = run_checkpoints(runs_dir, name)
        if not found:
            raise MissingCheckpointError(missing_run_message(option, text, name, runs_dir))
        return found[0] if text == "last" else best_checkpoint(found[0])
    if path.is_dir():
        for inside in (path / "checkpoints" / LAST_FILE, path / LAST_FILE):
            if inside.is_file():
                return inside
    check_checkpoint_path(path)  # missing, or a folder without a run's checkpoint (naming the .ckpt files it holds)
    return path


def missing_run_message(option: str, name: str, config: str | None, runs_dir: str | Path) -> str:
    """The one message for ``last`` / ``best`` without a run to take it from."""
    if config:
        return (
            f"{option} {name}: no last.ckpt of config {config!r} under {runs_dir}/: train one first with "
            f"`vit fit --config {config}`, or pass a .ckpt file or a run folder"
        )
    return (
        f"{option} {name}: no last.ckpt of any run under {runs_dir}/ (in {os.getcwd()}): train one first with "
        "`vit fit --config NAME`, add --config NAME, or pass a .ckpt file or a run folder"
    )


def add_checkpoint_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """``--ckpt_path``, ``--config`` and ``--runs_dir`` with the words of every subcommand (``vit fit`` has them
    from LightningCLI)."""
    parser.add_argument("--ckpt_path", required=required, default=None, help=f"the checkpoint: {FORMS}")
    parser.add_argument(
        "--config", default=None, help="the config whose newest run --ckpt_path last / best means (a name in "
        "configs/ or a file); default: the newest run of any config",
    )  # fmt: skip
    parser.add_argument("--runs_dir", default="runs", help="the folder of all runs (default: runs)")
