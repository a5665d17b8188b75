"""Training throughput: ``train/img_per_sec`` at every step, and its mean over the fit for the run summary.

Lightning's ``ThroughputMonitor`` logs other names (``train/samples_per_sec``, per device and averaged over a
window) and needs a batch-size function: this callback keeps the metric this project's configs, runs and comparisons
already use.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer


class TrainingThroughput(Callback):
    """Log ``train/img_per_sec`` (all devices, on the progress bar) at each training batch start: the images of the
    previous step over the time between the two starts, so the optimiser step and data loading count and validation
    does not (each epoch's first batch is not timed). :attr:`throughput` is the mean over the fit, weighted by time.
    """

    def __init__(self) -> None:
        self._batch_start: float | None = None
        self._last_batch_size = 0
        self._timed_images = 0
        self._timed_seconds = 0.0

    @property
    def throughput(self) -> float:
        """Training images per second (all devices) over the fit so far; ``nan`` before two batches ran."""
        return self._timed_images / self._timed_seconds if self._timed_seconds > 0 else float("nan")

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._timed_images, self._timed_seconds = 0, 0.0

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._batch_start = None  # validation ran in between: restart the clock

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._batch_start is not None:
            images = self._last_batch_size * trainer.world_size
            self._timed_images += images
            self._timed_seconds += now - self._batch_start
            # A CPU tensor: Lightning would copy a Python number to the GPU, a synchronisation.
            rate = torch.tensor(images / (now - self._batch_start))
            pl_module.log("train/img_per_sec", rate, on_step=True, prog_bar=True)
        self._batch_start = now
        self._last_batch_size = batch[0].shape[0]


def training_throughput(trainer: Trainer) -> float:
    """The :attr:`TrainingThroughput.throughput` of ``trainer``'s callback, ``nan`` without one."""
    callback = next((cb for cb in trainer.callbacks if isinstance(cb, TrainingThroughput)), None)
    return callback.throughput if callback is not None else float("nan")
