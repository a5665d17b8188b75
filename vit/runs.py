"""Run folders: how a run is named, which folder it claims, where ``--ckpt_path last`` finds it again.

The one owner of the mechanism that the CLI, the W&B loggers and the resume callback share:

- a run's name is ``<config>-<model>-<attention>-<dataset>-<MMDD-HHMMSS>`` (:func:`run_name`), also its W&B name;
- ``vit fit`` claims ``<runs_dir>/<config>/<run name>/`` atomically (:func:`claim_folder`: a second run started in
  the same second gets ``-2``), and folders left unused by a run that failed before writing an output are removed
  again (:func:`remove_unused_folders`);
- ``--ckpt_path last`` is the newest ``last.ckpt`` of the config's runs (:mod:`vit.checkpoints.naming`, which every
  command names checkpoints with), and the run continues in that folder with its W&B run id (:func:`wandb_run_id`);
- the DDP processes that Lightning starts find rank 0's folder through :data:`RUN_DIR_ENV`; under multi-node DDP only
  the job's first process claims a folder (:func:`first_process_of_job`), the others write nothing of their own;
- ``last.ckpt`` itself goes to the run's ``checkpoints/`` (:func:`last_checkpoint_path`);
- the CLI's policy: which folder a ``fit``, ``validate``, ``test`` or ``predict`` writes to (:func:`choose_run_folder`,
  :func:`place_run_outputs`) and which checkpoint ``--ckpt_path last``, ``best`` or a run folder means
  (:func:`resolve_ckpt_path`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import warnings
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from jsonargparse import Namespace

from .checkpoints.files import CHECKPOINT_FORMS as FORMS
from .checkpoints.naming import SHORT_NAMES, find_checkpoint, run_folder_of
from .errors import MissingCheckpointError
from .models import model_config
from .models.vision_transformer import AttentionKind, block_attention_kinds
from .network import timm_name

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

RUN_DIR_ENV = "VIT_RUN_DIR"
"""Environment variable through which the DDP processes Lightning starts find rank 0's run folder."""

RUN_CONFIG_FILE = "config.yaml"
"""The run's config, which Lightning writes into the run folder as a run starts (``SaveConfigCallback``'s default)."""

_CLAIMED: list[Path] = []  # folders created by this process for runs, removed again if a run fails before using them
_RUN_FOLDERS: list[Path] = []  # of those, the runs' own folders (not the parents created with them)


def _get(namespace: Any, key: str, default: Any = None) -> Any:
    """``namespace[key]`` for a jsonargparse ``Namespace`` or a dict (dotted keys allowed), else ``default``."""
    value = namespace
    for part in key.split("."):
        if isinstance(value, Namespace):
            value = value.get(part, default) if part in value else default
        elif isinstance(value, Mapping):
            value = value.get(part, default)
        else:
            return default
    return value


def config_name(config: Namespace | Mapping[str, Any]) -> str:
    """Stem of the last ``--config`` file of a parsed CLI config (``quickstart`` for ``configs/quickstart.yaml``),
    or ``cli`` when the run was configured on the command line only."""
    files = _get(config, "config") or []
    files = files if isinstance(files, (list, tuple)) else [files]
    for path in reversed(files):
        text = str(getattr(path, "relative", None) or path)
        if text and not text.lstrip().startswith("{"):  # a file, not inline YAML
            return Path(text).stem
    return "cli"


def model_name(config: Namespace | Mapping[str, Any]) -> str:
    """The preset name (``model.model``; a timm model's name without ``timm:``), or the class name of a network given
    by ``class_path``."""
    model = _get(config, "model.model")
    if isinstance(model, str):
        return timm_name(model) or model
    class_path = _get(model, "class_path")
    return str(class_path).rsplit(".", 1)[-1] if class_path else "model"


