"""Stop at the first non-finite loss or gradient (before the optimizer step, or within ``check_every_n_steps``), and
never save non-finite weights."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from ..errors import NonFiniteError
from ..runs import last_checkpoint_path
from .resume import sync_epoch_metrics


class NonFiniteGuard(Callback):
    """Stop training at the first non-finite loss or gradient, before the optimizer step, so the weights stay finite;
    refuse to save a checkpoint of non-finite weights, so the last good one is never overwritten.

    The error (:class:`NonFiniteError`; the CLI prints it and exits with status 3) names the step, the learning rate
    and precision, the likely causes and the checkpoint that is kept. Under fp16 mixed precision only a NaN loss
    stops the run: infinite gradients are the grad scaler's to skip.

    Checking a value on the host waits for the device: on a GPU that is a synchronisation every step, which stalls
    the queue of kernels. With ``check_every_n_steps = n > 1`` the checks become flags on the device, read once every
    ``n`` optimizer steps, before validation and before every checkpoint is written (reduced over DDP ranks, so all
    stop together): the run then stops up to ``n`` steps after the first non-finite value, and the weights of those
    steps (possibly non-finite) are never saved. Buffers (BatchNorm statistics) are checked with the parameters.

    Args:
        check_gradients: Also check the gradients before each optimizer step (one reduction over them per step).
        check_every_n_steps: Read the checks on the host every ``n`` optimizer steps; 1 stops before the optimizer
            step that would apply a non-finite value.

    Raises:
        ValueError: If ``check_every_n_steps`` is not positive.
    """

    def __init__(self, check_gradients: bool = True, check_every_n_steps: int = 1) -> None:
        if check_every_n_steps < 1:
            raise ValueError(f"check_every_n_steps must be >= 1, got {check_every_n_steps}")
        self.check_gradients = check_gradients
        self.check_every_n_steps = check_every_n_steps
        self._flags: torch.Tensor | None = None  # [loss, gradient] non-finite since step ``_since``, on the device
        self._since = 0

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._flags, self._since = None, trainer.global_step

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        scaled = _grad_scaler(trainer) is not None  # a scaled fp16 loss may overflow to inf: the scaler skips it
        bad = torch.isnan(loss).any() if scaled else ~torch.isfinite(loss).all()
        if self.check_every_n_steps > 1:
            self._flag(0, bad)
        elif bool(bad):
            raise NonFiniteError(non_finite_message(trainer, f"non-finite loss ({loss.detach().float().item()})"))

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        if not self.check_gradients or _grad_scaler(trainer) is not None:  # inf gradients: the scaler skips them
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return
        finite = torch.isfinite(torch.nn.utils.get_total_norm(grads))  # one foreach reduction
        if self.check_every_n_steps > 1:
            self._flag(1, ~finite)
        elif not bool(finite):
            names = {p: n for n, p in pl_module.named_parameters()}
            first = next(
                names.get(p, "?")
                for group in optimizer.param_groups
                for p in group["params"]
                if p.grad is not None and not bool(torch.isfinite(p.grad).all())
            )
            raise NonFiniteError(non_finite_message(trainer, f"non-finite gradient (first in {first})"))

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # After an optimizer step only (not between accumulated micro-batches), every n steps.
        if trainer.global_step > self._since and trainer.global_step % self.check_every_n_steps == 0:
            self._read_flags(trainer)

    # Before validation and at the epoch's end (before the checkpoint callbacks, which run last, save): validation
    # never runs on weights a deferred check has not cleared, and weights-only checkpoints, for which Lightning calls
    # no on_save_checkpoint, are covered too.
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "fit":
            self._read_flags(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        sync_epoch_metrics(trainer)  # before the reduce in _read_flags
        self._read_flags(trainer)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._read_flags(trainer)
        parameters = {name for name, _ in pl_module.named_parameters()}
        for name, tensor in pl_module.state_dict().items():  # what is saved: parameters and persistent buffers
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                kind = "parameter" if name in parameters else "buffer"
                raise NonFiniteError(
                    f"refusing to save a checkpoint at step {trainer.global_step}: {kind} {name} is not finite. "
                    f"The previous checkpoint is kept. {_LIKELY_CAUSES}"
                )

    def _flag(self, which: int, bad: torch.Tensor) -> None:
        if self._flags is None:
            self._flags = torch.zeros(2, dtype=torch.bool, device=bad.device)
        self._flags[which] |= bad  # stays on the device: no synchronisation

    def _read_flags(self, trainer: Trainer) -> None:
        """Raise if a deferred check failed since the last read (one host synchronisation)."""
        flags, since, self._flags, self._since = self._flags, self._since, None, trainer.global_step
        if flags is None:
            return
        if trainer.world_size > 1:  # every rank reads at the same steps: all stop, or none
            flags = trainer.strategy.reduce(flags.float(), reduce_op="max").bool()
        loss, grad = flags.tolist()
        if loss or grad:
            what = " and ".join(kind for kind, bad in (("loss", loss), ("gradient", grad)) if bad)
            steps = f"{since}..{max(since, trainer.global_step - 1)}"
            raise NonFiniteError(
                non_finite_message(trainer, f"non-finite {what} in steps {steps}", self.check_every_n_steps)
            )


_LIKELY_CAUSES = (
    "Likely causes: a learning rate too high for the batch size (lower --model.lr, or lengthen the warm-up with "
    "--model.warmup_epochs), overflow in reduced precision (--trainer.precision 16-mixed: use bf16-mixed or 32-true), "
    "or NaN/Inf in the input data."
)


def non_finite_message(trainer: Trainer, what: str, checked_every: int = 1) -> str:
    """The message for a non-finite value at the current step: where, the learning rate and precision, the likely
    causes, and the checkpoint that is kept.

    Args:
        trainer: The running trainer.
        what: What was non-finite, e.g. ``"non-finite loss (nan)"``.
        checked_every: The guard's ``check_every_n_steps``; above 1 the optimizer may have applied the value.
    """
    lrs = sorted({group["lr"] for optimizer in trainer.optimizers for group in optimizer.param_groups})
    lr = f"{lrs[-1]:.3g}" if lrs else "?"
    last = last_checkpoint_path(trainer)
    kept = (
        f"The last good checkpoint is kept: {last}; resume from it (--ckpt_path {last}) after the change."
        if last.is_file()
        else "No checkpoint had been written yet."
    )
    if checked_every == 1:
        where = (
            f"at step {trainer.global_step} (epoch {trainer.current_epoch}, batch "
            f"{trainer.fit_loop.epoch_loop.batch_idx}): training stopped before the optimizer step, so the weights "
            "are still finite"
        )
    else:
        where = (
            f"(epoch {trainer.current_epoch}; checked every {checked_every} steps, --nonfinite.check_every_n_steps 1 "
            "checks before each optimizer step): training stopped and the weights of these steps are not saved"
        )
    return f"{what} {where} (learning rate {lr}, precision {trainer.precision}). {_LIKELY_CAUSES} {kept}"


def _grad_scaler(trainer: Trainer) -> Any:
    return getattr(trainer.precision_plugin, "scaler", None)
