"""Command line: ``vit fit|validate|test|predict --config <file or name in configs/> [--key value ...]``.

A thin :class:`~lightning.pytorch.cli.LightningCLI` over :class:`vit.ImageClassifier` and
:class:`vit.ImageDataModule`. On top of Lightning's CLI it

- looks a bare ``--config`` name up in ``configs/`` (``--config vit_small`` finds ``configs/vit_small.yaml``;
  :mod:`vit.configs`);
- gives every ``fit`` its own folder ``runs/<config>/<run name>/`` (checkpoints, ``config.yaml``, W&B files,
  explanation maps; :mod:`vit.runs` names, claims and finds them), named like its W&B run, so runs never overwrite
  each other; ``--ckpt_path last`` resumes the most recent run of the config in its own folder (``--ckpt_path`` takes
  a file, a run folder, ``last`` or ``best``, as every subcommand does: :mod:`vit.checkpoints.naming`);
  ``validate``/``test``/``predict`` write below the checkpoint's run;
- writes ``num_classes`` and ``img_size`` once, in ``data``, and links them into ``model``;
- adds a ``checkpoint`` (:class:`~lightning.pytorch.callbacks.ModelCheckpoint`, best ``val/acc``), ``resume``
  (:mod:`vit.callbacks.resume`: ``last.ckpt`` at epoch ends, every N steps and on SIGTERM/SIGINT, bit-exact resume),
  ``nonfinite`` (:mod:`vit.callbacks.nonfinite`), ``run_summary`` (the end-of-fit report) and ``predictions``
  (``predictions.csv`` of ``vit predict``);
- writes checkpoints atomically and reads them with ``weights_only=True`` (:mod:`vit.checkpoints.writing`);
- takes the image size, class names, statistics and eval transform of ``validate``/``test``/``predict`` from the
  checkpoint (:mod:`vit.checkpoints`): ``vit predict --ckpt_path CKPT --data.predict_dir DIR`` needs no ``--config``
  and no training data, and a setting that contradicts the checkpoint is one error naming both values;
- matches no option by a prefix: a typo (``--trainer.max_epoch``) is an error suggesting the closest option, and a
  bad value is one sentence naming the file or flag that set it (:mod:`vit.cli_errors`);
- keeps freed CPU memory for reuse when asked (``--keep_freed_memory true``, :mod:`vit.allocator`);
- logs to W&B offline when there are no credentials or no server, names runs and logs the nested config
  (:mod:`vit.loggers`);
- turns every bad input (a :class:`vit.errors.VitError`) into one ``error:`` line and its exit status
  (:data:`vit.errors.EXIT_STATUSES`), without usage dump or traceback.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import yaml
from jsonargparse import DefaultHelpFormatter, Namespace
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI, SaveConfigCallback

from .allocator import keep_freed_memory
from .callbacks.evaluation import EvaluationReport, corruptions_in_one_process
from .callbacks.nonfinite import NonFiniteGuard
from .callbacks.predictions import PredictionWriter
from .callbacks.resume import ResumeCheckpoint
from .callbacks.run_summary import RunSummary
from .callbacks.stop_processes import StopStartedProcesses
from .checkpoints import check_is_checkpoint, checkpoint_errors, read_checkpoint, read_metadata
from .checkpoints.data import rebuild_datamodule
from .checkpoints.pretrained import load_into
from .checkpoints.writing import with_atomic_checkpoint_io
from .cli_errors import SUBCOMMANDS, VitArgumentParser, config_files, value_source
from .configs import cpu_config_names, resolve_config_args
from .data import ImageDataModule
from .errors import EXIT_BAD_INPUT, UsageError, VitError, exit_with
from .lit_module import ImageClassifier
from .loggers import (
    configured_wandb_loggers,
    finish_wandb_run,
    log_config,
    name_wandb_runs,
    offline_without_server,
    without_anonymous_setting,
)
from .runs import (
    _get,
    choose_run_folder,
    forget_claimed_folders,
    needs_resolving,
    place_run_outputs,
    remove_unused_folders,
    resolve_ckpt_path,
)


# ------------------------------------------------------------------------------------------------ parsing
class VitHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help without the lists of "known subclasses" (every ``nn.Module``, callback, logger and plugin
    class imported: 100 KB), so ``--help`` lists every option in under 40 KB. ``--<key>.help CLASS`` still shows a
    class's own options, e.g. ``--trainer.callbacks.help ModelCheckpoint``."""

    def __init__(self, prog: str, **kwargs: Any) -> None:
        kwargs.setdefault("max_help_position", 8)  # help text on its own line, indented 8, not 24 columns
        super().__init__(prog, **kwargs)

    def _get_help_string(self, action: Any) -> str:  # argparse's documented hook for help text
        return re.sub(r", known subclasses: [^)]*", "", super()._get_help_string(action))


