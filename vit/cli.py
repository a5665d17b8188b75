"""Command line: ``vit fit|validate|test|predict --config <file or name in configs/> [--key value ...]``.

A thin :class:`~lightning.pytorch.cli.LightningCLI` over :class:`vit.ImageClassifier` and
:class:`vit.ImageDataModule`. On top of Lightning's CLI it

- looks a bare ``--config`` name up in ``configs/`` (``--config vit_small`` finds ``configs/vit_small.yaml``);
- gives every ``fit`` its own folder ``runs/<config>/<run name>/`` (checkpoints, ``config.yaml``, W&B files,
  rollout PNGs; :mod:`vit.runs` names, claims and finds them), named like its W&B run, so runs never overwrite
  each other; ``--ckpt_path last`` resumes the most recent run of the config in its own folder;
  ``validate``/``test``/``predict`` write below the checkpoint's run;
- writes ``num_classes`` and ``img_size`` once, in ``data``, and links them into ``model``;
- adds a ``checkpoint`` (:class:`~lightning.pytorch.callbacks.ModelCheckpoint`, best ``val/acc``), ``resume``
  (:mod:`vit.callbacks.resume`: ``last.ckpt`` at epoch ends, every N steps and on SIGTERM/SIGINT, bit-exact resume),
  ``nonfinite`` (:mod:`vit.callbacks.nonfinite`), ``run_summary`` (the end-of-fit report) and ``predictions``
  (``predictions.csv`` of ``vit predict``);
- writes checkpoints atomically and reads them with ``weights_only=True`` (:mod:`vit.checkpoint_io`);
- takes the image size, class names, statistics and eval transform of ``validate``/``test``/``predict`` from the
  checkpoint (:mod:`vit.inference`): ``vit predict --ckpt_path CKPT --data.predict_dir DIR`` needs no ``--config``
  and no training data, and a setting that contradicts the checkpoint is one error naming both values;
- matches no option by a prefix: a typo (``--trainer.max_epoch``) is an error suggesting the closest option;
- keeps freed CPU memory for reuse when asked (``--keep_freed_memory true``, :mod:`vit.allocator`);
- logs to W&B offline when there are no credentials or no server, names runs and logs the nested config
  (:mod:`vit.loggers`);
- turns every bad input into one ``error:`` line and an exit status from :data:`EXIT_STATUSES`, without usage
  dump or traceback.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import torch
import yaml
from jsonargparse import DefaultHelpFormatter, Namespace
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI, SaveConfigCallback

from .allocator import keep_freed_memory
from .callbacks.nonfinite import NonFiniteError, NonFiniteGuard
from .callbacks.predictions import PredictionWriter
from .callbacks.resume import ResumeCheckpoint
from .callbacks.run_summary import RunSummary
from .checkpoint_io import with_atomic_checkpoint_io
from .data import DataError, ImageDataModule
from .errors import EXIT_BAD_INPUT, EXIT_NON_FINITE, UsageError, fail, suggest
from .inference import read_metadata
from .lit_module import ConfigError, ImageClassifier
from .loggers import (
    configured_wandb_loggers,
    log_config,
    name_wandb_runs,
    offline_without_server,
    without_anonymous_setting,
)
from .models.checkpoint_errors import (
    CHECKPOINT_ERRORS,
    MissingCheckpointError,
    check_is_checkpoint,
    checkpoint_errors,
    read_checkpoint,
)
from .runs import (
    RUN_DIR_ENV,
    _get,
    claim_folder,
    config_name,
    default_run_name,
    find_last_checkpoint,
    first_process_of_job,
    forget_claimed_folders,
    remove_unused_folders,
    run_folder_of,
    wandb_run_id,
)

# ------------------------------------------------------------------------------------------- exit statuses
EXIT_STATUSES: dict[type[BaseException], int] = {
    UsageError: EXIT_BAD_INPUT,
    DataError: EXIT_BAD_INPUT,
    ConfigError: EXIT_BAD_INPUT,
    **dict.fromkeys(CHECKPOINT_ERRORS, EXIT_BAD_INPUT),
    NonFiniteError: EXIT_NON_FINITE,
}
"""The one table of exit statuses: each error becomes ``error: <message>`` on stderr and this status. Besides these,
``0`` is success (also ``--help``), a bad argument or config file exits with :data:`EXIT_BAD_INPUT`
(:class:`VitArgumentParser`), and a run stopped by SIGTERM/SIGINT after writing its checkpoint exits with
``128 + signal`` (143, 130; :class:`vit.callbacks.resume.Preempted`). :data:`EXIT_NON_FINITE`: with the default
``--nonfinite.check_every_n_steps 1`` the weights in memory are still finite too."""

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
    fail(
        f"config file {name!r} not found: it is not a path, nor a file in configs/. "
        f"Known configs: {', '.join(known) or 'none'}"
    )


# ------------------------------------------------------------------------------------------ parse errors
class VitHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help without the lists of "known subclasses" (every ``nn.Module``, callback, logger and plugin
    class imported: 100 KB), so ``--help`` lists every option in under 40 KB. ``--<key>.help CLASS`` still shows a
    class's own options, e.g. ``--trainer.callbacks.help ModelCheckpoint``."""

    def __init__(self, prog: str, **kwargs: Any) -> None:
        kwargs.setdefault("max_help_position", 8)  # help text on its own line, indented 8, not 24 columns
        super().__init__(prog, **kwargs)

    def _get_help_string(self, action: Any) -> str:  # argparse's documented hook for help text
        return re.sub(r", known subclasses: [^)]*", "", super()._get_help_string(action))


