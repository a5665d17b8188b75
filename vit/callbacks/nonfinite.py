"""Stop at the first non-finite loss or gradient, before the optimizer step, and never save non-finite weights."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from .resume import last_checkpoint_path


class NonFiniteError(RuntimeError):
    """Training produced a non-finite loss, gradient or weight."""


class NonFiniteGuard(Callback):
    """Stop training at the first non-finite loss or gradient, before the optimizer step, so the weights stay finite;
    refuse to save a checkpoint of non-finite weights, so the last good one is never overwritten.

    The error (:class:`NonFiniteError`; the CLI prints it and exits with status 3) names the step, the learning rate
    and precision, the likely causes and the checkpoint that is kept. Under fp16 mixed precision only a NaN loss
    stops the run: infinite gradients are the grad scaler's to skip.

    Args:
        check_gradients: Also check the gradients before each optimizer step (one reduction over them per step).
    """

    def __init__(self, check_gradients: bool = True) -> None:
        self.check_gradients = check_gradients

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        scaled = _grad_scaler(trainer) is not None  # a scaled fp16 loss may overflow to inf: the scaler skips it
        bad = torch.isnan(loss).any() if scaled else ~torch.isfinite(loss).all()
        if bool(bad):
            raise NonFiniteError(non_finite_message(trainer, f"non-finite loss ({loss.detach().float().item()})"))

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        if not self.check_gradients or _grad_scaler(trainer) is not None:  # inf gradients: the scaler skips them
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if grads and not bool(torch.isfinite(torch.nn.utils.get_total_norm(grads))):  # one foreach reduction
            names = {p: n for n, p in pl_module.named_parameters()}
            first = next(
                names.get(p, "?")
                for group in optimizer.param_groups
                for p in group["params"]
                if p.grad is not None and not bool(torch.isfinite(p.grad).all())
            )
            raise NonFiniteError(non_finite_message(trainer, f"non-finite gradient (first in {first})"))

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        for name, param in pl_module.named_parameters():
            if param.is_floating_point() and not bool(torch.isfinite(param).all()):
                raise NonFiniteError(
                    f"refusing to save a checkpoint at step {trainer.global_step}: parameter {name} is not finite. "
                    f"The previous checkpoint is kept. {_LIKELY_CAUSES}"
                )


_LIKELY_CAUSES = (
    "Likely causes: a learning rate too high for the batch size (lower --model.lr, or lengthen the warm-up with "
    "--model.warmup_epochs), overflow in reduced precision (--trainer.precision 16-mixed: use bf16-mixed or 32-true), "
    "or NaN/Inf in the input data."
)


def non_finite_message(trainer: Trainer, what: str) -> str:
    """The message for a non-finite value at the current step: where, the learning rate and precision, the likely
    causes, and the checkpoint that is kept.

    Args:
        trainer: The running trainer.
        what: What was non-finite, e.g. ``"non-finite loss (nan)"``.
    """
    lrs = sorted({group["lr"] for optimizer in trainer.optimizers for group in optimizer.param_groups})
    lr = f"{lrs[-1]:.3g}" if lrs else "?"
    last = last_checkpoint_path(trainer)
    kept = (
        f"The last good checkpoint is kept: {last}; resume from it (--ckpt_path {last}) after the change."
        if last.is_file()
        else "No checkpoint had been written yet."
    )
    return (
        f"{what} at step {trainer.global_step} (epoch {trainer.current_epoch}, batch "
        f"{trainer.fit_loop.epoch_loop.batch_idx}): training stopped before the optimizer step, so the weights are "
        f"still finite (learning rate {lr}, precision {trainer.precision}). {_LIKELY_CAUSES} {kept}"
    )


def _grad_scaler(trainer: Trainer) -> Any:
    return getattr(trainer.precision_plugin, "scaler", None)