def attention_kind(config: Namespace | Mapping[str, Any]) -> AttentionKind | Literal["timm"]:
    """The attention a run's model uses (:func:`attention_of`): ``linear`` (``linear_attention``), ``window`` (block
    windows) or ``sliding`` (``window_type: sliding``) when some blocks are not global, else ``global``, read from the
    preset and ``model.model_overrides``, or from a ``class_path`` network's ``init_args``; ``timm`` for a timm model
    (``timm:NAME``: not ours, often a CNN)."""
    model = _get(config, "model.model")
    overrides = dict(_get(config, "model.model_overrides") or {})
    if timm_name(model) is not None:
        return "timm"
    if isinstance(model, str):
        try:
            settings = {**model_config(model, **overrides)}
        except (ValueError, TypeError):  # unknown preset or override: the model itself reports it when built
            settings = overrides
    else:
        settings = dict(_get(model, "init_args") or {})
    return attention_of(settings)


def attention_of(settings: Mapping[str, Any]) -> AttentionKind:
    """The attention of a model's settings (``VisionTransformer`` arguments): the kind of its non-global blocks
    (:meth:`VisionTransformer.attention_kinds`: ``linear``, ``window`` or ``sliding``), else ``global``."""
    kinds = block_attention_kinds({key: value for key, value in settings.items() if value is not None})
    return next((kind for kind in kinds if kind != "global"), "global")


def run_name(config: str, model: str, attention: str, dataset: str, when: datetime | None = None) -> str:
    """Readable run name ``<config>-<model>-<attention>-<dataset>-<MMDD-HHMMSS>``: the W&B run name and the name of
    the run's folder ``runs/<config>/<run name>/``.

    Args:
        config: Config name (:func:`config_name`).
        model: Model name (:func:`model_name`).
        attention: :func:`attention_kind`.
        dataset: ``data.dataset``.
        when: Start time; now by default.
    """
    when = when or datetime.now()
    return f"{config}-{model}-{attention}-{dataset}-{when:%m%d-%H%M%S}"


def default_run_name(config: Namespace, when: datetime | None = None) -> str:
    """:func:`run_name` of a parsed CLI config."""
    dataset = str(_get(config, "data.dataset", "data"))
    return run_name(config_name(config), model_name(config), attention_kind(config), dataset, when)


def wandb_run_id(run_dir: str | Path) -> str | None:
    """The id of the most recent W&B run under ``<run_dir>/wandb`` (``offline-run-<time>-<id>``), or ``None``."""
    runs = sorted(Path(run_dir, "wandb").glob("*run-*-*"), key=lambda p: p.name.split("-", 2)[-1])
    return runs[-1].name.rsplit("-", 1)[-1] if runs else None


def claim_folder(folder: Path) -> Path:
    """Create and return ``folder``, or ``folder-2``, ``folder-3``... the first that did not exist (atomically: two
    runs started in the same second get two folders)."""
    candidate, n = folder, 1
    while True:
        created = [p for p in (candidate, *candidate.parents) if not p.exists()]  # the folder and new parents
        try:
            candidate.mkdir(parents=True)
            _CLAIMED.extend(created)  # innermost first, the order in which empty ones are removed
            _RUN_FOLDERS.append(candidate)
            return candidate
        except FileExistsError:
            n += 1
            candidate = folder.with_name(f"{folder.name}-{n}")


def first_process_of_job() -> bool:
    """Whether this process is global rank 0 of its job, from what the launchers set before anything starts:
    ``RANK`` (torchrun), ``SLURM_PROCID`` (srun), else ``NODE_RANK`` / ``GROUP_RANK`` and ``LOCAL_RANK``
    (Lightning's own launcher, started once per node). A process started alone is the first."""
    for variable in ("RANK", "SLURM_PROCID"):
        if os.environ.get(variable, "").isdigit():
            return int(os.environ[variable]) == 0
    node = os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK") or "0"
    return int(node) == 0 and int(os.environ.get("LOCAL_RANK", "0")) == 0