def parser_kwargs(command_line: list[str] | None) -> dict[str, Any]:
    """The ``parser_kwargs`` of :class:`VitCLI`: one-line errors naming the source of a bad value in
    ``command_line`` (:class:`~vit.cli_errors.VitArgumentParser`), and a short usage line per subcommand
    (jsonargparse's lists every option, 8 KB, before the help lists them again)."""
    common = {"formatter_class": VitHelpFormatter, "command_line": command_line}
    each = {**common, **help_defaults(command_line or [])}
    return {
        "description": "Train, evaluate and apply Vision Transformers (vit).",
        **common,
        **{sub: {"usage": f"vit {sub} [--config CONFIG] [--section.key VALUE ...]", **each} for sub in SUBCOMMANDS},
    }


def help_defaults(command_line: list[str]) -> dict[str, Any]:
    """``vit fit --config FILE --help`` shows FILE's values as the defaults: the ``--config`` files given before
    ``--help`` become the subcommand parser's ``default_config_files`` (jsonargparse's help then shows their values
    and names them). Without ``--help``, nothing: a run reads its ``--config`` files in their place on the line."""
    helps = [i for i, arg in enumerate(command_line) if arg in ("-h", "--help")]
    if not helps:
        return {}
    files = config_files(command_line[: helps[0]])
    return {"default_config_files": files} if files else {}


def use_checkpoint_data(config: Namespace, meta: dict[str, Any], standalone: bool, command_line: list[str]) -> None:
    """Check the run's ``data`` settings against the checkpoint's description ``meta`` and adopt its image size.

    An image size or class count the user set (``--config`` or a flag) that differs from the checkpoint's is an error
    naming both; an unset one (the defaults) takes the checkpoint's. With ``standalone`` (``vit predict`` of a
    ``predict_dir``) the data set becomes the checkpoint's own description: no training data is read.

    Args:
        config: The subcommand's parsed config (changed in place).
        meta: The checkpoint's :func:`~vit.checkpoints.inference_metadata`.
        standalone: ``vit predict``: the checkpoint's description may replace the data set.
        command_line: The arguments parsed (what the user set, and where).

    Raises:
        UsageError: For an image size or class count that contradicts the checkpoint.
    """
    data = config.data
    size = int(meta["img_size"][0])
    source = value_source("data.img_size", command_line)[0]
    if data.img_size != size and source is not None:
        where = "on the command line" if source == "command line" else f"in {source}"
        raise UsageError(
            f"data.img_size is {data.img_size} ({where}) but the checkpoint was trained at img_size {size}: "
            f"drop the setting or set --data.img_size {size}"
        )
    data.img_size = size
    config.model.img_size = size
    given = any(value_source(f"data.{key}", command_line)[0] is not None for key in ("dataset", "data_dir"))
    implied = _implied_classes(data) if given else None
    if implied is not None and implied != meta["num_classes"]:
        raise UsageError(
            f"data.dataset {data.dataset!r} has {implied} classes but the checkpoint's model has "
            f"{meta['num_classes']}: predict with the checkpoint alone (no --config), or use the data it was trained on"
        )
    if standalone and data.get("predict_dir"):
        data.dataset, data.data_dir = "synthetic", None
        data.synthetic_num_classes, data.synthetic_size = int(meta["num_classes"]), 1
        data.mean, data.std = tuple(meta["mean"]), tuple(meta["std"])


def _implied_classes(data: Namespace) -> int | None:
    """The class count of the ``data`` settings when it is known here without reading images, else ``None``."""
    from .data import DATASETS

    spec = DATASETS.get(data.dataset)
    if spec is None:
        return None
    if data.dataset == "synthetic":
        return int(data.synthetic_num_classes)
    if spec.num_classes:
        return int(spec.num_classes)
    datamodule = rebuild_datamodule({k: v for k, v in dict(data).items() if not k.startswith("__")})
    return None if datamodule is None else datamodule.num_classes  # None: the folder is not here, nothing to compare


