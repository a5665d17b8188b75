"""``vit predict`` writes what it predicted: ``predictions.csv`` (and optionally rollout overlays) in the run folder.

A Lightning :class:`~lightning.pytorch.callbacks.BasePredictionWriter`: the module's ``predict_step`` returns class
probabilities; this writer turns them into one CSV row per image (``path,pred,prob`` and the top-5 classes with
their probabilities, by class name) written atomically to ``<trainer.default_root_dir>/predictions.csv``, whose path
is printed on a line of its own once the progress bar has ended.
"""

from __future__ import annotations

import csv
import sys
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from PIL import Image

from ..atomic import atomic_write

PREDICTIONS_FILE = "predictions.csv"


class PredictionWriter(BasePredictionWriter):
    """Write ``predictions.csv`` (and, with ``overlays``, one rollout panel per image) after ``vit predict``.

    Columns: ``path`` (the image file, from the data module's ``predict_paths``; ``#<index>`` when unknown),
    ``pred`` (class name), ``prob`` (its probability), then ``top1``, ``top1_prob`` ... ``topK``, ``topK_prob``.

    Args:
        top_k: Classes listed per image (at most the number of classes).
        overlays: Also write ``rollout/<index>_<file stem>.png`` per image: the image beside its attention rollout,
            captioned with the prediction (:func:`vit.explain.explain_images`, :func:`vit.explain.render_panel`).
    """

    def __init__(self, top_k: int = 5, overlays: bool = False) -> None:
        super().__init__(write_interval="batch")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.top_k = top_k
        self.overlays = overlays
        self.rows: list[dict[str, Any]] = []
        self.path: Path | None = None
        self._report: list[str] = []  # the lines naming what was written, printed once the progress bar has ended

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Lightning warns when a loader's sampler cannot report batch indices (the data module's decoded loader);
        # this writer numbers the rows itself, in loader order.
        warnings.filterwarnings("ignore", message="Couldn't infer the batch indices")

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.rows = []
        self._report = []

    def write_on_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        probs = prediction.detach().float().cpu()
        start = len(self.rows)
        indices = list(batch_indices) if batch_indices else list(range(start, start + len(probs)))
        names = _class_names(trainer, probs.shape[1])
        paths = list(getattr(trainer.datamodule, "predict_paths", None) or [])
        k = min(self.top_k, probs.shape[1])
        top_p, top_i = probs.topk(k, dim=1)
        for row, index in enumerate(indices):
            record: dict[str, Any] = {
                "path": paths[index] if index < len(paths) else f"#{index}",
                "pred": names[int(top_i[row, 0])],
                "prob": f"{float(top_p[row, 0]):.6f}",
            }
            for j in range(k):
                record[f"top{j + 1}"] = names[int(top_i[row, j])]
                record[f"top{j + 1}_prob"] = f"{float(top_p[row, j]):.6f}"
            self.rows.append(record)
        if self.overlays and trainer.is_global_zero:
            paths = [str(r["path"]) for r in self.rows[start:]]
            self._write_overlays(trainer, pl_module, batch, probs, indices, paths)

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.is_global_zero or not self.rows:
            return
        self.path = Path(trainer.default_root_dir) / PREDICTIONS_FILE
        with atomic_write(self.path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(self.rows[0]))
            writer.writeheader()
            writer.writerows(self.rows)
        self._report = [f"predictions of {len(self.rows)} images: {self.path}"]
        if self.overlays:
            self._report.append(f"rollout overlays: {self.path.parent / 'rollout'}")

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Where the files went, printed here: the progress bar is still drawn at the epoch's end (it closes in
        # on_predict_end), and a path printed then would continue the bar's line.
        if self._report:
            sys.stdout.write("".join(f"{line}\n" for line in self._report))
            sys.stdout.flush()
        self._report = []

    def _write_overlays(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        batch: Any,
        probs: torch.Tensor,
        indices: list[int],
        paths: list[str],
    ) -> None:
        from ..explain import explain_images, render_panels

        images = batch[0] if isinstance(batch, (list, tuple)) else batch
        labels = batch[1] if isinstance(batch, (list, tuple)) and len(batch) > 1 else None
        datamodule = trainer.datamodule
        model = getattr(pl_module, "eval_model", pl_module)
        explanation = explain_images(
            model,
            images,
            labels=labels,
            class_names=getattr(datamodule, "class_names", None),
            mean=getattr(datamodule, "mean", None),
            std=getattr(datamodule, "std", None),
        )
        # Captioned with the prediction written to the CSV (with test-time augmentation, the mean over the views).
        explanation = replace(explanation, probs=probs, preds=probs.argmax(dim=1))
        folder = Path(trainer.default_root_dir) / "rollout"
        folder.mkdir(parents=True, exist_ok=True)
        for index, path, panel in zip(indices, paths, render_panels(explanation), strict=True):
            with atomic_write(folder / f"{index:05d}_{Path(path).stem.lstrip('#')}.png") as f:
                Image.fromarray(panel).save(f, format="PNG")


def _class_names(trainer: Trainer, num_classes: int) -> list[str]:
    names = list(getattr(trainer.datamodule, "class_names", None) or [])
    return [str(n) for n in names] if len(names) == num_classes else [str(i) for i in range(num_classes)]


def read_predictions(path: str | Path) -> list[dict[str, str]]:
    """The rows of a ``predictions.csv``, as dictionaries of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


__all__ = ["PREDICTIONS_FILE", "PredictionWriter", "read_predictions"]
