"""What a run achieved and where it went: the end-of-fit report, and the model's size in the W&B run summary.

Training throughput has one owner, :class:`~vit.callbacks.TrainingThroughput` (``train/img_per_sec``, every step; its
mean over the fit is its ``throughput``); this callback only copies that mean into the summary and the report.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn

from ..loggers import STATUS_KEY, log_summary, wandb_run_folders
from ..models.flops import forward_flops
from ..runs import last_checkpoint_path
from .throughput import training_throughput
from .time_budget import TimeBudget


def count_parameters(model: nn.Module) -> dict[str, int]:
    """``{"params": all, "trainable_params": requiring grad}``, shared parameters counted once."""
    params = {id(p): p for p in model.parameters()}.values()
    return {
        "params": sum(p.numel() for p in params),
        "trainable_params": sum(p.numel() for p in params if p.requires_grad),
    }


class RunSummary(Callback):
    """Put the model's size in the W&B run summary at fit start, and print what the fit achieved at its end.

    Summary columns (W&B runs table): ``model/params``, ``model/trainable_params``, ``model/gflops``,
    ``model/gmacs`` (one forward pass of one image), ``train/img_per_sec`` (the mean over the fit), and
    :data:`~vit.loggers.STATUS_KEY`: ``running`` from the fit's start, then ``finished``, ``interrupted``
    (Ctrl-C, SIGTERM: a partial ``last.ckpt``) or ``failed``, which ``vit compare`` reads. The report at the end of a
    fit names the best ``val/acc`` and its epoch, the final ``val/acc``, with a time budget (``model.schedule: time``)
    the steps and epochs it bought (also ``train/budget_steps`` and ``train/budget_epochs`` in the W&B summary), the
    best and last checkpoints, the W&B run folder with its ``wandb sync`` command and the attention explorer of the
    explanation maps (:func:`explanation_lines`); ``vit validate`` and ``vit test`` end with the W&B run folder and
    its ``wandb sync`` command.

    Args:
        flops: Count the forward FLOPs (one extra forward pass of one image at fit start).
    """

    def __init__(self, flops: bool = True) -> None:
        super().__init__()
        self.flops = flops
        self.val_acc: dict[int, float] = {}  # epoch -> val/acc, for the report

    def state_dict(self) -> dict[str, dict[int, float]]:
        """The ``val/acc`` of every epoch so far: a resumed run's report covers the epochs before the resume."""
        return {"val_acc": dict(self.val_acc)}

    def load_state_dict(self, state_dict: dict[str, dict[int, float]]) -> None:
        self.val_acc = {int(epoch): float(acc) for epoch, acc in (state_dict.get("val_acc") or {}).items()}

    def model_statistics(self, pl_module: LightningModule) -> dict[str, float]:
        """Parameter counts and (if enabled) GFLOPs/GMACs of ``pl_module.model`` for one image."""
        model = pl_module.model if isinstance(getattr(pl_module, "model", None), nn.Module) else pl_module
        stats: dict[str, float] = dict(count_parameters(model))
        patch_embed = getattr(model, "patch_embed", None)
        if self.flops and patch_embed is not None:
            height, width = patch_embed.img_size
            flops = forward_flops(model, (patch_embed.in_chans, height, width))
            stats["gflops"] = flops / 1e9
            stats["gmacs"] = flops / 2e9
        return stats

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero:
            log_summary(trainer, {f"model/{k}": v for k, v in self.model_statistics(pl_module).items()})
            log_summary(trainer, {STATUS_KEY: "running"})

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if trainer.is_global_zero and trainer.state.fn == TrainerFn.FITTING:
            stopped = isinstance(exception, (KeyboardInterrupt, SystemExit))  # Ctrl-C, SIGTERM (Preempted)
            log_summary(trainer, {STATUS_KEY: "interrupted" if stopped else "failed"})

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        acc = trainer.callback_metrics.get("val/acc")
        if not trainer.sanity_checking and acc is not None:
            self.val_acc[trainer.current_epoch] = float(acc)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        throughput = training_throughput(trainer)
        if throughput == throughput:  # not nan
            log_summary(trainer, {"train/img_per_sec": throughput})
        budget = _time_budget(trainer)
        if budget is not None:
            bought = budget.summary(trainer)
            log_summary(trainer, {"train/budget_steps": bought["steps"], "train/budget_epochs": bought["epochs"]})
        log_summary(trainer, {STATUS_KEY: "interrupted" if trainer.interrupted else "finished"})
        sys.stdout.write(self.report(trainer, throughput) + "\n")
        sys.stdout.flush()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == TrainerFn.VALIDATING:  # `vit validate`; a fit reports at its end
            self.report_wandb(trainer)

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not any(getattr(callback, "reports_wandb_run", False) for callback in trainer.callbacks):
            self.report_wandb(trainer)  # else the evaluation's report ends with it, after its table

    def report_wandb(self, trainer: Trainer) -> None:
        """The end of ``vit validate`` / ``vit test``: where its W&B run went and, offline, how to upload it."""
        lines = wandb_lines(trainer) if trainer.is_global_zero else []
        if lines:
            sys.stdout.write("\n".join(lines) + "\n")
            sys.stdout.flush()

    def report(self, trainer: Trainer, throughput: float = float("nan")) -> str:
        """The end-of-fit text: accuracies, checkpoints, W&B folder and sync command, the explanations' page."""
        lines = [f"Run folder: {trainer.default_root_dir}"]
        if self.val_acc:
            best_epoch = max(self.val_acc, key=lambda epoch: (self.val_acc[epoch], -epoch))
            final_epoch = max(self.val_acc)
            lines.append(
                f"val/acc: best {self.val_acc[best_epoch]:.4f} at epoch {best_epoch}, "
                f"final {self.val_acc[final_epoch]:.4f} at epoch {final_epoch}"
            )
        if throughput == throughput:
            lines.append(f"training throughput: {throughput:.0f} img/s")
        budget = _time_budget(trainer)
        if budget is not None:
            bought = budget.summary(trainer)
            lines.append(
                f"time budget: {_minutes(bought['budget_s'])} bought {bought['steps']:,} steps ({bought['epochs']:.1f} "
                f"epochs); {_minutes(bought['used_s'])} used ({bought['used_s'] / bought['budget_s']:.1%})"
            )
        checkpoint = next((cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)), None)
        if checkpoint is not None and checkpoint.best_model_path:
            lines.append(f"best checkpoint: {shown_path(checkpoint.best_model_path)}")
        last = last_checkpoint_path(trainer)
        if last.is_file():
            lines.append(f"last checkpoint: {shown_path(last)}  (resume: --ckpt_path last)")
        lines += wandb_lines(trainer)
        lines += explanation_lines(Path(trainer.default_root_dir) / "rollout")
        return "\n".join(lines)


