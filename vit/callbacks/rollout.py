"""Lightning callbacks: attention rollout and attention statistics while training, and what a run costs.

- :class:`AttentionRolloutLogger` explains a fixed set of validation images after validation: attention rollout
  overlays (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020), entropy and mean attention
  distance per block (Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021, Fig. 7) and a warning when
  a block's attention collapses. Images go to W&B when a :class:`~lightning.pytorch.loggers.WandbLogger` is
  attached, otherwise to PNG files in the run's folder.
- :class:`RunSummary` records the parameter count, forward FLOPs per image and training throughput.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from PIL import Image
from torch import nn

from ..explain import (
    CollapseReport,
    HeadFusion,
    attention_modules,
    attention_rollout,
    attention_statistics,
    capture_attention,
    detect_collapse,
    make_grid,
    overlay_heatmap,
)
from ..normalize import normalize, unnormalize

ROLLOUT_KEY = "val/attention_rollout"
"""W&B key of the rollout panel (one image per explained validation image)."""
DISTANCE_KEY = "val/attention_distance"
"""W&B key of the plot of mean attention distance per head against depth."""


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Put every module of ``model`` in eval mode, and give each its own ``training`` flag back afterwards."""
    flags = {module: module.training for module in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for module, flag in flags.items():
            module.training = flag


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


def figure_to_array(figure: Any) -> np.ndarray:
    """Render a matplotlib ``Figure`` with the Agg canvas to a ``uint8`` RGB array ``(H, W, 3)``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[:, :, :3].copy()


def distance_plot(distance: torch.Tensor, title: str = "", max_distance: float | None = None) -> np.ndarray:
    """Mean attention distance of every head against depth (ViT paper, Fig. 7) as a ``uint8`` RGB image.

    Args:
        distance: ``(blocks, heads)`` distances in pixels, from :func:`~vit.explain.attention_statistics`.
        title: Figure title.
        max_distance: Upper end of the y axis (e.g. the image diagonal); ``None`` lets matplotlib choose.
    """
    from matplotlib.figure import Figure

    distance = distance.detach().float().cpu()
    blocks, heads = distance.shape
    depth = torch.arange(blocks)
    figure = Figure(figsize=(5.0, 3.5), dpi=100)
    ax = figure.add_subplot()
    for head in range(heads):
        ax.scatter(depth, distance[:, head], s=14, alpha=0.8, label=f"head {head}" if heads <= 12 else None)
    ax.plot(depth, distance.mean(dim=1), color="black", linewidth=1, label="mean")
    ax.set_xlabel("block")
    ax.set_ylabel("mean attention distance (px)")
    ax.set_xticks(depth.tolist())
    ax.set_ylim(0, max_distance if max_distance else None)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2, loc="lower right")
    figure.tight_layout()
    return figure_to_array(figure)


class AttentionRolloutLogger(Callback):
    """Show where the model looks, and how its attention is organised, on fixed validation images while it trains.

    When fitting or validating starts, ``num_images`` validation images are fixed (:func:`select_indices`: the
    first image of distinct classes). After the validation of every ``every_n_epochs``-th epoch, on global rank
    zero, the validated network (``pl_module.eval_model``: the EMA weights when enabled, else ``pl_module.model``)
    explains them in eval mode under ``torch.no_grad`` (the model is left as it was, training graph untouched):

    - a rollout overlay per image, captioned with the true class, the predicted class and its probability, logged
      as one W&B image panel ``val/attention_rollout``; without a W&B logger as one PNG grid
      ``<log_dir>/rollout/epoch_XXX.png``;
    - metrics ``attn/entropy/block_{i}`` (nats) and ``attn/distance/block_{i}`` (pixels), means over heads;
    - a plot of mean attention distance per head against depth: W&B ``val/attention_distance`` or
      ``<log_dir>/rollout/distance_epoch_XXX.png``;
    - a warning naming the block and epoch when every head of a block is near-uniform or near-one-hot over the
      fixed images (:func:`~vit.explain.detect_collapse`; a freshly initialised ViT attends near-uniformly).

    Logging failures (disk full, a W&B error) become warnings; the run continues. The forward passes run on rank
    zero only, on the unwrapped network, so DDP ranks never wait on each other here (not for sharded strategies).

    Args:
        num_images: How many validation images to explain.
        every_n_epochs: Explain after the validation of every n-th epoch (epochs ``n - 1``, ``2n - 1``, ...).
        head_fusion: How a block's heads are fused in the rollout: ``mean``, ``max`` or ``min``.
        discard_ratio: Fraction in ``[0, 1)`` of the weakest patch-key attention entries dropped per block before
            rolling out (sharper maps for large models, e.g. 0.9).
        alpha: Opacity of the heatmap over the image, in ``[0, 1]``.
        cmap: Colormap of the heatmap (``jet`` built in, any matplotlib name).
        display_size: Images smaller than this (pixels) are upscaled for display, so that maps and captions stay
            readable; 0 keeps the input size.
        ncols: Images per row of the PNG grid.
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
        alpha: float = 0.5,
        cmap: str = "jet",
        display_size: int = 128,
        ncols: int = 4,
        statistics: bool = True,
        uniform_threshold: float = 0.98,
        one_hot_threshold: float = 0.05,
    ) -> None:
        super().__init__()
        for name, value, low in (
            ("num_images", num_images, 1),
            ("every_n_epochs", every_n_epochs, 1),
            ("ncols", ncols, 1),
        ):
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if not 0.0 <= discard_ratio < 1.0:
            raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if not 0.0 <= one_hot_threshold < uniform_threshold <= 1.0:
            raise ValueError(
                f"need 0 <= one_hot_threshold < uniform_threshold <= 1, got {one_hot_threshold}, {uniform_threshold}"
            )
        self.num_images = num_images
        self.every_n_epochs = every_n_epochs
        self.head_fusion = head_fusion
        self.discard_ratio = discard_ratio
        self.alpha = alpha
        self.cmap = cmap
        self.display_size = display_size
        self.ncols = ncols
        self.statistics = statistics
        self.uniform_threshold = uniform_threshold
        self.one_hot_threshold = one_hot_threshold
        self.images: torch.Tensor | None = None  # (B, C, H, W) normalised, on the CPU
        self.labels: torch.Tensor | None = None
        self.indices: list[int] = []
        self.class_names: list[str] | None = None
        self.mean: Sequence[float] | None = None
        self.std: Sequence[float] | None = None
        self.output_dir: Path | None = None
        self._last_epoch: int | None = None
        self._collapsed: set[int] = set()

    # ------------------------------------------------------------------------------------------------ set-up
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Check that the model's attention can be explained and fix the images (the data module is set up)."""
        if stage not in ("fit", "validate"):
            return
        attention_modules(explained_model(pl_module))  # a model without explainable attention fails here, clearly
        # On every rank: log_dir broadcasts, so it must not be asked for on rank zero alone later.
        self.output_dir = Path(trainer.log_dir or trainer.default_root_dir) / "rollout"
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
            dataset: Map-style dataset returning ``(C, H, W)`` tensors, normalised or uint8 (then normalised with
                the data module's ``mean`` and ``std``), and integer labels.

        Raises:
            ValueError: If the dataset is empty or its items are not ``(image tensor, label)``.
        """
        if len(dataset) == 0:
            raise ValueError("the validation dataset is empty: AttentionRolloutLogger has no image to explain")
        images, labels, indices = [], [], []
        for index in select_indices(_dataset_labels(dataset), len(dataset), self.num_images):
            item = dataset[index]
            if item is None:  # an unreadable file skipped by the dataset
                continue
            image, label = item[0], item[1]
            if not isinstance(image, torch.Tensor) or image.ndim != 3:
                raise ValueError(
                    f"validation item {index} is not a (C, H, W) tensor but {type(image).__name__}; "
                    "AttentionRolloutLogger needs the model's input tensors"
                )
            images.append(image)
            labels.append(int(label))
            indices.append(index)
        if not images:
            raise ValueError("none of the chosen validation images could be read")
        batch = torch.stack(images)
        if not batch.is_floating_point():  # ImageDataModule(normalize_on_device=True) items are uint8
            if self.mean is None or self.std is None:
                raise ValueError(
                    f"the validation images are {batch.dtype}, and without a data module's mean and std "
                    "AttentionRolloutLogger cannot normalise them; give the Trainer the data module"
                )
            batch = normalize(batch, self.mean, self.std)
        self.images, self.labels, self.indices = batch, torch.tensor(labels), indices

    # --------------------------------------------------------------------------------------------- each epoch
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        epoch = trainer.current_epoch
        if (epoch + 1) % self.every_n_epochs != 0 or epoch == self._last_epoch:
            return
        self._last_epoch = epoch
        if self.images is None:  # no data module: take them from the validation loader
            loaders = trainer.val_dataloaders
            loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
            self.fix_images(loader.dataset)
        result = self.explain(explained_model(pl_module), epoch)
        if result["metrics"]:  # logged with the validation metrics, at their step, to every logger
            pl_module.log_dict(result["metrics"], on_step=False, on_epoch=True, rank_zero_only=True)
        self._log_media(trainer, epoch, result)

    def explain(self, model: nn.Module, epoch: int) -> dict[str, Any]:
        """Explain the fixed images with the model's current weights; warn about collapsed blocks.

        Args:
            model: The network (a :class:`~vit.VisionTransformer`).
            epoch: Epoch named in warnings and titles.

        Returns:
            ``{"overlays": [uint8 (H, W, 3)], "captions": [str], "metrics": {name: value},
            "distance": (blocks, heads) tensor or None, "max_distance": image diagonal in pixels,
            "collapsed": [block index]}``.
        """
        param = next(model.parameters())
        images = self.images.to(device=param.device, dtype=param.dtype)
        with torch.no_grad(), _eval_mode(model):
            probs = model(images).float().softmax(dim=-1).cpu()
        attentions = capture_attention(model, images)  # eval, no_grad, model restored afterwards
        pool = "token" if getattr(model, "has_class_token", True) else "avg"
        relevance = (
            attention_rollout(attentions, model.num_prefix_tokens, self.head_fusion, self.discard_ratio, pool=pool)
            .float()
            .cpu()
        )
        rows, cols = model.patch_embed.grid_size
        maps = relevance.reshape(-1, rows, cols)

        confidence, predicted = probs.max(dim=-1)
        display = self._display_images()
        overlays = [overlay_heatmap(img, m, self.alpha, self.cmap) for img, m in zip(display, maps, strict=True)]
        true_names = [self._class_name(i) for i in self.labels.tolist()]
        pred_names = [self._class_name(i) for i in predicted.tolist()]
        captions = [
            f"true: {t} | pred: {p} ({c:.0%})"
            for t, p, c in zip(true_names, pred_names, confidence.tolist(), strict=True)
        ]
        result: dict[str, Any] = {"overlays": overlays, "captions": captions, "metrics": {}, "distance": None}
        result["collapsed"], result["max_distance"] = [], float(np.hypot(*images.shape[-2:]))
        if self.statistics:
            stats = attention_statistics(
                attentions, model.patch_embed.grid_size, model.patch_embed.patch_size, model.num_prefix_tokens
            )
            for i, (entropy, distance) in enumerate(
                zip(stats["mean_entropy"].tolist(), stats["mean_distance"].tolist(), strict=True)
            ):
                result["metrics"][f"attn/entropy/block_{i}"] = entropy
                result["metrics"][f"attn/distance/block_{i}"] = distance
            result["distance"] = stats["distance"].cpu()
            reports = {}
            for i, attn in enumerate(attentions):
                report = detect_collapse(
                    attn, uniform_threshold=self.uniform_threshold, one_hot_threshold=self.one_hot_threshold
                )
                if report:
                    reports[i] = report
            result["collapsed"] = sorted(reports)
            self._warn_collapse(epoch, reports, len(images))
            result["metrics"]["attn/collapsed_blocks"] = float(len(result["collapsed"]))
        return result

    # ---------------------------------------------------------------------------------------------- helpers
    def _warn_collapse(self, epoch: int, reports: dict[int, CollapseReport], num_images: int) -> None:
        """One warning naming the blocks that collapsed since the last check (a lasting collapse is warned about
        once; the ``attn/collapsed_blocks`` metric tracks it every epoch)."""
        new = {i: report for i, report in reports.items() if i not in self._collapsed}
        self._collapsed = set(reports)
        if not new:
            return
        lines = "\n".join(f"  block {i}: {report.describe()}" for i, report in new.items())
        hint = ""
        if any(bool(report.uniform.any()) for report in new.values()):
            hint = " (near-uniform attention is normal in the first epochs of training from scratch)"
        rank_zero_warn(
            f"attention collapse at epoch {epoch} in block(s) {', '.join(map(str, new))}: every head is near-uniform "
            f"or near-one-hot over the {num_images} fixed validation images{hint}\n{lines}"
        )

    def _class_name(self, label: int) -> str:
        if self.class_names is not None and 0 <= label < len(self.class_names):
            return str(self.class_names[label])
        return str(label)

    def _display_images(self) -> torch.Tensor:
        images = self.images.float()
        if self.mean is not None and self.std is not None:
            images = unnormalize(images, self.mean, self.std)
        else:  # unknown normalisation: stretch each image to [0, 1]
            low = images.amin(dim=(1, 2, 3), keepdim=True)
            high = images.amax(dim=(1, 2, 3), keepdim=True)
            images = (images - low) / (high - low).clamp_min(1e-12)
        height, width = images.shape[-2:]
        if self.display_size and min(height, width) < self.display_size:
            scale = self.display_size / min(height, width)
            size = (round(height * scale), round(width * scale))
            images = F.interpolate(images, size=size, mode="bilinear", align_corners=False)
        return images.clamp(0.0, 1.0)

    def _log_media(self, trainer: Trainer, epoch: int, result: dict[str, Any]) -> None:
        # Lightning logs validation metrics at this step (the optimiser steps taken, less the one in progress).
        step = getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step)
        wandb_loggers = [logger for logger in trainer.loggers if isinstance(logger, WandbLogger)]
        plot = None
        if result["distance"] is not None:
            plot = _warn_on_failure(
                "attention distance plot",
                epoch,
                lambda: distance_plot(result["distance"], f"epoch {epoch}", result["max_distance"]),
            )
        if wandb_loggers:
            for logger in wandb_loggers:
                _warn_on_failure(
                    "attention rollout to W&B",
                    epoch,
                    lambda logger=logger: self._log_wandb(logger, result, plot, step),
                )
        else:
            _warn_on_failure("attention rollout PNGs", epoch, lambda: self._write_pngs(epoch, result, plot))

    @staticmethod
    def _log_wandb(logger: WandbLogger, result: dict[str, Any], plot: np.ndarray | None, step: int) -> None:
        logger.log_image(key=ROLLOUT_KEY, images=list(result["overlays"]), step=step, caption=result["captions"])
        if plot is not None:
            logger.log_image(key=DISTANCE_KEY, images=[plot], step=step)

    def _write_pngs(self, epoch: int, result: dict[str, Any], plot: np.ndarray | None) -> list[Path]:
        folder = self.output_dir if self.output_dir is not None else Path("rollout")
        folder.mkdir(parents=True, exist_ok=True)
        captions = [caption.replace(" | ", "\n") for caption in result["captions"]]
        grid = make_grid(result["overlays"], ncols=self.ncols, captions=captions)
        paths = [folder / f"epoch_{epoch:03d}.png"]
        Image.fromarray(grid).save(paths[0])
        if plot is not None:
            paths.append(folder / f"distance_epoch_{epoch:03d}.png")
            Image.fromarray(plot).save(paths[1])
        return paths


def _warn_on_failure(what: str, epoch: int, action: Callable[[], Any]) -> Any:
    """Run ``action``; a failure becomes a warning naming ``what`` and the epoch, and ``None`` is returned."""
    try:
        return action()
    except Exception as err:  # logging must never end a training run
        rank_zero_warn(f"could not log the {what} at epoch {epoch}: {type(err).__name__}: {err}; training continues")
        return None
