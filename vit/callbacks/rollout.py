"""AttentionRolloutLogger: where the model looks, and how its attention is organised, on fixed images while it trains.

Attention rollout (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020), entropy and mean
attention distance per block (Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021, Fig. 7) and a warning
when a block's attention collapses. The callback only decides *when* and *which images*:
:func:`~vit.explain.explain_images` computes everything in one forward pass, :mod:`vit.explain.panels` draws it,
and the sinks are PNG files in the run's folder and :func:`vit.loggers.log_images` (W&B, when attached).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from PIL import Image
from torch import nn

from .. import loggers
from ..explain import (
    Explanation,
    HeadFusion,
    attention_modules,
    distance_plot,
    eval_mode,
    explain_images,
    render_grid,
    render_panels,
)

GRID_KEY = "val/attention_rollout_grid"
"""W&B key of the captioned grid of every explained image (the same picture as ``rollout/epoch_XXX.png``)."""
ROLLOUT_KEY = "val/attention_rollout"
"""W&B key of the per-image rollout panels."""
DISTANCE_KEY = "val/attention_distance"
"""W&B key of the plot of mean attention distance per head against depth."""

_eval_mode = eval_mode  # the committed run_summary.py still imports it from here (it now lives in vit.explain)


def explained_model(pl_module: LightningModule) -> nn.Module:
    """The network whose predictions are validated: ``pl_module.eval_model`` (the EMA weights when the
    :class:`~vit.ImageClassifier` keeps an EMA), else ``pl_module.model``.

    Raises:
        ValueError: If the module has neither attribute.
    """
    model = getattr(pl_module, "eval_model", None)
    if model is None:
        model = getattr(pl_module, "model", None)
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"{type(pl_module).__name__} has no `model` (nor `eval_model`) network: AttentionRolloutLogger explains "
            "pl_module.model, a vit.VisionTransformer"
        )
    return model


def select_indices(labels: Sequence[int] | np.ndarray | None, length: int, num_images: int) -> list[int]:
    """Deterministic choice of images to explain.

    With labels: the first image of each class, for the ``num_images`` classes that appear first, sorted by label;
    when there are fewer classes than ``num_images``, evenly spaced further images fill up. Without labels:
    ``num_images`` evenly spaced indices.

    Args:
        labels: Label of every item, or ``None`` when the dataset does not expose them.
        length: Number of items in the dataset.
        num_images: How many indices to return (fewer if the dataset is smaller).
    """
    num_images = min(num_images, length)
    chosen: dict[int, int] = {}  # label -> first index
    if labels is not None:
        for index, label in enumerate(np.asarray(labels).tolist()):
            if label not in chosen:
                chosen[label] = index
                if len(chosen) == num_images:
                    break
    picked = [chosen[label] for label in sorted(chosen)]
    taken = set(picked)
    for index in np.linspace(0, length - 1, num=max(num_images, 1)).round().astype(int).tolist():
        if len(picked) == num_images:
            break
        if index not in taken:
            picked.append(index)
            taken.add(index)
    for index in range(length):  # rounding collisions on a tiny dataset
        if len(picked) == num_images:
            break
        if index not in taken:
            picked.append(index)
            taken.add(index)
    return picked


def _dataset_labels(dataset: Any) -> Sequence[int] | None:
    for name in ("labels", "targets"):
        labels = getattr(dataset, name, None)
        if labels is not None and len(labels) == len(dataset):
            return labels
    return None


class AttentionRolloutLogger(Callback):
    """Explain a fixed set of validation images after every ``every_n_epochs``-th validation.

    When fitting or validating starts, ``num_images`` validation images are fixed (:func:`select_indices`: the
    first image of distinct classes), kept as the data gives them (uint8 when the data module normalises on the
    device). After validation, on global rank zero, the validated network (``pl_module.eval_model``: the EMA weights
    when enabled) explains them with :func:`~vit.explain.explain_images` (one eval-mode, no-grad forward pass; the
    model is left as it was) and the result goes to:

    - ``<default_root_dir>/rollout/epoch_XXX.png``: the captioned grid (image | rollout overlay, colour bar,
      "true 3 · pred 7 (32 %)"), at every logged epoch, with or without W&B; the distance plot beside it
      (``distance_epoch_XXX.png``);
    - W&B, when a W&B logger is attached: the same grid (``val/attention_rollout_grid``), the per-image panels
      (``val/attention_rollout``) and the distance plot (``val/attention_distance``);
    - every logger: ``attn/entropy/block_{i}`` (nats), ``attn/distance/block_{i}`` (pixels), means over heads, and
      ``attn/collapsed_blocks``;
    - a warning naming the block and epoch when every head of a block becomes near-uniform or near-one-hot
      (:func:`~vit.explain.detect_collapse`; a freshly initialised ViT attends near-uniformly).

    Logging failures (disk full, a W&B error) become warnings; the run continues.

    Args:
        num_images: How many validation images to explain.
        every_n_epochs: Explain after the validation of every n-th epoch (epochs ``n - 1``, ``2n - 1``, ...).
        head_fusion: How a block's heads are fused in the rollout: ``mean``, ``max`` or ``min``.
        discard_ratio: Fraction in ``[0, 1)`` of the weakest patch-key attention entries dropped per block before
            rolling out (sharper maps for large models, e.g. 0.9).
        alpha: Opacity of the heatmap over the image, in ``[0, 1]``.
        cmap: Colour map of the heatmap (any matplotlib name; perceptually uniform ``inferno`` by default).
        display_size: Side in pixels each image is upscaled to in the panels.
        ncols: Panels per row of the grid.
        statistics: Also log attention entropy, distance, the distance plot and collapse warnings.
        uniform_threshold: Normalised entropy at or above which a head counts as near-uniform.
        one_hot_threshold: Normalised entropy at or below which a head counts as near-one-hot.
    """

    def __init__(
        self,
        num_images: int = 8,
        every_n_epochs: int = 1,
        head_fusion: HeadFusion = "mean",
        discard_ratio: float = 0.0,
        alpha: float = 0.6,
        cmap: str = "inferno",
        display_size: int = 160,
        ncols: int = 4,
        statistics: bool = True,
        uniform_threshold: float = 0.98,
        one_hot_threshold: float = 0.05,
    ) -> None:
        super().__init__()
        for name, value in (("num_images", num_images), ("every_n_epochs", every_n_epochs), ("ncols", ncols)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not 0.0 <= discard_ratio < 1.0:
            raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if not 0.0 <= one_hot_threshold < uniform_threshold <= 1.0:
            raise ValueError(
                f"need 0 <= one_hot_threshold < uniform_threshold <= 1, got {one_hot_threshold}, {uniform_threshold}"
            )
        self.num_images, self.every_n_epochs, self.ncols = num_images, every_n_epochs, ncols
        self.explain_kwargs = dict(
            head_fusion=head_fusion,
            discard_ratio=discard_ratio,
            statistics=statistics,
            uniform_threshold=uniform_threshold,
            one_hot_threshold=one_hot_threshold,
        )
        self.panel_kwargs = dict(alpha=alpha, cmap=cmap, size=display_size)
        self.images: torch.Tensor | None = None  # (B, C, H, W) as the data gives them: uint8, or normalised float
        self.labels: torch.Tensor | None = None
        self.indices: list[int] = []
        self.class_names: list[str] | None = None
        self.mean: Sequence[float] | None = None
        self.std: Sequence[float] | None = None
        self.output_dir: Path | None = None
        self._last_epoch: int | None = None
        self._collapsed: set[int] = set()

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Check that the model's attention can be explained and fix the images (the data module is set up)."""
        if stage not in ("fit", "validate"):
            return
        attention_modules(explained_model(pl_module))  # a model without explainable attention fails here, clearly
        self.output_dir = Path(trainer.default_root_dir) / "rollout"
        self._last_epoch, self._collapsed = None, set()
        datamodule = trainer.datamodule
        if datamodule is None or not trainer.is_global_zero:
            return
        self.class_names = list(getattr(datamodule, "class_names", None) or []) or None
        self.mean, self.std = getattr(datamodule, "mean", None), getattr(datamodule, "std", None)
        dataset = getattr(datamodule, "val_dataset", None)
        if dataset is not None and self.images is None:
            self.fix_images(dataset)

    def fix_images(self, dataset: Any) -> None:
        """Choose and load the images to explain from a validation dataset of ``(image, label)`` items.

        Args:
            dataset: Map-style dataset of ``(C, H, W)`` tensors (uint8 pixels, or float normalised with the data
                module's ``mean`` and ``std``) and integer labels.

        Raises:
            ValueError: If the dataset is empty, its items are not ``(image tensor, label)``, or uint8 images come
                without a data module's ``mean`` and ``std``.
        """
        if len(dataset) == 0:
            raise ValueError("the validation dataset is empty: AttentionRolloutLogger has no image to explain")
        images, labels, indices = [], [], []
        for index in select_indices(_dataset_labels(dataset), len(dataset), self.num_images):
            item = dataset[index]
            if item is None:  # an unreadable file skipped by the dataset
                continue
            if not isinstance(item[0], torch.Tensor) or item[0].ndim != 3:
                raise ValueError(
                    f"validation item {index} is not a (C, H, W) tensor but {type(item[0]).__name__}; "
                    "AttentionRolloutLogger needs the model's input tensors"
                )
            images.append(item[0])
            labels.append(int(item[1]))
            indices.append(index)
        if not images:
            raise ValueError("none of the chosen validation images could be read")
        batch = torch.stack(images)
        if not batch.is_floating_point() and (self.mean is None or self.std is None):
            raise ValueError(
                f"the validation images are {batch.dtype}, and without a data module's mean and std "
                "AttentionRolloutLogger cannot normalise them; give the Trainer the data module"
            )
        self.images, self.labels, self.indices = batch, torch.tensor(labels), indices

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        epoch = trainer.current_epoch
        if (epoch + 1) % self.every_n_epochs != 0 or epoch == self._last_epoch:
            return
        self._last_epoch = epoch
        if self.images is None:  # no data module: take them from the validation loader
            loaders = trainer.val_dataloaders
            self.fix_images((loaders[0] if isinstance(loaders, (list, tuple)) else loaders).dataset)
        explanation = explain_images(
            explained_model(pl_module),
            self.images,
            labels=self.labels,
            class_names=self.class_names,
            mean=self.mean,
            std=self.std,
            **self.explain_kwargs,
        )
        metrics = explanation.metrics()
        if metrics:  # logged with the validation metrics, at their step, to every logger
            pl_module.log_dict(metrics, on_step=False, on_epoch=True, rank_zero_only=True)
        self._warn_collapse(epoch, explanation)
        # Lightning logs validation metrics at this step (the optimiser steps taken, less the one in progress).
        step = getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step)
        media = _warn_on_failure("attention rollout grid", epoch, lambda: self._render(explanation, epoch))
        if media is not None:
            _warn_on_failure("attention rollout PNGs", epoch, lambda: self._save(trainer, epoch, *media))
            _warn_on_failure("attention rollout to W&B", epoch, lambda: self._log(trainer, explanation, step, *media))

    def _render(self, explanation: Explanation, epoch: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The captioned grid and, with statistics, the distance plot, as ``uint8`` RGB arrays."""
        title = f"epoch {epoch} · attention rollout"
        grid = render_grid(explanation, ncols=self.ncols, title=title, **self.panel_kwargs)
        plot = None
        if explanation.distance is not None:
            plot = distance_plot(explanation.distance, f"epoch {epoch}", explanation.max_distance)
        return grid, plot

    def _save(self, trainer: Trainer, epoch: int, grid: np.ndarray, plot: np.ndarray | None) -> None:
        folder = self.output_dir if self.output_dir is not None else Path(trainer.default_root_dir) / "rollout"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(grid).save(folder / f"epoch_{epoch:03d}.png")
        if plot is not None:
            Image.fromarray(plot).save(folder / f"distance_epoch_{epoch:03d}.png")

    def _log(
        self, trainer: Trainer, explanation: Explanation, step: int, grid: np.ndarray, plot: np.ndarray | None
    ) -> None:
        if not loggers.log_images(trainer, GRID_KEY, [grid], step):  # no W&B logger: nothing more to render
            return
        panels = render_panels(explanation, **self.panel_kwargs)
        loggers.log_images(trainer, ROLLOUT_KEY, panels, step, captions=explanation.captions())
        if plot is not None:
            loggers.log_images(trainer, DISTANCE_KEY, [plot], step)

    def _warn_collapse(self, epoch: int, explanation: Explanation) -> None:
        """One warning naming the blocks that collapsed since the last check (a lasting collapse is warned about
        once; the ``attn/collapsed_blocks`` metric tracks it every epoch)."""
        collapsed = explanation.collapsed_blocks
        new = [i for i in collapsed if i not in self._collapsed]
        self._collapsed = set(collapsed)
        if not new:
            return
        lines = "\n".join(f"  block {i}: {explanation.collapse[i].describe()}" for i in new)
        hint = ""
        if any(bool(explanation.collapse[i].uniform.any()) for i in new):
            hint = " (near-uniform attention is normal in the first epochs of training from scratch)"
        rank_zero_warn(
            f"attention collapse at epoch {epoch} in block(s) {', '.join(map(str, new))}: every head is near-uniform "
            f"or near-one-hot over the {len(explanation)} fixed validation images{hint}\n{lines}"
        )


def _warn_on_failure(what: str, epoch: int, action: Callable[[], Any]) -> Any:
    """Run ``action``; a failure becomes a warning naming ``what`` and the epoch, and ``None`` is returned."""
    try:
        return action()
    except Exception as err:  # logging must never end a training run
        rank_zero_warn(f"could not log the {what} at epoch {epoch}: {type(err).__name__}: {err}; training continues")
        return None
