"""``vit test`` reports where the model fails: this callback decides *when* (every test batch, the test's end, rank 0
for the files); :mod:`vit.evaluation` decides *what* (the metrics, the corruptions, the pictures and files).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn

from ..env import available_cores
from ..errors import UsageError
from ..loggers import log_summary, wandb_loggers
from .run_summary import wandb_lines


def corruptions_in_one_process(config: Any) -> None:
    """``vit test --corruptions`` evaluates in one process: a config that tests with several (the CPU recipe's two DDP
    processes) tests with one instead, on every core of this machine, and says so. Called on the parsed config
    before anything is instantiated, so no run folder is claimed for a test that could not run.

    Args:
        config: The parsed ``vit test`` config (``trainer``, ``torch_num_threads``).
    """
    trainer = config.trainer
    devices = trainer.get("devices")
    count = len(devices) if isinstance(devices, (list, tuple)) else int(devices) if str(devices).isdigit() else 1
    nodes = int(trainer.get("num_nodes") or 1)
    if count * nodes <= 1:
        return
    trainer.devices, trainer.num_nodes = 1, 1
    if str(trainer.get("strategy") or "auto").startswith("ddp"):
        trainer.strategy = "auto"
    if config.get("torch_num_threads"):
        config.torch_num_threads = max(config.torch_num_threads, available_cores())
    threads = config.get("torch_num_threads") or torch.get_num_threads()
    sys.stderr.write(
        f"note: --corruptions evaluates in one process: testing with 1 process instead of the config's "
        f"{count * nodes}, on {threads} threads\n"
    )


class EvaluationReport(Callback):
    """At the end of ``vit test``: every number of :class:`vit.evaluation.ClassificationMetrics` over the whole test
    split (synced across DDP ranks), written to the run folder (``evaluation.json`` with the run header,
    ``confusion_matrix.png``, ``reliability.png``, ``evaluation.html``), logged to W&B (the confusion matrix chart,
    the per-class table, a predictions table with images, the headline numbers in the run summary) and printed as a
    short table. The probabilities are those ``vit test`` scores: with test-time augmentation the mean over the
    views, with a calibrated checkpoint divided by its temperature (``vit calibrate``).

    Args:
        enabled: Evaluate (``false`` leaves ``vit test`` to its logged accuracy alone).
        table_images: Test images (the first ones) in the W&B predictions table.
        corruptions: Also evaluate on the 15 common corruptions x 5 severities: ``"cifar10-c"`` corrupts the test
            images here (CIFAR-10-C's constants at 32 px), a folder path reads the released CIFAR-10-C ``.npy``
            files (:func:`vit.evaluation.evaluate_corruptions`; one process: :func:`corruptions_in_one_process`).
        corruption_seed: Seed of the random corruptions.
        corruption_cache: A folder that keeps the generated corruptions for the next evaluation of the same images.
    """

    reports_wandb_run = True
    """Its report ends with the W&B run's folder and ``wandb sync`` command (:class:`~vit.callbacks.RunSummary`
    leaves them to it, so that they come after the table)."""

    def __init__(
        self,
        enabled: bool = True,
        table_images: int = 64,
        corruptions: str | None = None,
        corruption_seed: int = 0,
        corruption_cache: str | None = None,
    ) -> None:
        super().__init__()
        if table_images < 0:
            raise UsageError(f"evaluation.table_images must be >= 0, got {table_images}")
        self.enabled, self.table_images = enabled, table_images
        self.corruptions, self.corruption_seed, self.corruption_cache = corruptions, corruption_seed, corruption_cache
        self.metrics: Any = None
        self.samples: list[dict[str, Any]] = []
        self.pixels: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []
        self._report: list[str] = []

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "test" or not self.enabled or not self.corruptions:
            return
        if trainer.world_size > 1:
            raise UsageError(
                f"--corruptions runs on one process and this test has {trainer.world_size}: add --trainer.devices 1"
            )
        if self.corruptions != "cifar10-c" and not Path(self.corruptions).is_dir():
            raise UsageError(
                f"--corruptions {self.corruptions!r} is neither 'cifar10-c' (generate the corruptions) nor a folder "
                "of the released CIFAR-10-C files (<corruption>.npy and labels.npy)"
            )

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.enabled:
            return
        from ..evaluation import ClassificationMetrics

        self.metrics = ClassificationMetrics(pl_module.num_classes).to(pl_module.device)
        self.samples, self.pixels, self.labels, self._report = [], [], [], []

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.metrics is None or not isinstance(outputs, torch.Tensor):
            return
        x, y = batch[0], batch[1]
        self.metrics.update(outputs, y)
        room = self.table_images - len(self.samples) if trainer.is_global_zero else 0
        if room <= 0 and not self.corruptions:
            return
        pixels = _pixels(trainer, x)
        if self.corruptions:
            self.pixels.append(pixels)
            self.labels.append(y.cpu().numpy())
        confidence, pred = outputs.detach().float().softmax(-1).max(-1)
        for i in range(min(max(room, 0), len(x))):
            sample = {"label": int(y[i]), "pred": int(pred[i]), "confidence": float(confidence[i])}
            self.samples.append({"image": pixels[i], **sample})

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.metrics is None:
            return
        from ..env import run_header
        from ..evaluation.report import summary_table, write_evaluation

        names = _class_names(trainer, pl_module.num_classes)
        metrics = self.metrics.compute(names)  # every rank: the states are gathered across them
        if not trainer.is_global_zero:
            return
        header = run_header(shlex.join(["vit", *sys.argv[1:]]), device=pl_module.device)
        result: dict[str, Any] = {**header, "checkpoint": str(trainer.ckpt_path) if trainer.ckpt_path else None}
        result["test_time_augment"] = pl_module.hparams.get("test_time_augment", "none")
        result["temperature"] = getattr(pl_module, "temperature", None)
        result |= metrics
        examples = None
        if self.corruptions:
            result["corruptions"], examples = self._corruptions(trainer, pl_module)
        folder = Path(trainer.default_root_dir)
        written = write_evaluation(folder, result, names, examples)
        self._log_wandb(trainer, result, names, folder)
        page = next((path for path in written if path.suffix == ".html"), written[0])
        others = ", ".join(path.name for path in written if path != page)
        self._report = [summary_table(result), f"evaluation: {page}  (open in a browser; {others} beside it)"]
        self._report += wandb_lines(trainer)  # last, after the table: where the run went and how to upload it

    def _corruptions(self, trainer: Trainer, pl_module: LightningModule) -> tuple[dict[str, Any], Any]:
        from ..evaluation import evaluate_corruptions

        datamodule = trainer.datamodule
        model = getattr(pl_module, "eval_model", pl_module)
        return evaluate_corruptions(
            model,
            np.concatenate(self.pixels),
            np.concatenate(self.labels),
            mean=datamodule.mean,
            std=datamodule.std,
            source=self.corruptions,
            seed=self.corruption_seed,
            img_size=int(pl_module.hparams.get("img_size") or 0) or None,
            cache_dir=self.corruption_cache,
        )

    def _log_wandb(self, trainer: Trainer, result: dict[str, Any], names: list[str], folder: Path) -> None:
        loggers = wandb_loggers(trainer)
        if not loggers:
            return
        import wandb

        from ..evaluation.report import scalar_summary, wandb_payload

        log_summary(trainer, scalar_summary(result))
        try:
            payload = wandb_payload(result, names, self.samples)
            for picture in ("confusion_matrix", "reliability", "corruptions"):
                if (folder / f"{picture}.png").is_file():
                    payload[f"evaluation/{picture}_figure"] = wandb.Image(str(folder / f"{picture}.png"))
            for logger in loggers:
                logger.experiment.log(payload)
        except Exception as err:  # logging must never end an evaluation
            rank_zero_warn(f"could not log the evaluation to W&B: {type(err).__name__}: {err}")

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # printed here, once the progress bar has closed (as vit predict's writer does)
        if self._report:
            sys.stdout.write("".join(f"{line}\n" for line in self._report))
            sys.stdout.flush()
        self._report = []
        self.metrics = None


def _pixels(trainer: Trainer, x: torch.Tensor) -> np.ndarray:
    """The normalised batch back to uint8 ``(B, H, W, 3)`` pixels (exactly the loader's, up to float rounding)."""
    from ..normalize import denormalize

    datamodule = trainer.datamodule
    images = denormalize(x.detach().float(), datamodule.mean, datamodule.std)
    return images.mul(255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


def _class_names(trainer: Trainer, num_classes: int) -> list[str]:
    names = list(getattr(getattr(trainer, "datamodule", None), "class_names", None) or [])
    return [str(n) for n in names] if len(names) == num_classes else [str(i) for i in range(num_classes)]