HALF_PRECISIONS = ("bf16-mixed", "16-mixed", "bf16-true", "16-true", "bf16", "16", "transformer-engine")
"""Precisions that make a run with ``accelerator: auto`` a GPU recipe: on a CPU they are emulated, many times slower."""


def check_gpu_recipe(config: Namespace, command_line: list[str]) -> None:
    """Refuse a GPU recipe where no GPU is found, before anything is written.

    A run is a GPU recipe when its trainer asks for a GPU (``accelerator: gpu`` or ``cuda``), or leaves the choice to
    Lightning (``auto``) with a 16-bit precision (``bf16-mixed``, the GPU configs'), which on a CPU trains at a
    fraction of the speed of the CPU configs. ``--trainer.accelerator`` given on the command line is the user's own
    choice and is never refused.

    Args:
        config: The subcommand's parsed config.
        command_line: The arguments parsed (what the user set, and where).

    Raises:
        UsageError: For a GPU recipe without a GPU, naming the configs made for a CPU.
    """
    from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator

    accelerator = str(_get(config, "trainer.accelerator", "auto"))
    precision = str(_get(config, "trainer.precision", None))
    source = value_source("trainer.accelerator", command_line)[0]
    wants_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and precision in HALF_PRECISIONS)
    if source == "command line" or not wants_gpu or CUDAAccelerator.is_available() or MPSAccelerator.is_available():
        return
    asks = f"trainer.accelerator {accelerator}"
    asks += f" with trainer.precision {precision}" if accelerator == "auto" else ""
    where = source or value_source("trainer.precision", command_line)[0]
    cpu_configs = ", ".join(f"--config {name}" for name in cpu_config_names()) or "a config with accelerator: cpu"
    raise UsageError(
        f"{where or 'this run'} is a GPU recipe ({asks}) and no GPU was found: on a CPU use a CPU config "
        f"({cpu_configs}), or pass --trainer.accelerator cpu to run it on the CPU anyway"
    )