def explanation_lines(folder: Path) -> list[str]:
    """What :class:`~vit.callbacks.ExplanationLogger` left in ``folder``: the newest attention explorer, the page a
    person opens, with the maps of every epoch (AttnLRP, attribution, rollout, distance: PNGs) beside it."""
    if not folder.is_dir():
        return []
    pages = sorted(folder.glob("explorer*.html"))
    if pages:
        return [f"explanations: {pages[-1]}  (open in a browser; each epoch's maps as PNGs beside it)"]
    return [f"explanation maps (PNGs of each epoch): {folder}"] if any(folder.glob("*.png")) else []


def wandb_lines(trainer: Trainer) -> list[str]:
    """``W&B run: <folder>`` for each W&B run of the trainer, with the ``wandb sync`` command of an offline one. A
    resumed offline run has a folder per part (``offline-run-<time>-<id>``, one id): the command uploads them all,
    which ``wandb sync`` joins into one run in the order they started."""
    lines = []
    for folder, offline in wandb_run_folders(trainer):
        run_id = folder.name.rsplit("-", 1)[-1]
        parts = sorted(folder.parent.glob(f"offline-run-*-{run_id}")) if offline else []
        if len(parts) > 1:
            earlier = f" and {len(parts) - 1} earlier part{'s' * (len(parts) > 2)} of this resumed run"
            lines.append(f"W&B run: {folder}{earlier}  (upload: wandb sync {folder.parent}/offline-run-*-{run_id})")
        else:
            lines.append(f"W&B run: {folder}" + (f"  (upload: wandb sync {folder})" if offline else ""))
    return lines


def shown_path(path: str | Path) -> str:
    """``path`` as the user would type it: relative to the current folder when it lies under it (Lightning records
    checkpoints by absolute path), else as it is."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _time_budget(trainer: Trainer) -> TimeBudget | None:
    return next((cb for cb in trainer.callbacks if isinstance(cb, TimeBudget) and cb.budget), None)


def _minutes(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60} s"