SUBCOMMANDS = ("fit", "validate", "test", "predict")
PARSER_KWARGS: dict[str, Any] = {
    "description": "Train, evaluate and apply Vision Transformers (vit).",
    "formatter_class": VitHelpFormatter,
    # A short usage line each: jsonargparse's lists every option (8 KB) before the help lists them again.
    **{
        sub: {"usage": f"vit {sub} [--config CONFIG] [--section.key VALUE ...]", "formatter_class": VitHelpFormatter}
        for sub in SUBCOMMANDS
    },
}


class VitArgumentParser(LightningArgumentParser):
    """Lightning's parser, whose errors are one line (jsonargparse prints the whole usage, ~100 lines, first),
    naming the config file that holds the culprit key when one does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False  # no prefix matching: --trainer.max_epoch is an error, never max_epochs
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:
            super().error(message, ex)
        known = [s for action in self._actions for s in action.option_strings if s.startswith("--")]
        fail(describe_parse_error(message, sys.argv[1:] if _ARGS is None else _ARGS, known))


_ARGS: list[str] | None = None  # the arguments cli_main parses, for naming the file of a bad key


def describe_parse_error(message: str, args: list[str], known: list[str] | None = None) -> str:
    """jsonargparse's error as one sentence naming the key, the value, and where the value came from: the command
    line, or the YAML file (the last ``--config`` file that sets the key, unless the command line sets it later).

    Args:
        message: jsonargparse's message, e.g. ``Parser key "model.lr":\n  Expected a <class 'float'>. Got value: x``.
        args: The command-line arguments (to find the ``--config`` files and the options given).
        known: The parser's ``--options``: an unknown one is told the closest of them (:func:`vit.errors.suggest`).
    """
    text = re.sub(r"<class '([\w.]+)'>", r"\1", " ".join(message.split())).replace("NoneType", "null")
    text = re.sub(r"typing\.Literal\[([^\]]*)\]", r"one of \1", text)
    unknown = re.search(r"unrecognized arguments: --([\w.]+)(?:=(\S+)|\s+(\S+))?", text) or re.search(
        r"does not accept (?:option|key) '([\w.]+)'", text
    )
    typed = re.search(r'Parser key "([^"]+)": (.*)', text)
    if unknown:
        key = unknown.group(1)
        kind = "unknown option"
    elif typed:
        key = typed.group(1)
        kind = "bad value for"
    else:
        return text
    source, value = _value_source(key, args)
    if value is None and unknown and unknown.lastindex and unknown.lastindex > 1:
        value = unknown.group(unknown.lastindex)
    where = {None: "", "command line": " on the command line"}.get(source, f" in {source}")
    if kind == "unknown option":
        sub = args[0] if args and args[0] in SUBCOMMANDS else "<subcommand>"
        hint = suggest(f"--{key}", known or []).replace("--", "", 1)
        return f"unknown option {key}{where} (value {value!r}){hint}; `vit {sub} --help` lists the options"
    union = re.search(r"Subtypes: \[([^\]]*)\].*Given value: (.*)$", typed.group(2))
    expected = re.search(r"Expected a (.+?)\. Got value: (.*)$", typed.group(2))
    if union:
        detail = f"expected one of {union.group(1)}, got {union.group(2)!r}"
    elif expected:
        detail = f"expected {expected.group(1)}, got {expected.group(2)!r}"
    else:
        detail = typed.group(2) + (f" (value {value!r})" if value is not None else "")
    return f"bad value for {key}{where}: {detail}"


def _value_source(key: str, args: list[str]) -> tuple[str | None, Any]:
    """``("command line" | <yaml file> | None, value)``: where the last setting of ``key`` came from."""
    source, value = None, None
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args) or arg.startswith("--config="):
            file = args[i + 1] if "=" not in arg else arg.split("=", 1)[1]
            found, found_value = _yaml_value(file, key)
            if found:
                source, value = file, found_value
        elif arg == f"--{key}" or arg.startswith(f"--{key}="):
            source = "command line"
            value = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else None)
    return source, value


def _yaml_value(file: str, key: str) -> tuple[bool, Any]:
    try:
        node: Any = yaml.safe_load(Path(file).read_text())
    except (OSError, yaml.YAMLError):
        return False, None
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, dict) and part in (node.get("init_args") or {}):
            node = node["init_args"][part]
        else:
            return False, None
    return True, node


# -------------------------------------------------------------------------------------- checkpoint's own data
class CheckpointImageData(ImageDataModule):
    """The data of ``vit predict --data.predict_dir DIR`` on a checkpoint that carries its description
    (:mod:`vit.inference`): class names, mean and std, image size and eval transform come from the checkpoint, so the
    training data need not be there. Only the predict split exists."""

    def __init__(self, meta: dict[str, Any], predict_dir: str, **kwargs: Any) -> None:
        super().__init__(
            dataset="synthetic",  # builds nothing until asked; only predict_dir's images are read
            img_size=int(meta["img_size"][0]),
            synthetic_num_classes=int(meta["num_classes"]),
            synthetic_size=1,
            mean=tuple(meta["mean"]),
            std=tuple(meta["std"]),
            predict_dir=predict_dir,
            **kwargs,
        )
        self.meta = meta

    @classmethod
    def like(cls, datamodule: ImageDataModule, meta: dict[str, Any]) -> CheckpointImageData:
        """The checkpoint's data with the loader settings (batch size, workers, ...) of ``datamodule``."""
        keep = ("batch_size", "num_workers", "skip_corrupt", "pin_memory", "normalize_on_device", "seed")
        kwargs = {key: datamodule.hparams[key] for key in keep if key in datamodule.hparams}
        return cls(meta, datamodule.predict_dir, **kwargs)

    @property
    def class_names(self) -> list[str]:
        return list(self.meta.get("class_names") or [str(i) for i in range(self.meta["num_classes"])])

    @property
    def num_classes(self) -> int:
        return int(self.meta["num_classes"])

    @property
    def preset(self) -> Any:
        return self.meta["eval_transform"]

    def setup(self, stage: str | None = None) -> None:
        if self.predict_dataset is None:
            from .data import ImageFileDataset, list_predict_files

            samples = list_predict_files(self.predict_dir)
            self.predict_dataset = ImageFileDataset(samples, self.class_names, self._transform(train=False))