class LogConfig(SaveConfigCallback):
    """Lightning's config saving (``config.yaml`` in the run folder), plus the whole nested run config sent to the
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
        # `checkpoint`: it writes after it); a stop at the first NaN/Inf loss or gradient.
        parser.add_lightning_class_args(ResumeCheckpoint, "resume")
        parser.add_lightning_class_args(NonFiniteGuard, "nonfinite")
        parser.add_lightning_class_args(RunSummary, "run_summary")
        parser.add_lightning_class_args(PredictionWriter, "predictions")
        if str(parser.usage).startswith("vit test "):  # evaluation.json, figures, W&B: options of `vit test` alone
            parser.add_lightning_class_args(EvaluationReport, "evaluation")
            parser.add_argument("--corruptions", type=str | None, default=None, help="cifar10-c or a CIFAR-10-C folder")
            parser.link_arguments("corruptions", "evaluation.corruptions", apply_on="parse")
        # LogConfig sends every logger the whole nested config; Lightning's own flat copy of the model's and data's
        # arguments would overwrite its `model` section in W&B (Lightning #19728).
        parser.set_defaults({"trainer.enable_autolog_hparams": False})
        parser.add_argument(
            "--torch_num_threads",
            type=int | None,
            default=None,
            help="CPU threads for PyTorch's operators (torch.set_num_threads); null keeps PyTorch's default.",
        )
        parser.add_argument(
            "--keep_freed_memory",
            type=bool,
            default=False,
            help="true: glibc's malloc keeps freed blocks of up to 32 MiB for reuse instead of returning them to the "
            "system and page-faulting them back in every step (vit.allocator; process-wide, so opt-in); false keeps "
            "the C library's defaults.",
        )
        parser.add_argument(
            "--runs_dir",
            type=str,
            default="runs",
            help="Every run writes to <runs_dir>/<config>/<run name>/ unless trainer.default_root_dir is set.",
        )
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.img_size", "model.img_size", apply_on="parse")

    # Private override: LightningCLI._parse_ckpt_path reads --ckpt_path with a bare torch.load (to take the model's
    # hyper-parameters from it) before any public hook runs, so a text file raises a KeyError from inside torch. Here
    # a file that is not a checkpoint is named in one line first, and `last`, `best` or a run folder becomes a file
    # (vit.runs.resolve_ckpt_path; after Lightning's parsing, which skips them: the model is the config's).
    # tests/test_cli_training.py::test_lightning_still_reads_ckpt_path_before_the_hooks fails if Lightning changes
    # this.
    def _parse_ckpt_path(self) -> None:
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config = self.config[subcommand]
        self.resumed_run: Path | None = None
        if config.get("ckpt_path") and not needs_resolving(config.ckpt_path):
            check_is_checkpoint(config.ckpt_path)
        with checkpoint_errors(config.get("ckpt_path")):  # an unsafe pickle: refused, named
            super()._parse_ckpt_path()
        config = self.config[subcommand]  # Lightning's parse of the checkpoint's hyper-parameters made a new one
        if needs_resolving(config.get("ckpt_path")):
            config.ckpt_path, self.resumed_run = resolve_ckpt_path(config, subcommand)
            if config.ckpt_path:
                check_is_checkpoint(config.ckpt_path)
        self.inference_meta = None
        if subcommand != "fit" and config.get("ckpt_path") and "://" not in str(config.ckpt_path):
            self.inference_meta = read_metadata(read_checkpoint(config.ckpt_path))
            if self.inference_meta is not None:
                standalone = subcommand == "predict"
                use_checkpoint_data(config, self.inference_meta, standalone, self.command_line)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if self.subcommand == "test" and config.get("corruptions"):
            corruptions_in_one_process(config)
        if config.get("torch_num_threads"):
            torch.set_num_threads(config.torch_num_threads)
        if config.get("keep_freed_memory"):
            keep_freed_memory()
        check_gpu_recipe(config, self.command_line)
        self.run_dir = self._choose_run_folder(config)
        if self.subcommand != "fit" and not config.get("ckpt_path") and not _get(config, "model.pretrained"):
            sys.stderr.write(
                f"note: no --ckpt_path: {self.subcommand} runs the config's freshly initialised model; pass "
                "--ckpt_path <last.ckpt of a run> (or --ckpt_path last) to use trained weights\n"
            )
        offline_without_server(config)

    def _choose_run_folder(self, config: Namespace) -> Path:
        """This run's own folder (:func:`vit.runs.choose_run_folder`, :func:`vit.runs.place_run_outputs`), and the W&B
        loggers named after the run and writing there."""
        given = next((w.init_args.get("name") for w in configured_wandb_loggers(config)), None)
        resumed = getattr(self, "resumed_run", None)
        folder, name, run_id = choose_run_folder(config, str(self.subcommand), resumed, given)
        place_run_outputs(config, str(self.subcommand), folder)
        if self.subcommand == "predict":
            config.trainer.logger = False  # a prediction logs no metrics: no W&B run to mix with the fits
        name_wandb_runs(config, name, folder, run_id)
        for logger in configured_wandb_loggers(config):
            if self.subcommand != "fit" and not logger.init_args.get("job_type"):
                logger.init_args.job_type = self.subcommand  # compare.py keeps fits apart from evaluations
        return folder

    def after_instantiate_classes(self) -> None:
        without_anonymous_setting(self.trainer)  # W&B's "anonymous setting has no effect" warning
        meta = getattr(self, "inference_meta", None)
        if self.subcommand == "predict" and meta is not None and self.datamodule.predict_dir is not None:
            # the checkpoint's own data (a predict-only spec): no dataset, the run's loader settings
            self.datamodule = ImageDataModule.from_checkpoint_metadata(meta, like=self.datamodule)
        if self.subcommand == "fit" and isinstance(self.model, ImageClassifier):
            self.model.check_trainer(self.trainer, self.datamodule)  # before the run folder gets its config and W&B run
            load_into(self.model)  # --model.pretrained: a file that does not fit is an error before any of it

    # Private helpers used: LightningCLI._parser gives the subcommand's parser (its callback keys) and
    # ._instantiate_trainer adds those callbacks (the public instantiate_trainer cannot leave one out). Works around:
    # the Trainer refuses checkpoint callbacks under enable_checkpointing=False.
    # tests/test_cli_training.py::test_lightning_still_reads_ckpt_path_before_the_hooks and
    # tests/test_cli.py::test_checkpointing_can_be_switched_off fail if either side changes.
    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """As Lightning's, leaving out the checkpoint callbacks under ``--trainer.enable_checkpointing false``, with
        checkpoint files written atomically and read with ``weights_only=True`` (:mod:`vit.checkpoints.writing`), and
        the processes DDP starts ended when this one fails (:class:`StopStartedProcesses`)."""
        init = self.config_init.get(str(self.subcommand), self.config_init)
        config = {**init.get("trainer", {}), **kwargs}
        config["plugins"] = with_atomic_checkpoint_io(config.get("plugins"))
        callbacks = [init.get(key) for key in self._parser(self.subcommand).callback_keys]
        if config.get("enable_checkpointing") is False:
            callbacks = [cb for cb in callbacks if not isinstance(cb, Checkpoint)]
        callbacks.append(StopStartedProcesses())
        return self._instantiate_trainer(config, callbacks)

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        # As Lightning's, without its warning about passing args while sys.argv is set: cli_main passes the
        # resolved sys.argv itself. The arguments are kept: what the user set, and where (use_checkpoint_data).
        if isinstance(args, (dict, Namespace)):
            self.command_line: list[str] = []
            self.config = parser.parse_object(args)
        else:
            self.command_line = [str(a) for a in (sys.argv[1:] if args is None else args)]
            self.config = parser.parse_args(args)


class _WithoutLitLoggerTip(logging.Filter):
    """Drops Lightning's "💡 Tip: ... try installing litlogger" advertisement, printed at every Trainer start."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


