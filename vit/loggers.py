"""Weights & Biases runs that compare column by column: names, groups, tags and the full nested config.

Lightning logs the LightningModule's and the DataModule's init arguments flat, at the root of the W&B run config,
and never the rest of a LightningCLI run (trainer, callbacks, checkpointing) — Lightning issues #7679 and #19728.
The CLI instead sends the complete resolved configuration, nested by section (``model.lr``, ``data.dataset``,
``trainer.max_epochs``, ...), so the W&B runs table has one column per setting. Runs get a readable name
``<config>-<model>-<dataset>-<MMDD-HHMMSS>``, their config name as ``group``, and tags for the attention kind
(``global``/``window``) and the dataset; ``val/acc`` is summarised by its maximum, ``val/loss`` by its minimum.

This module is the project's one home of W&B: the offline switch (no credentials, or a server that does not answer
within seconds), run names and tags, config logging, and the sinks callbacks use (:func:`log_images`,
:func:`log_summary`); callbacks never import wandb or ``WandbLogger`` themselves. Only :func:`wandb_reachable` opens a
connection (a TCP probe); everything else goes through ``logger.experiment`` of a logger the trainer already has.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
from jsonargparse import Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from .runs import _get, attention_kind, config_name

WANDB_LOGGER_CLASSES = ("lightning.pytorch.loggers.WandbLogger", "lightning.pytorch.loggers.wandb.WandbLogger")
"""``class_path`` spellings of Lightning's W&B logger in a CLI config."""

SUMMARY_METRICS = {"val/acc": "max", "val/acc_top5": "max", "val/loss": "min"}
"""How W&B summarises these metrics in the runs table (``wandb.define_metric(name, summary=...)``)."""

STATUS_KEY = "run/status"
"""W&B summary key of how a fit ended (:class:`~vit.callbacks.RunSummary` writes it, ``vit compare`` reads it):
``running`` while it runs, then ``finished``, ``interrupted`` (Ctrl-C, SIGTERM: a partial ``last.ckpt``) or
``failed``. W&B's own state says ``finished`` for a run stopped by a signal whose process then exited."""

DEFAULT_WANDB_URL = "https://api.wandb.ai"
"""The W&B server when ``WANDB_BASE_URL`` is not set (the only place it is written)."""


def is_wandb_logger(logger: Any) -> bool:
    """Whether a parsed ``trainer.logger`` entry is Lightning's :class:`WandbLogger`."""
    return isinstance(logger, Namespace) and logger.get("class_path") in WANDB_LOGGER_CLASSES


def configured_wandb_loggers(config: Namespace) -> list[Namespace]:
    """The ``trainer.logger`` entries of a parsed CLI config that are W&B loggers."""
    loggers = _get(config, "trainer.logger")
    loggers = loggers if isinstance(loggers, list) else [loggers]
    return [logger for logger in loggers if is_wandb_logger(logger)]


def name_wandb_runs(config: Namespace, name: str, save_dir: str | Path, run_id: str | None = None) -> None:
    """Fill in ``name``, ``group``, ``tags``, ``save_dir`` (and ``id`` to continue a run) of every W&B logger of a
    parsed CLI config, before instantiation. Values the user set are kept; the attention kind and dataset tags are
    added to the user's tags.

    Args:
        config: The parsed config of the subcommand (``trainer``, ``model``, ``data``, ``config``).
        name: The run name (:func:`default_run_name`, or the resumed run's).
        save_dir: The run folder: W&B writes its files to ``<save_dir>/wandb``.
        run_id: The W&B id of the run being resumed, so its history continues in the same run.
    """
    dataset = str(_get(config, "data.dataset", "data"))
    for logger in configured_wandb_loggers(config):
        args = logger.init_args
        args.name = args.get("name") or name
        args.group = args.get("group") or config_name(config)
        if args.get("save_dir") in (None, "", "."):  # WandbLogger's default "." is the working directory
            args.save_dir = str(save_dir)
        if run_id and not args.get("id") and not args.get("version"):
            args.id = run_id
            args.resume = "allow"
        tags = list(args.get("tags") or [])
        args.tags = tags + [tag for tag in (attention_kind(config), dataset) if tag not in tags]


