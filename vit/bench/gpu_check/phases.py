"""When each phase of a fit began and ended, so that the GPU check can say where the time outside a recipe's budget
goes: the data ready (decoding), the sanity check, the first training step (compilation), each validation (the first
compiles), the end of training, the test."""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer


class Phases(Callback):
    """Marks of ``time.perf_counter()`` at a fit's phase boundaries; :meth:`report` turns them into seconds."""

    def __init__(self) -> None:
        self.marks: dict[str, float] = {}
        self.validations: list[float] = []
        self._validation_start: float | None = None

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, time.perf_counter())  # the first time only

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.mark(
            f"data_ready_{getattr(stage, 'value', stage)}"
        )  # after the data module's setup: decoded, on the device

    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.mark("sanity_start")

    def on_sanity_check_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.mark("sanity_end")

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.mark("train_start")

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.mark("first_step_start")

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.mark("first_step_end")

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validation_start = time.perf_counter()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking and self._validation_start is not None:
            self.validations.append(time.perf_counter() - self._validation_start)
            self._validation_start = None

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.mark("train_end")

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.mark("test_start")

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.mark("test_end")

    def report(self, origin: float) -> dict[str, Any]:
        """Each mark in seconds after ``origin`` (a ``perf_counter`` value), the first step's and every
        validation's seconds."""
        report: dict[str, Any] = {f"{name}_s": round(at - origin, 2) for name, at in self.marks.items()}
        if "first_step_end" in self.marks:
            report["first_step_s"] = round(self.marks["first_step_end"] - self.marks["first_step_start"], 2)
        report["validations_s"] = [round(s, 2) for s in self.validations]
        return report
