"""ExplanationLogger's one private Lightning attribute, guarded: the step validation metrics are logged at."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from vit import ImageClassifier, ImageDataModule
from vit.callbacks import AttentionRolloutLogger, ExplanationLogger
from vit.callbacks.explanations import logged_step


class StepProbe(pl.Callback):
    """Records, at each validation's end, the step the logger helper returns and the step Lightning logs at."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, bool]] = []

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loop = trainer.fit_loop.epoch_loop
        self.seen.append((logged_step(trainer), trainer.global_step, hasattr(loop, "_batches_that_stepped")))


class MetricSteps(pl.loggers.Logger):
    """A logger that keeps the step of every ``val/`` metric."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[int] = []

    @property
    def name(self) -> str:
        return "steps"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        if any(key.startswith("val/") for key in metrics):
            self.steps.append(step)


def test_lightning_keeps_the_step_validation_metrics_are_logged_at(tmp_path):
    """Canary: ``logged_step`` reads Lightning's private ``_batches_that_stepped``; if a Lightning release renames it,
    this fails (instead of the pictures silently drifting to ``global_step``), and it must equal the step of the
    validation metrics in the middle of a fit, where ``global_step`` is one ahead of it."""
    torch.manual_seed(0)
    module = ImageClassifier("vit_tiny_patch4_32", num_classes=10, img_size=32, lr=1e-3,
                             model_overrides={"depth": 1, "embed_dim": 32, "num_heads": 2})  # fmt: skip
    data = ImageDataModule(dataset="digits", img_size=32, batch_size=16, num_workers=0, seed=0)
    probe, logger = StepProbe(), MetricSteps()
    trainer = pl.Trainer(
        default_root_dir=tmp_path, accelerator="cpu", max_steps=4, limit_train_batches=4, val_check_interval=2,
        limit_val_batches=1, num_sanity_val_steps=0, callbacks=[probe], logger=logger, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, log_every_n_steps=1,
    )  # fmt: skip
    trainer.fit(module, data)
    assert [present for _, _, present in probe.seen] == [True, True]
    assert [step for step, _, _ in probe.seen] == logger.steps == [1, 3]  # Lightning logs at steps taken - 1
    assert [step for _, step, _ in probe.seen] == [2, 4]


def test_the_older_name_is_the_same_callback():
    assert AttentionRolloutLogger is ExplanationLogger