def remove_unused_folders(refused_input: bool = False) -> None:
    """Remove the run folders this process claimed and left unused (a run that failed before it wrote any output:
    empty, or holding only the :data:`RUN_CONFIG_FILE` written at its start), and forget them.

    Args:
        refused_input: The run stopped at bad input (a :class:`~vit.errors.VitError` of exit status 2: unreadable
            data, a bad setting): its own folders go whatever they hold (W&B's ``wandb/`` of the run just begun, its
            config), unless a checkpoint was written there. Only folders this process created are ever removed.
    """
    for folder in _RUN_FOLDERS if refused_input else ():
        with contextlib.suppress(OSError):
            if folder.is_dir() and not any(folder.rglob("*.ckpt")):
                shutil.rmtree(folder)
    for folder in _CLAIMED:
        with contextlib.suppress(OSError):
            if [p.name for p in folder.iterdir()] == [RUN_CONFIG_FILE]:
                (folder / RUN_CONFIG_FILE).unlink()
            folder.rmdir()  # only succeeds when empty
    forget_claimed_folders()


def forget_claimed_folders() -> None:
    """Keep the folders claimed so far (the run that claimed them has used them)."""
    _CLAIMED.clear()
    _RUN_FOLDERS.clear()


def last_checkpoint_path(trainer: Trainer) -> Path:
    """Where ``last.ckpt`` goes: the folder of the trainer's :class:`ModelCheckpoint`, else
    ``<default_root_dir>/checkpoints``.

    Args:
        trainer: The trainer (after its callbacks are set up).
    """
    from lightning.pytorch.callbacks import ModelCheckpoint

    callback = next((cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)), None)
    if callback is not None and callback.dirpath:
        return Path(callback.dirpath) / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"
    return Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"


# ------------------------------------------------------------------------------------------- the CLI's policy
def resolve_ckpt_path(config: Namespace, subcommand: str) -> tuple[str | None, Path | None]:
    """What a ``--ckpt_path`` that is not a file means (:func:`vit.checkpoints.naming.find_checkpoint`):
    ``(checkpoint, run folder to continue)``.

    ``last`` / ``best`` are the newest run's of the config (``config.runs_dir``; every run's without ``--config``,
    except for ``fit``, whose config-less runs are filed under ``cli``); with ``checkpoint.dirpath`` or
    ``trainer.default_root_dir`` set, ``last`` is the ``last.ckpt`` there (no run folder to continue). A run folder
    means its ``last.ckpt``. ``fit`` continues the run of ``last`` or of a run folder in place, and starts a new run
    when ``last`` finds none (``(None, None)``); the other subcommands refuse to evaluate an untrained model.

    Args:
        config: The subcommand's parsed config.
        subcommand: ``fit``, ``validate``, ``test`` or ``predict``.

    Raises:
        MissingCheckpointError: If there is no checkpoint of that name to evaluate.
    """
    spec, fitting = str(config.ckpt_path), subcommand == "fit"
    folder = _get(config, "checkpoint.dirpath") or _get(config, "trainer.default_root_dir")
    if spec == "last" and folder:
        path = Path(_get(config, "checkpoint.dirpath") or Path(folder, "checkpoints"), "last.ckpt")
        if not path.is_file() and not fitting:
            raise MissingCheckpointError(f"--ckpt_path last: no last.ckpt in {path.parent}; pass {FORMS}")
        return _resolved(spec, path if path.is_file() else None, None, fitting)
    name = config_name(config)
    try:
        path = Path(find_checkpoint(spec, config=None if name == "cli" and not fitting else name,
                                    runs_dir=config.runs_dir))  # fmt: skip
    except MissingCheckpointError:
        if spec == "last" and fitting:
            return _resolved(spec, None, None, fitting)
        raise
    continues = fitting and (spec == "last" or Path(spec).is_dir())
    return _resolved(spec, path, run_folder_of(path) if continues else None, fitting)


def _resolved(spec: str, path: Path | None, run: Path | None, fitting: bool) -> tuple[str | None, Path | None]:
    """``(path, run)``, said on stderr."""
    if path is None:
        sys.stderr.write(f"--ckpt_path {spec}: no last.ckpt of this config yet, starting a new run\n")
        return None, None
    sys.stderr.write(f"--ckpt_path {spec}: {'resuming' if run is not None else 'using'} {path}\n")
    return str(path), run