def use_checkpoint_data(config: Namespace, meta: dict[str, Any], standalone: bool) -> None:
    """Check the run's ``data`` settings against the checkpoint's description ``meta`` and adopt its image size.

    An image size or class count the user set (``--config`` or a flag) that differs from the checkpoint's is an error
    naming both; an unset one (the defaults) takes the checkpoint's. With ``standalone`` (``vit predict`` of a
    ``predict_dir``) the data set becomes the checkpoint's own description: no training data is read.

    Raises:
        UsageError: For an image size or class count that contradicts the checkpoint.
    """
    data = config.data
    size = int(meta["img_size"][0])
    args = _ARGS or []
    source = _value_source("data.img_size", args)[0]
    if data.img_size != size and source is not None:
        where = "on the command line" if source == "command line" else f"in {source}"
        raise UsageError(
            f"data.img_size is {data.img_size} ({where}) but the checkpoint was trained at img_size {size}: "
            f"drop the setting or set --data.img_size {size}"
        )
    data.img_size = size
    config.model.img_size = size
    given = any(_value_source(f"data.{key}", args)[0] is not None for key in ("dataset", "data_dir"))
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
    try:
        return ImageDataModule(**{k: v for k, v in dict(data).items() if not k.startswith("__")}).num_classes
    except Exception:  # the folder is not here: nothing to compare
        return None


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
    # a file that is not a checkpoint is named in one line first, and `last` becomes the newest last.ckpt of the
    # config's runs (after Lightning's parsing, which skips `last`, as before: the model is the config's).
    # tests/test_cli.py::test_lightning_still_reads_ckpt_path_before_the_hooks fails if Lightning changes this.
    def _parse_ckpt_path(self) -> None:
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config = self.config[subcommand]
        self.resumed_run: Path | None = None
        if config.get("ckpt_path") and config.ckpt_path != "last":
            check_is_checkpoint(config.ckpt_path)
        with checkpoint_errors(config.get("ckpt_path")):  # an unsafe pickle: refused, named
            super()._parse_ckpt_path()
        config = self.config[subcommand]  # Lightning's parse of the checkpoint's hyper-parameters made a new one
        if config.get("ckpt_path") == "last":
            config.ckpt_path = self._resolve_last(config)
            if config.ckpt_path:
                check_is_checkpoint(config.ckpt_path)
        self.inference_meta = None
        if subcommand != "fit" and config.get("ckpt_path") and "://" not in str(config.ckpt_path):
            self.inference_meta = read_metadata(read_checkpoint(config.ckpt_path))
            if self.inference_meta is not None:
                use_checkpoint_data(config, self.inference_meta, standalone=subcommand == "predict")

    def _resolve_last(self, config: Namespace) -> str | None:
        if _get(config, "checkpoint.dirpath") or _get(config, "trainer.default_root_dir"):
            folder = _get(config, "checkpoint.dirpath") or Path(config.trainer.default_root_dir, "checkpoints")
            path: Path | None = Path(folder, "last.ckpt")
            path = path if path.is_file() else None
        else:
            path = find_last_checkpoint(config.runs_dir, config_name(config))
            self.resumed_run = run_folder_of(path) if path is not None else None
        fitting = self.config.get("subcommand") == "fit"
        if path is None and not fitting:  # nothing to evaluate: never silently use an untrained model
            raise MissingCheckpointError(
                f"--ckpt_path last: no last.ckpt of config {config_name(config)!r} under {config.runs_dir}/; "
                "train one first with `vit fit`, or pass --ckpt_path <file>"
            )
        if path is None:
            sys.stderr.write("--ckpt_path last: no last.ckpt of this config yet, starting a new run\n")
            return None
        sys.stderr.write(f"--ckpt_path last: {'resuming' if fitting else 'using'} {path}\n")
        return str(path)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.get("torch_num_threads"):
            torch.set_num_threads(config.torch_num_threads)
        if config.get("keep_freed_memory"):
            keep_freed_memory()
        self.run_dir = self._choose_run_folder(config)
        if self.subcommand != "fit" and not config.get("ckpt_path") and not _get(config, "model.pretrained"):
            sys.stderr.write(
                f"note: no --ckpt_path: {self.subcommand} runs the config's freshly initialised model; pass "
                "--ckpt_path <last.ckpt of a run> (or --ckpt_path last) to use trained weights\n"
            )
        offline_without_server(config)

    def _choose_run_folder(self, config: Namespace) -> Path:
        """Set ``trainer.default_root_dir``, ``checkpoint.dirpath`` and the W&B loggers' ``save_dir`` to this run's
        own folder (see the module docstring) and return it."""
        resumed = getattr(self, "resumed_run", None)
        run_id = None
        inherited = os.environ.get(RUN_DIR_ENV) if int(os.environ.get("LOCAL_RANK", "0")) > 0 else None
        if inherited:  # a DDP process started by rank 0: the same run, the same folder
            folder = Path(inherited)
            name = folder.name
        elif config.trainer.get("default_root_dir"):  # the user chose the folder
            folder = Path(config.trainer.default_root_dir)
            name = default_run_name(config)
        elif resumed is not None and self.subcommand == "fit":  # --ckpt_path last: continue that run in place
            folder, name, run_id = resumed, resumed.name, wandb_run_id(resumed)
            # ModelCheckpoint warns that its folder "exists and is not empty": expected when a run continues there.
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        elif self.subcommand == "fit" and not first_process_of_job():
            # Another node's first process (multi-node DDP): the job's first process claims the run folder; this one
            # writes nothing there (checkpoints, config, W&B and media are written by global rank 0, and
            # ModelCheckpoint broadcasts rank 0's folder), so it claims none and only names where rank 0's would be.
            name = default_run_name(config)
            folder = Path(config.runs_dir, config_name(config), name)
        else:
            given = next((w.init_args.get("name") for w in configured_wandb_loggers(config)), None)
            name = given or default_run_name(config)
            ckpt_run = run_folder_of(config.ckpt_path) if config.get("ckpt_path") else None
            if self.subcommand == "fit" or ckpt_run is None:
                base = Path(config.runs_dir, config_name(config))
                folder = claim_folder(base / (name if self.subcommand == "fit" else f"{self.subcommand}-{name}"))
            else:  # evaluating or applying a run's checkpoint: below that run, never over its files
                folder = claim_folder(ckpt_run / f"{self.subcommand}-{datetime.now():%m%d-%H%M%S}")
            name = folder.name if self.subcommand == "fit" else name
        os.environ[RUN_DIR_ENV] = str(folder)  # DDP processes that Lightning starts later inherit it
        config.trainer.default_root_dir = str(folder)
        if config.get("checkpoint") is not None and not config.checkpoint.get("dirpath"):
            # fit: the run's own checkpoints/; evaluating a checkpoint: its folder, where it restores its state from
            ckpt = config.get("ckpt_path")
            own = self.subcommand == "fit" or not ckpt or "://" in str(ckpt)
            config.checkpoint.dirpath = str(folder / "checkpoints" if own else Path(ckpt).parent)
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
            self.datamodule = CheckpointImageData.like(self.datamodule, meta)  # the checkpoint's data, no dataset
        if self.subcommand == "fit" and isinstance(self.model, ImageClassifier):
            self.model.check_trainer(self.trainer)  # before the run folder gets its config and W&B run

    # Private helpers used: LightningCLI._parser gives the subcommand's parser (its callback keys) and
    # ._instantiate_trainer adds those callbacks (the public instantiate_trainer cannot leave one out). Works around:
    # the Trainer refuses checkpoint callbacks under enable_checkpointing=False.
    # tests/test_cli.py::test_lightning_still_reads_ckpt_path_before_the_hooks and
    # ::test_checkpointing_can_be_switched_off fail if either side changes.
    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """As Lightning's, leaving out the checkpoint callbacks under ``--trainer.enable_checkpointing false``, with
        checkpoint files written atomically and read with ``weights_only=True`` (:mod:`vit.checkpoint_io`)."""
        init = self.config_init.get(str(self.subcommand), self.config_init)
        config = {**init.get("trainer", {}), **kwargs}
        config["plugins"] = with_atomic_checkpoint_io(config.get("plugins"))
        callbacks = [init.get(key) for key in self._parser(self.subcommand).callback_keys]
        if config.get("enable_checkpointing") is False:
            callbacks = [cb for cb in callbacks if not isinstance(cb, Checkpoint)]
        return self._instantiate_trainer(config, callbacks)

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        # As Lightning's, without its warning about passing args while sys.argv is set: cli_main passes the
        # resolved sys.argv itself.
        if isinstance(args, (dict, Namespace)):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)