def wandb_credentials_configured() -> bool:
    """Whether W&B could log in without asking: ``WANDB_API_KEY``, an identity token file or a ``.netrc`` entry for
    the W&B host (``wandb login`` writes one). Nothing is sent over the network."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    try:  # read .netrc without creating wandb's settings singleton, which would freeze WANDB_* variables now
        from wandb.sdk.lib import wbauth

        return bool(wbauth.read_netrc_auth(host=os.environ.get("WANDB_BASE_URL") or DEFAULT_WANDB_URL))
    except Exception:  # another wandb version: fall back on its (deprecated) public accessor
        try:
            import wandb

            return bool(wandb.api.api_key)
        except Exception:
            return False


def wandb_reachable(base_url: str | None = None, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the W&B server opens within ``timeout`` seconds (name lookup included).

    Args:
        base_url: The server; default ``WANDB_BASE_URL`` or :data:`DEFAULT_WANDB_URL`.
        timeout: Seconds to wait at most.
    """
    url = urlparse(base_url or os.environ.get("WANDB_BASE_URL") or DEFAULT_WANDB_URL)
    host = url.hostname
    if not host:
        return False
    port = url.port or (443 if url.scheme == "https" else 80)
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)  # getaddrinfo has no timeout of its own
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def offline_without_server(config: Namespace) -> None:
    """Switch every W&B logger of a parsed CLI config to offline mode when no credentials are configured or the
    server does not answer within 3 s (else ``wandb.init`` retries for 90 s, then fails the run), and say so.

    Args:
        config: The parsed config of the subcommand, after :func:`name_wandb_runs`.
    """
    loggers = configured_wandb_loggers(config)
    if not loggers:
        return
    mode = os.environ.get("WANDB_MODE")
    if mode not in ("offline", "disabled", "dryrun"):
        reason = "no credentials configured (WANDB_API_KEY, ~/.netrc)"
        if wandb_credentials_configured():
            if wandb_reachable(timeout=3.0):
                return
            reason = f"server {os.environ.get('WANDB_BASE_URL') or DEFAULT_WANDB_URL} unreachable within 3 s"
        rank_zero_info(f"W&B: {reason}, logging offline; the end of the run prints the `wandb sync` command.")
    for logger in loggers:
        if mode in ("disabled",):
            continue
        logger.init_args.offline = True
        logger.init_args.mode = "offline"  # explicit: WandbLogger's WANDB_MODE may come after wandb read it
        logger.init_args.log_model = False  # uploads need a connection; offline WandbLogger refuses it


def wandb_loggers(trainer: Trainer) -> list[WandbLogger]:
    """The trainer's W&B loggers."""
    return [logger for logger in trainer.loggers if isinstance(logger, WandbLogger)]


def without_anonymous_setting(trainer: Trainer) -> None:
    """Remove the ``anonymous`` argument Lightning's ``WandbLogger`` always passes to ``wandb.init`` (as ``None``
    when unset), for which wandb >= 0.19 prints "The anonymous setting has no effect" at every run start. Call it
    before the first ``logger.experiment``.

    Private attribute: ``WandbLogger._wandb_init`` holds the ``wandb.init`` arguments; there is no public way to
    leave one out. ``tests/test_wandb.py::test_lightning_still_passes_anonymous`` fails when Lightning changes this.
    """
    for logger in wandb_loggers(trainer):
        init = getattr(logger, "_wandb_init", None)
        if isinstance(init, dict) and init.get("anonymous") is None:
            init.pop("anonymous", None)


def wandb_run_folders(trainer: Trainer) -> list[tuple[Path, bool]]:
    """``(folder, offline)`` of each W&B run the trainer logged to (``.../wandb/offline-run-<time>-<id>``); the
    ``wandb sync`` command uploads an offline one."""
    folders = []
    for logger in wandb_loggers(trainer):
        try:
            run = logger.experiment
            folders.append((Path(run.dir).parent, bool(getattr(run.settings, "_offline", False) or run.offline)))
        except Exception:  # a disabled or failed run has no folder
            continue
    return folders


def finish_wandb_run(failed: bool = False) -> None:
    """Finish the W&B run this process has open, if any (Lightning leaves it open when a run fails): its files are
    written and closed, e.g. before a run folder that bad input made useless is removed."""
    wandb = sys.modules.get("wandb")  # never imported here: without it, no run is open
    run = getattr(wandb, "run", None)
    if run is not None:
        run.finish(exit_code=1 if failed else 0)


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