def needs_resolving(ckpt_path: object) -> bool:
    """Whether ``--ckpt_path`` is a short name or a folder (:func:`resolve_ckpt_path`) rather than a file."""
    text = str(ckpt_path or "")
    return bool(text) and "://" not in text and (text in SHORT_NAMES or not Path(text).is_file())


def choose_run_folder(
    config: Namespace, subcommand: str, resumed: Path | None = None, given_name: str | None = None
) -> tuple[Path, str, str | None]:
    """The folder a CLI run writes to, its run name and the W&B run id it continues: ``(folder, name, run id)``.

    In order: a DDP process started by rank 0 takes rank 0's folder (:data:`RUN_DIR_ENV`); a set
    ``trainer.default_root_dir`` is the folder; a fit resumed with ``--ckpt_path last`` continues its run in place; on
    another node of a multi-node fit only the name is chosen (the job's first process claims the folder); else
    ``fit`` claims ``<runs_dir>/<config>/<name>``, and ``validate``/``test``/``predict`` of a run's checkpoint claim
    ``<run>/<subcommand>-<time>`` below that run (of another file, ``<runs_dir>/<config>/<subcommand>-<name>``).

    Args:
        config: The subcommand's parsed config.
        subcommand: ``fit``, ``validate``, ``test`` or ``predict``.
        resumed: The run folder ``--ckpt_path last`` resumes (:func:`resolve_ckpt_path`).
        given_name: A run name the user gave its W&B logger; default :func:`default_run_name`.
    """
    inherited = os.environ.get(RUN_DIR_ENV) if int(os.environ.get("LOCAL_RANK", "0")) > 0 else None
    if inherited:  # a DDP process started by rank 0: the same run, the same folder
        return Path(inherited), Path(inherited).name, None
    if config.trainer.get("default_root_dir"):  # the user chose the folder
        return Path(config.trainer.default_root_dir), default_run_name(config), None
    if resumed is not None and subcommand == "fit":  # --ckpt_path last: continue that run in place
        # ModelCheckpoint warns that its folder "exists and is not empty": expected when a run continues there.
        warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        return resumed, resumed.name, wandb_run_id(resumed)
    if subcommand == "fit" and not first_process_of_job():
        # Another node's first process (multi-node DDP): the job's first process claims the run folder; this one
        # writes nothing there (checkpoints, config, W&B and media are written by global rank 0, and
        # ModelCheckpoint broadcasts rank 0's folder), so it claims none and only names where rank 0's would be.
        name = default_run_name(config)
        return Path(config.runs_dir, config_name(config), name), name, None
    name = given_name or default_run_name(config)
    ckpt_run = run_folder_of(config.ckpt_path) if config.get("ckpt_path") else None
    if subcommand == "fit" or ckpt_run is None:
        base = Path(config.runs_dir, config_name(config))
        folder = claim_folder(base / (name if subcommand == "fit" else f"{subcommand}-{name}"))
    else:  # evaluating or applying a run's checkpoint: below that run, never over its files
        folder = claim_folder(ckpt_run / f"{subcommand}-{datetime.now():%m%d-%H%M%S}")
    return folder, folder.name if subcommand == "fit" else name, None


def place_run_outputs(config: Namespace, subcommand: str, folder: Path) -> None:
    """Point the run's outputs at ``folder``: ``trainer.default_root_dir``, :data:`RUN_DIR_ENV` (for the DDP processes
    Lightning starts later) and ``checkpoint.dirpath`` unless set: a fit's own ``checkpoints/``; when evaluating a
    checkpoint, its folder (where it restores its state from).

    Args:
        config: The subcommand's parsed config (changed in place).
        subcommand: ``fit``, ``validate``, ``test`` or ``predict``.
        folder: :func:`choose_run_folder`'s folder.
    """
    os.environ[RUN_DIR_ENV] = str(folder)
    config.trainer.default_root_dir = str(folder)
    if config.get("checkpoint") is not None and not config.checkpoint.get("dirpath"):
        ckpt = config.get("ckpt_path")
        own = subcommand == "fit" or not ckpt or "://" in str(ckpt)
        config.checkpoint.dirpath = str(folder / "checkpoints" if own else Path(ckpt).parent)
