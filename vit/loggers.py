"""Weights & Biases runs that compare column by column: names, groups, tags and the full nested config.

Lightning logs the LightningModule's and the DataModule's init arguments flat, at the root of the W&B run config,
and never the rest of a LightningCLI run (trainer, callbacks, checkpointing) — Lightning issues #7679 and #19728.
The CLI instead sends the complete resolved configuration, nested by section (``model.lr``, ``data.dataset``,
``trainer.max_epochs``, ...), so the W&B runs table has one column per setting. Runs get a readable name
``<config>-<model>-<dataset>-<MMDD-HHMMSS>``, their config name as ``group``, and tags for the attention kind
(``global``/``window``) and the dataset; ``val/acc`` is summarised by its maximum, ``val/loss`` by its minimum.

Only :func:`log_config` touches W&B, and only through ``logger.experiment`` of a logger the trainer already has:
nothing here opens a connection (offline runs stay offline).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
from jsonargparse import Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from .models import model_config

WANDB_LOGGER_CLASSES = ("lightning.pytorch.loggers.WandbLogger", "lightning.pytorch.loggers.wandb.WandbLogger")
"""``class_path`` spellings of Lightning's W&B logger in a CLI config."""

SUMMARY_METRICS = {"val/acc": "max", "val/acc_top5": "max", "val/loss": "min"}
"""How W&B summarises these metrics in the runs table (``wandb.define_metric(name, summary=...)``)."""

AttentionKind = Literal["global", "window"]


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
    """The preset name (``model.model``), or the class name of a network given by ``class_path``."""
    model = _get(config, "model.model")
    if isinstance(model, str):
        return model
    class_path = _get(model, "class_path")
    return str(class_path).rsplit(".", 1)[-1] if class_path else "model"


def attention_kind(config: Namespace | Mapping[str, Any]) -> AttentionKind:
    """``window`` when the model has local-window blocks (``window_size > 0``, from the preset and
    ``model.model_overrides``, or a ``class_path`` network's ``init_args``), else ``global``."""
    model = _get(config, "model.model")
    overrides = dict(_get(config, "model.model_overrides") or {})
    if isinstance(model, str):
        try:
            window_size = model_config(model, **overrides).get("window_size", 0)
        except ValueError:  # unknown preset: the model itself reports it when built
            window_size = overrides.get("window_size", 0)
    else:
        window_size = _get(model, "init_args.window_size", 0)
    return "window" if window_size else "global"


def run_name(config: str, model: str, dataset: str, when: datetime | None = None) -> str:
    """Readable run name ``<config>-<model>-<dataset>-<MMDD-HHMMSS>``.

    Args:
        config: Config name (:func:`config_name`).
        model: Model name (:func:`model_name`).
        dataset: ``data.dataset``.
        when: Start time; now by default.
    """
    when = when or datetime.now()
    return f"{config}-{model}-{dataset}-{when:%m%d-%H%M%S}"


def is_wandb_logger(logger: Any) -> bool:
    """Whether a parsed ``trainer.logger`` entry is Lightning's :class:`WandbLogger`."""
    return isinstance(logger, Namespace) and logger.get("class_path") in WANDB_LOGGER_CLASSES


def name_wandb_runs(config: Namespace, when: datetime | None = None) -> None:
    """Fill in ``name``, ``group`` and ``tags`` of every W&B logger of a parsed CLI config, before instantiation.

    Values the user set are kept; the attention kind and dataset tags are added to the user's tags.

    Args:
        config: The parsed config of the subcommand (``trainer``, ``model``, ``data``, ``config``).
        when: Start time for the name; now by default.
    """
    loggers = _get(config, "trainer.logger")
    loggers = loggers if isinstance(loggers, list) else [loggers]
    dataset = str(_get(config, "data.dataset", "data"))
    name = config_name(config)
    for logger in loggers:
        if not is_wandb_logger(logger):
            continue
        args = logger.init_args
        if not args.get("name"):
            args.name = run_name(name, model_name(config), dataset, when)
        if not args.get("group"):
            args.group = name
        tags = list(args.get("tags") or [])
        args.tags = tags + [tag for tag in (attention_kind(config), dataset) if tag not in tags]


def wandb_loggers(trainer: Trainer) -> list[WandbLogger]:
    """The trainer's W&B loggers."""
    return [logger for logger in trainer.loggers if isinstance(logger, WandbLogger)]


def log_images(
    trainer: Trainer,
    key: str,
    images: Sequence[np.ndarray],
    step: int,
    captions: Sequence[str] | None = None,
) -> bool:
    """Log uint8 RGB images ``(H, W, 3)`` under ``key`` to every W&B logger of the trainer.

    A W&B failure becomes a warning: it never stops a run.

    Args:
        trainer: The trainer whose W&B loggers receive the images.
        key: The W&B media key, e.g. ``"rollout/panels"``.
        images: uint8 RGB arrays.
        step: The step to log at (for validation media: the steps the optimiser took).
        captions: One caption per image, or ``None``.

    Returns:
        Whether at least one W&B logger took the images.
    """
    taken = False
    for logger in wandb_loggers(trainer):
        try:
            kwargs = {"caption": list(captions)} if captions is not None else {}
            logger.log_image(key=key, images=list(images), step=step, **kwargs)
            taken = True
        except Exception as err:  # logging must never end a training run
            rank_zero_warn(f"could not log {key!r} to W&B at step {step}: {type(err).__name__}: {err}")
    return taken


def log_summary(trainer: Trainer, values: Mapping[str, float]) -> None:
    """Write ``values`` as W&B run summary columns (the runs table, not charts) of every W&B logger.

    A W&B failure becomes a warning: it never stops a run.

    Args:
        trainer: The trainer whose W&B loggers receive the values.
        values: Column name to value, e.g. ``{"model/params": 5.4e6}``.
    """
    for logger in wandb_loggers(trainer):
        try:
            logger.experiment.summary.update(dict(values))
        except Exception as err:  # logging must never end a training run
            rank_zero_warn(f"could not write the W&B run summary: {type(err).__name__}: {err}")


def log_config(trainer: Trainer, config: Mapping[str, Any]) -> None:
    """Send the full run config to the trainer's loggers: nested into the W&B run config, with ``val/acc``
    summarised by its maximum (:data:`SUMMARY_METRICS`); to any other logger as its hyper-parameters.

    Call it on global rank zero, after the loggers exist (the CLI does, when the trainer sets up). A W&B failure
    becomes a warning: it never stops a run.

    Args:
        trainer: The trainer whose ``loggers`` receive the config.
        config: The resolved config as plain nested data (the YAML of ``--print_config``, loaded).
    """
    config = {key: value for key, value in config.items() if key != "config"}  # the --config paths themselves
    for logger in trainer.loggers:
        try:
            if isinstance(logger, WandbLogger):
                run = logger.experiment
                run.config.update(config, allow_val_change=True)
                for metric, summary in SUMMARY_METRICS.items():
                    run.define_metric(metric, summary=summary, step_metric="trainer/global_step")
            else:
                logger.log_hyperparams(config)
        except Exception as err:  # logging must never end a training run
            rank_zero_warn(f"could not log the run config to {type(logger).__name__}: {type(err).__name__}: {err}")