class _WithoutLitLoggerTip(logging.Filter):
    """Drops Lightning's "💡 Tip: ... try installing litlogger" advertisement, printed at every Trainer start."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


_QUIET = _WithoutLitLoggerTip()


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
        SystemExit: With a status of :data:`EXIT_STATUSES` after printing one ``error:`` line; with 128 + signal
            after a SIGTERM/SIGINT checkpoint; with 0 after ``--help``/``--print_config``.
    """
    global _ARGS
    argv = sys.argv[1:] if args is None else args
    if isinstance(argv, (list, tuple)):
        argv = resolve_config_args([str(a) for a in argv])
        _ARGS = list(argv)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_QUIET)  # the same object: added once
    os.environ.setdefault("WANDB_SILENT", "true")  # W&B's banner; the run summary names its folder and sync command
    # Lightning 2.6 calls a torch.utils._pytree API that torch 2.14 deprecates, on every command: not the user's to fix.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    try:
        cli = VitCLI(
            ImageClassifier,
            ImageDataModule,
            args=argv,
            seed_everything_default=0,
            save_config_callback=LogConfig,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,
            parser_class=VitArgumentParser,
            parser_kwargs=PARSER_KWARGS,
        )
    except tuple(EXIT_STATUSES) as err:
        status = next(code for kind, code in EXIT_STATUSES.items() if isinstance(err, kind))
        remove_unused_folders()
        fail(str(err), status)
    finally:
        _ARGS = None
        forget_claimed_folders()
    return cli if args is not None else None


if __name__ == "__main__":
    cli_main()
