"""Command line: ``vit fit|validate|test|predict --config <file or name in configs/> [--key value ...]``.

A thin :class:`~lightning.pytorch.cli.LightningCLI` over :class:`vit.ImageClassifier` and
:class:`vit.ImageDataModule`. On top of Lightning's CLI it

- looks a bare ``--config`` name up in ``configs/`` (``--config vit_small`` finds ``configs/vit_small.yaml``);
- writes ``num_classes`` and ``img_size`` once, in ``data``, and links them into ``model``;
- always adds a ``checkpoint`` (:class:`~lightning.pytorch.callbacks.ModelCheckpoint`) keeping the best
  ``val/acc`` and ``last.ckpt``, so ``--ckpt_path last`` resumes;
- switches :class:`~lightning.pytorch.loggers.WandbLogger` to offline mode when no W&B credentials are configured,
  so a run never waits on the network, and says how to upload it later; names W&B runs and logs the whole nested
  config to them (:mod:`vit.loggers`);
- sets PyTorch's CPU thread count from ``torch_num_threads``;
- makes runs resumable bit for bit and preemptible (:mod:`vit.fault`): ``last.ckpt`` at every epoch end, every
  ``resume.every_n_train_steps`` steps and on SIGTERM/SIGINT (exit status 143/130), atomic checkpoint files read with
  ``weights_only=True``, a stop at the first non-finite loss (exit status 3), and one message for an unsafe,
  truncated or mismatched checkpoint (exit status 2);
- turns data errors (missing dataset, wrong folder layout) and impossible model settings (unknown preset or
  override) into one message and exit status 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import yaml
from jsonargparse import Namespace
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from .callbacks import RunSummary
from .data import DataError, ImageDataModule
from .fault import (
    NonFiniteGuard,
    ResumeCheckpoint,
    checkpoint_errors,
    exit_on_fault,
    wandb_reachable,
    with_atomic_checkpoint_io,
)
from .lit_module import ConfigError, ImageClassifier
from .loggers import is_wandb_logger, log_config, name_wandb_runs

CONFIG_DIRS = (Path("configs"), Path(__file__).resolve().parents[1] / "configs")
"""Where a bare ``--config`` name is looked up: ``./configs`` first, then the repository's ``configs/``."""