_QUIET = _WithoutLitLoggerTip()


def cli_kwargs(command_line: list[str] | None) -> dict[str, Any]:
    """The :class:`VitCLI` arguments of ``vit`` besides its classes and ``args`` (also what a parse-only check of a
    command line, as ``vit sweep`` makes, builds its parser with)."""
    return {
        "seed_everything_default": 0,
        "save_config_callback": LogConfig,
        "save_config_kwargs": {"overwrite": True},
        "auto_configure_optimizers": False,
        "parser_class": VitArgumentParser,
        "parser_kwargs": parser_kwargs(command_line),
    }


def cli_main(args: ArgsType = None) -> VitCLI | None:
    """Entry point of ``vit``, ``python -m vit`` and ``scripts/fit.py``.

    Args:
        args: Arguments as on the command line, e.g. ``["fit", "--config", "quickstart"]`` (the first one is the
            subcommand); ``None`` reads ``sys.argv[1:]``.

    Returns:
        The :class:`VitCLI` (its ``trainer``, ``model``, ``datamodule``, ``run_dir``) when ``args`` is given;
        ``None`` when it reads ``sys.argv``, because the ``vit`` console script exits with this function's return
        value.

    Raises:
        SystemExit: With the :attr:`~vit.errors.VitError.exit_status` of the error (:data:`vit.errors.EXIT_STATUSES`)
            after printing one ``error:`` line; with 128 + signal after a SIGTERM/SIGINT checkpoint; with 0 after
            ``--help``/``--print_config``.
    """
    argv = sys.argv[1:] if args is None else args
    command_line = None
    if isinstance(argv, (list, tuple)):
        argv = resolve_config_args([str(a) for a in argv])
        command_line = list(argv)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_QUIET)  # the same object: added once
    os.environ.setdefault("WANDB_SILENT", "true")  # W&B's banner; the run summary names its folder and sync command
    # Lightning 2.6 calls a torch.utils._pytree API that torch 2.14 deprecates, on every command: not the user's to fix.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    try:
        cli = VitCLI(ImageClassifier, ImageDataModule, args=argv, **cli_kwargs(command_line))
    except VitError as err:
        refused = err.exit_status == EXIT_BAD_INPUT
        if refused:
            finish_wandb_run(failed=True)  # its files are closed before its folder goes
        remove_unused_folders(refused_input=refused)
        exit_with(err)
    except BaseException:
        remove_unused_folders()  # a crash or an interrupt before any output leaves no empty run folder either
        raise
    finally:
        forget_claimed_folders()
    return cli if args is not None else None


if __name__ == "__main__":
    cli_main()
