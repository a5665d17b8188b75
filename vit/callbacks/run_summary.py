"""What a run costs: parameter count, forward FLOPs per image and training throughput, in the logger's summary."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import WandbLogger
from torch import nn

from .rollout import _eval_mode, _warn_on_failure


def count_parameters(model: nn.Module) -> dict[str, int]:
    """``{"params": all, "trainable_params": requiring grad}``, shared parameters counted once."""
    params = {id(p): p for p in model.parameters()}.values()
    return {
        "params": sum(p.numel() for p in params),
        "trainable_params": sum(p.numel() for p in params if p.requires_grad),
    }


def forward_flops(model: nn.Module, input_shape: Sequence[int]) -> int:
    """FLOPs of one eval-mode forward pass of one input of shape ``input_shape`` (without batch dimension).

    Counted with :class:`torch.utils.flop_counter.FlopCounterMode`, where a multiply-add is 2 FLOPs (so GMACs =
    GFLOPs / 2, the unit timm and most papers quote). Attention runs on PyTorch's math backend meanwhile, because
    the fused CPU kernel is not counted. ``model.forward`` is called directly, so a compiled model is not
    recompiled for this batch size; the model's ``training`` flags are restored.

    Args:
        model: The network.
        input_shape: E.g. ``(3, 224, 224)``.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    param = next(model.parameters())
    x = torch.zeros(1, *input_shape, device=param.device, dtype=param.dtype)
    with torch.no_grad(), _eval_mode(model), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model.forward(x)
    return int(counter.get_total_flops())


def _batch_size(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return _batch_size(next(iter(batch.values())))
    raise TypeError(f"cannot tell the batch size of a {type(batch).__name__}")


class RunSummary(Callback):
    """Record what a run costs: parameters, forward FLOPs per image and training throughput.

    At fit start (global rank zero) it counts the parameters of ``pl_module.model`` and the FLOPs of one forward
    pass of one image (:func:`forward_flops`: FLOPs, a multiply-add counting 2). During training it times the
    training batches of every epoch (its first ``warmup_batches`` excluded: compilation, autotuning, worker
    start-up) and reports images per second over all devices, validation excluded.

    With a W&B logger the values go into the run summary (``model/params``, ``model/trainable_params``,
    ``model/gflops``, ``model/gmacs``, ``train/throughput``), so they are columns of the runs table; every logger
    also receives them as metrics.

    Args:
        warmup_batches: Training batches at the start of each epoch left out of the throughput.
        flops: Count the forward FLOPs (one extra forward pass of one image at fit start).
    """

    def __init__(self, warmup_batches: int = 2, flops: bool = True) -> None:
        super().__init__()
        if warmup_batches < 0:
            raise ValueError(f"warmup_batches must be >= 0, got {warmup_batches}")
        self.warmup_batches = warmup_batches
        self.flops = flops
        self.images = 0
        self.seconds = 0.0
        self._epoch_start: float | None = None
        self._epoch_images = 0

    def model_statistics(self, pl_module: LightningModule, trainer: Trainer | None = None) -> dict[str, float]:
        """Parameter counts and (if enabled) GFLOPs/GMACs of ``pl_module.model`` for one image."""
        model = pl_module.model if isinstance(getattr(pl_module, "model", None), nn.Module) else pl_module
        stats: dict[str, float] = dict(count_parameters(model))
        patch_embed = getattr(model, "patch_embed", None)
        if self.flops and patch_embed is not None:
            height, width = patch_embed.img_size
            flops = forward_flops(model, (patch_embed.proj.in_channels, height, width))
            stats["gflops"] = flops / 1e9
            stats["gmacs"] = flops / 2e9
        return stats

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.images, self.seconds = 0, 0.0
        if not trainer.is_global_zero:
            return
        stats = {f"model/{name}": value for name, value in self.model_statistics(pl_module).items()}
        self._report(trainer, stats, step=trainer.global_step)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epoch_start, self._epoch_images = None, 0

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.warmup_batches:
            self._epoch_start = self._now(pl_module)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._epoch_start is not None and batch_idx >= self.warmup_batches:
            self._epoch_images += _batch_size(batch) * trainer.world_size

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._epoch_start is None or self._epoch_images == 0:
            return
        end = self._now(pl_module)  # waits for the device, so the last batch is included
        self.images += self._epoch_images
        self.seconds += max(end - self._epoch_start, 1e-9)
        self._epoch_start = None
        if trainer.is_global_zero:
            self._report(trainer, {"train/throughput": self.throughput}, step=trainer.global_step)

    @property
    def throughput(self) -> float:
        """Training images per second so far (all devices), ``nan`` before the first measured epoch."""
        return self.images / self.seconds if self.seconds > 0 else float("nan")

    @staticmethod
    def _now(pl_module: LightningModule) -> float:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    @staticmethod
    def _report(trainer: Trainer, values: dict[str, float], step: int) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):  # summary columns of the runs table, not charts
                action = lambda logger=logger: logger.experiment.summary.update(values)  # noqa: E731
            else:
                action = lambda logger=logger: logger.log_metrics(values, step=step)  # noqa: E731
            _warn_on_failure(f"run summary to {type(logger).__name__}", trainer.current_epoch, action)