def resolve_config_args(args: list[str]) -> list[str]:
    """Replace each ``--config NAME`` (also ``-c NAME``, ``--config=NAME``) that is not a file by the file
    ``configs/NAME`` or ``configs/NAME.yaml``.

    Args:
        args: Command-line arguments, without the program name.

    Raises:
        SystemExit: (status 2, message on stderr) if ``NAME`` is neither a file nor a config name.
    """
    out = list(args)
    for i, arg in enumerate(out):
        if arg in ("--config", "-c") and i + 1 < len(out):
            out[i + 1] = _find_config(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + _find_config(arg.split("=", 1)[1])
    return out


def _find_config(name: str) -> str:
    if Path(name).is_file() or name.lstrip().startswith("{"):  # a path, or inline YAML/JSON
        return name
    for folder in CONFIG_DIRS:
        for candidate in (folder / name, folder / f"{name}.yaml"):
            if candidate.is_file():
                return str(candidate)
    known = sorted({p.name for folder in CONFIG_DIRS if folder.is_dir() for p in folder.glob("*.yaml")})
    sys.stderr.write(
        f"error: config file {name!r} not found: it is not a path, nor a file in configs/. "
        f"Known configs: {', '.join(known) or 'none'}\n"
    )
    raise SystemExit(2)


def wandb_credentials_configured() -> bool:
    """Whether W&B could log in without asking: ``WANDB_API_KEY``, an identity token file or a ``.netrc`` entry for
    the W&B host (``wandb login`` writes one). Nothing is sent over the network."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    try:  # read .netrc without creating wandb's settings singleton, which would freeze WANDB_* variables now
        from wandb.sdk.lib import urls, wbauth

        return bool(wbauth.read_netrc_auth(host=os.environ.get("WANDB_BASE_URL") or urls.DEFAULT_BASE_URL))
    except Exception:  # another wandb version: fall back on its (deprecated) public accessor
        try:
            import wandb

            return bool(wandb.api.api_key)
        except Exception:
            return False


class LogConfig(SaveConfigCallback):
    """Lightning's config saving (``config.yaml`` in the log folder), plus the whole nested run config sent to the
    loggers (:func:`vit.loggers.log_config`): Lightning itself logs only the model's and data's arguments.

    Only rank zero calls :meth:`save_config`.
    """

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        config = yaml.safe_load(self.parser.dump(self.config, skip_none=False, format="yaml"))
        log_config(trainer, config)


class VitCLI(LightningCLI):
    """LightningCLI for :class:`vit.ImageClassifier` on :class:`vit.ImageDataModule` (see the module docstring)."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val/acc",
                "checkpoint.mode": "max",
                "checkpoint.save_last": True,
                "checkpoint.filename": "epoch{epoch:03d}-acc{val/acc:.4f}",
                "checkpoint.auto_insert_metric_name": False,
            }
        )
        # last.ckpt at epoch ends, every N steps and on SIGTERM/SIGINT, with the random state (listed after
        # `checkpoint`: it writes after it); a stop at the first NaN/Inf loss or gradient (vit.fault).
        parser.add_lightning_class_args(ResumeCheckpoint, "resume")
        parser.add_lightning_class_args(NonFiniteGuard, "nonfinite")
        # Parameters, FLOPs per image and training throughput of every run, in the W&B summary (vit.callbacks).
        parser.add_lightning_class_args(RunSummary, "run_summary")
        # LogConfig sends every logger the whole nested config; Lightning's own flat copy of the model's and data's
        # arguments would overwrite its `model` section in W&B (Lightning #19728).
        parser.set_defaults({"trainer.enable_autolog_hparams": False})
        parser.add_argument(
            "--torch_num_threads",
            type=int | None,
            default=None,
            help="CPU threads for PyTorch's operators (torch.set_num_threads); null keeps PyTorch's default.",
        )
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.img_size", "model.img_size", apply_on="parse")

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """As Lightning's, leaving out the ``checkpoint`` and ``resume`` callbacks under
        ``--trainer.enable_checkpointing false`` (the Trainer refuses checkpoint callbacks then), and with checkpoint
        files written atomically and read with ``weights_only=True`` (:class:`vit.fault.AtomicCheckpointIO`)."""
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        config["plugins"] = with_atomic_checkpoint_io(config.get("plugins"))
        callbacks = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        if config.get("enable_checkpointing") is False:
            callbacks = [cb for cb in callbacks if not isinstance(cb, Checkpoint)]
        return self._instantiate_trainer(config, callbacks)

    def _parse_ckpt_path(self) -> None:
        # Lightning reads the hyper-parameters of --ckpt_path (weights_only=True) before building the model: name an
        # unsafe or truncated file instead of raising torch's error.
        subcommand = self.config.get("subcommand")
        with checkpoint_errors(self.config[subcommand].get("ckpt_path") if subcommand else None):
            super()._parse_ckpt_path()

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        # As Lightning's, without its warning about passing args while sys.argv is set: cli_main passes the
        # resolved sys.argv itself.
        if isinstance(args, (dict, Namespace)):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.get("torch_num_threads"):
            torch.set_num_threads(config.torch_num_threads)
        name_wandb_runs(config)  # readable name, group and tags, unless the config sets them
        self._wandb_offline_without_credentials(config)

    @staticmethod
    def _wandb_offline_without_credentials(config: Namespace) -> None:
        loggers = config.trainer.logger
        loggers = loggers if isinstance(loggers, list) else [loggers]
        wandb = [logger for logger in loggers if is_wandb_logger(logger)]
        if not wandb or os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun"):
            return
        reason = "no credentials configured (WANDB_API_KEY, ~/.netrc)"
        if wandb_credentials_configured():
            if wandb_reachable(timeout=3.0):  # else wandb.init retries for 90 s, then fails the run
                return
            reason = f"server {os.environ.get('WANDB_BASE_URL') or 'https://api.wandb.ai'} unreachable within 3 s"
        for logger in wandb:
            logger.init_args.offline = True
            logger.init_args.mode = "offline"  # explicit: WandbLogger's WANDB_MODE may come after wandb read it
            logger.init_args.log_model = False  # uploads need a connection; offline WandbLogger refuses it
            where = Path(logger.init_args.get("save_dir") or ".") / "wandb"
            rank_zero_info(
                f"W&B: {reason}, logging offline to {where}/. "
                f"Upload later with `wandb login` then `wandb sync {where}/offline-run-*`."
            )


def cli_main(args: ArgsType = None) -> VitCLI | None:
    """Entry point of ``vit``, ``python -m vit`` and ``scripts/fit.py``.

    Args:
        args: Arguments as on the command line, e.g. ``["fit", "--config", "quickstart"]`` (the first one is the
            subcommand); ``None`` reads ``sys.argv[1:]``.

    Returns:
        The :class:`VitCLI` (its ``trainer``, ``model``, ``datamodule``) when ``args`` is given; ``None`` when it
        reads ``sys.argv``, because the ``vit`` console script exits with this function's return value.

    Raises:
        SystemExit: With status 2 after printing the message for bad arguments, a missing config file, a model
            setting that cannot work (unknown preset or override), a data error (missing dataset, wrong folder
            layout) or a checkpoint that is unsafe, truncated or of another architecture; with status 3 after a
            non-finite loss or gradient; with status 143/130 after a SIGTERM/SIGINT checkpoint; with status 0 after
            ``--help``/``--print_config``.
    """
    argv = sys.argv[1:] if args is None else args
    if isinstance(argv, (list, tuple)):
        argv = resolve_config_args([str(a) for a in argv])
    try:
        with exit_on_fault():  # unsafe/corrupt/mismatched checkpoint: status 2; non-finite loss: status 3
            cli = VitCLI(
                ImageClassifier,
                ImageDataModule,
                args=argv,
                seed_everything_default=0,
                save_config_callback=LogConfig,
                save_config_kwargs={"overwrite": True},
                auto_configure_optimizers=False,
                parser_kwargs={"description": "Train, evaluate and apply Vision Transformers (vit)."},
            )
    except (DataError, ConfigError) as err:
        sys.stderr.write(f"error: {err}\n")
        raise SystemExit(2) from None
    return cli if args is not None else None


if __name__ == "__main__":
    cli_main()
