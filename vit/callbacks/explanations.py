"""AttentionRolloutLogger: where the model looks, and how its attention is organised, on fixed images while it trains.

The main grid is the project's default map, AttnLRP (Achtibat et al., "AttnLRP: Attention-Aware Layer-wise Relevance
Propagation for Transformers", ICML 2024; :data:`~vit.explain.DEFAULT_METHOD`, the most faithful map a plain install
has); beside it attention rollout (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020), entropy
and mean
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
from torch import nn

from .. import loggers
from ..atomic import write_bytes
from ..explain import (
    Explanation,
    HeadFusion,
    attention_modules,
    describe_collapse,
    distance_plot,
    explain_images,
    render_grid,
    render_panels,
)
from ..explain.attribution import attention_attribution
from ..explain.colors import is_signed
from ..explain.explorer import DEFAULT_MAX_BYTES, check_bits, write_explorer
from ..explain.faithfulness import faithfulness
from ..explain.methods import DEFAULT_METHOD, METHODS, explain_map, get_method, require_extras
from ..explain.panels import png_bytes
from ..explain.selection import fixed_images, select_indices
from ..normalize import normalize

__all__ = [
    "ATTRIBUTION_KEY",
    "DISTANCE_KEY",
    "EXPLORER_KEY",
    "GRID_KEY",
    "METHOD_GRID_KEY",
    "METHOD_KEY",
    "ROLLOUT_KEY",
    "AttentionRolloutLogger",
    "explained_model",
    "select_indices",
]

GRID_KEY = "val/attention_rollout_grid"
"""W&B key of the captioned grid of every explained image (the same picture as ``rollout/epoch_XXX.png``)."""
ROLLOUT_KEY = "val/attention_rollout"
"""W&B key of the per-image rollout panels."""
DISTANCE_KEY = "val/attention_distance"
"""W&B key of the plot of mean attention distance per head against depth."""
ATTRIBUTION_KEY = "val/attention_attribution"
"""W&B key of the per-image attribution panels (Chefer et al., ICCV 2021)."""
EXPLORER_KEY = "val/attention_explorer"
"""W&B key of the attention explorer (``wandb.Html``; the same file as ``rollout/explorer_epoch_XXX.html``)."""
METHOD_GRID_KEY = "val/explanation_grid"
"""W&B key of the main grid: the map of ``method`` (AttnLRP by default), the same picture as
``rollout/<method>_epoch_XXX.png``."""
METHOD_KEY = "val/explanation"
"""W&B key of the per-image panels of ``method``."""
EXPLORER_FILE = "explorer_epoch_{:03d}.html"
KEYS = {
    "rollout": (GRID_KEY, ROLLOUT_KEY),
    "attribution": ("val/attention_attribution_grid", ATTRIBUTION_KEY),
    "distance": (DISTANCE_KEY, ""),
}
"""W&B keys of each figure: (grid or plot, per-image panels)."""
FILES = {
    "rollout": "epoch_{:03d}.png",
    "attribution": "attribution_epoch_{:03d}.png",
    "distance": "distance_epoch_{:03d}.png",
}
"""File name of each figure in ``<default_root_dir>/rollout/``."""
TITLES = {"rollout": "attention rollout", "attribution": "attention attribution (predicted class)"}


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


def _final_validation(trainer: Trainer) -> bool:
    """Whether this validation sees the final model: the last epoch of a fit (``max_epochs``), a fit that is
    stopping (``max_time``, ``max_steps``, early stopping), or a run that only validates."""
    if trainer.state.fn != "fit" or trainer.should_stop or 0 <= trainer.max_steps <= trainer.global_step:
        return True
    return trainer.max_epochs is not None and 0 <= trainer.max_epochs <= trainer.current_epoch + 1


class AttentionRolloutLogger(Callback):
    """Explain a fixed set of validation images after every ``every_n_epochs``-th validation and the final model's.

    When fitting or validating starts, ``num_images`` validation images are fixed (:func:`select_indices`: the
    first image of distinct classes), kept as the data gives them (uint8 when the data module normalises on the
    device). After validation, on global rank zero, the validated network (``pl_module.eval_model``: the EMA weights
    when enabled) explains them with :func:`~vit.explain.explain_images` (one eval-mode, no-grad forward pass; the
    model is left as it was) and the result goes to:

    - ``<default_root_dir>/rollout/<method>_epoch_XXX.png``: the main grid, ``method``'s map of each image's
      predicted class (AttnLRP by default, :func:`~vit.explain.explain_map`), and in W&B ``val/explanation_grid``
      and the per-image panels ``val/explanation``;
    - ``<default_root_dir>/rollout/epoch_XXX.png``: the rollout grid (image | rollout overlay, colour bar,
      "true 3 · pred 7 (32 %)"), at every logged epoch, with or without W&B; the distance plot beside it
      (``distance_epoch_XXX.png``);
    - with ``attribution``, the same grid of the class-specific attention attribution of each image's predicted class
      (Chefer et al., ICCV 2021; :func:`~vit.explain.attention_attribution`): ``attribution_epoch_XXX.png``;
    - W&B, when a W&B logger is attached: the same grids (``val/attention_rollout_grid``,
      ``val/attention_attribution_grid``), the per-image panels (``val/attention_rollout``,
      ``val/attention_attribution``) and the distance plot (``val/attention_distance``);
    - every logger: ``attn/entropy/block_{i}`` (nats), ``attn/distance/block_{i}`` (pixels), means over heads, and
      ``attn/collapsed_blocks``; every ``faithfulness_every_n``-th logged epoch, the areas under the deletion and
      insertion curves (:func:`~vit.explain.faithfulness`) ``explain/deletion_auc/{rollout,attribution,random}``
      and ``explain/insertion_auc/...`` (lower deletion, higher insertion = more faithful);
    - with ``explorer``, the attention explorer of the fixed images (:func:`~vit.explain.explorer.write_explorer`: click
      a patch, see its attention in every block and head, the rollout and attribution overlays):
      ``explorer_epoch_XXX.html``, and in W&B as ``wandb.Html`` under ``val/attention_explorer``;
    - a warning naming the block and epoch when every head of a block becomes near-uniform or near-one-hot
      (:func:`~vit.explain.detect_collapse`; a freshly initialised ViT attends near-uniformly).

    Logging failures (disk full, a W&B error) become warnings; the run continues.

    Args:
        num_images: How many validation images to explain.
        every_n_epochs: Explain after the validation of every n-th epoch (epochs ``n - 1``, ``2n - 1``, ...), and
            also after a validation of the final model: in the last epoch (``max_epochs``), when the fit is stopping
            (``max_time``, ``max_steps``, early stopping; only if that epoch is validated), and in a run that only
            validates. Faithfulness scores follow the every-n-th epochs only.
        head_fusion: How a block's heads are fused in the rollout: ``mean``, ``max`` or ``min``.
        discard_ratio: Fraction in ``[0, 1)`` of the weakest patch-key attention entries dropped per block before
            rolling out (sharper maps for large models, e.g. 0.9).
        alpha: Opacity of the heatmap over the image, in ``[0, 1]``.
        cmap: Colour map of the unsigned maps (rollout, attribution; any matplotlib name, perceptually uniform
            ``inferno`` by default). Signed maps (AttnLRP, integrated gradients, ...) are always drawn on ``bwr``
            centred on zero (:mod:`vit.explain.colors`), every panel with a numbered colour bar.
        display_size: Side in pixels each image is upscaled to in the panels.
        ncols: Panels per row of the grid.
        statistics: Also log attention entropy, distance, the distance plot and collapse warnings.
        uniform_threshold: Normalised entropy at or above which a head counts as near-uniform.
        one_hot_threshold: Normalised entropy at or below which a head counts as near-one-hot.
        attribution: Also draw the attention attribution of the predicted class (one forward and backward pass).
        faithfulness_every_n: Score rollout, attribution and a random order by deletion/insertion every n-th logged
            epoch; 0 never. Costs ``2 · (faithfulness_steps + 1) · (2 + 5 random orders)`` forward passes of the
            fixed images.
        faithfulness_steps: Fractions of patches removed / revealed per curve.
        explorer: Also write the interactive attention explorer (one self-contained HTML file per logged epoch,
            about 60 kB per image for a 64-patch model) and log it to W&B.
        explorer_max_bytes: Size limit of that file: past it, the explorer holds the first images that fit, and
            says so on the page.
        explorer_bits: Bits per attention code in that file, 2 to 8, or ``"auto"``: the finest of 6 to 3 at which
            the images fit ``explorer_max_bytes`` (:func:`~vit.explain.write_explorer`).
        method: The main map, a name of :data:`~vit.explain.METHODS` (default: AttnLRP, the most faithful map a
            plain install has, measured in ``docs/results/faithfulness.json``); ``"rollout"`` or ``"attribution"``
            draws no further grid.
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
        attribution: bool = True,
        faithfulness_every_n: int = 5,
        faithfulness_steps: int = 10,
        explorer: bool = True,
        explorer_max_bytes: int = DEFAULT_MAX_BYTES,
        explorer_bits: int | str = "auto",
        method: str = DEFAULT_METHOD,
    ) -> None:
        super().__init__()
        require_extras(method)  # an unknown name or a missing extra fails here, before training
        self.method = get_method(method).name
        for name, value in (("num_images", num_images), ("every_n_epochs", every_n_epochs), ("ncols", ncols)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if faithfulness_every_n < 0 or faithfulness_steps < 1:
            raise ValueError(
                f"need faithfulness_every_n >= 0 and faithfulness_steps >= 1, got {faithfulness_every_n}, "
                f"{faithfulness_steps}"
            )
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
        self.attribution, self.faithfulness_every_n = attribution, faithfulness_every_n
        self.faithfulness_steps = faithfulness_steps
        check_bits(explorer_bits, auto=True, name="explorer_bits")
        self.explorer, self.explorer_max_bytes, self.explorer_bits = explorer, explorer_max_bytes, explorer_bits
        self.images: torch.Tensor | None = None  # (B, C, H, W) as the data gives them: uint8, or normalised float
        self.labels: torch.Tensor | None = None
        self.indices: list[int] = []
        self.class_names: list[str] | None = None
        self.mean: Sequence[float] | None = None
        self.std: Sequence[float] | None = None
        self.output_dir: Path | None = None
        self._last_epoch: int | None = None
        self._checkpoint_epoch: int | None = None  # the epoch a validated checkpoint was saved in
        self._collapsed: set[int] = set()

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Check that the model's attention can be explained and fix the images (the data module is set up)."""
        if stage not in ("fit", "validate"):
            return
        model = explained_model(pl_module)
        attention_modules(model)  # a model without explainable attention fails here, clearly
        get_method(self.method, model)  # and a main map that cannot read it
        self.output_dir = Path(trainer.default_root_dir) / "rollout"
        self._last_epoch, self._checkpoint_epoch, self._collapsed = None, None, set()
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
        batch, labels, indices = fixed_images(dataset, self.num_images)
        if not batch.is_floating_point() and (self.mean is None or self.std is None):
            raise ValueError(
                f"the validation images are {batch.dtype}, and without a data module's mean and std "
                "AttentionRolloutLogger cannot normalise them; give the Trainer the data module"
            )
        self.images, self.labels, self.indices = batch, labels, indices

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._checkpoint_epoch = checkpoint.get("epoch")

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        epoch = trainer.current_epoch
        regular = (epoch + 1) % self.every_n_epochs == 0
        if not (regular or _final_validation(trainer)) or epoch == self._last_epoch:
            return
        self._last_epoch = epoch
        if trainer.state.fn != "fit" and self._checkpoint_epoch is not None:
            epoch = self._checkpoint_epoch  # `vit validate --ckpt_path`: the pictures carry the checkpoint's epoch
        if self.images is None:  # no data module: take them from the validation loader
            loaders = trainer.val_dataloaders
            self.fix_images((loaders[0] if isinstance(loaders, (list, tuple)) else loaders).dataset)
        model = explained_model(pl_module)
        explanation = explain_images(
            model,
            self.images,
            labels=self.labels,
            class_names=self.class_names,
            mean=self.mean,
            std=self.std,
            **self.explain_kwargs,
        )
        metrics = explanation.metrics()
        maps = {"rollout": explanation.rollout}
        logged = (epoch + 1) // self.every_n_epochs  # this is the n-th logged epoch
        score = regular and self.faithfulness_every_n > 0 and logged % self.faithfulness_every_n == 0
        if self.attribution or score:
            attribution = _warn_on_failure("attention attribution", epoch, lambda: self._attribute(model))
            if attribution is None:  # a model the rule cannot read: warned once, rollout goes on alone
                self.attribution = False
            else:
                maps["attribution"] = attribution
        if self.method not in maps and self.method != "attribution":
            main_map = _warn_on_failure(f"{self.method} maps", epoch, lambda: self._explain_method(model))
            if main_map is None:  # warned once; rollout and attribution go on
                self.method = "rollout"
            else:
                maps = {self.method: main_map, **maps}  # first: the main grid
        scores = None
        if score:
            scores = _warn_on_failure("faithfulness scores", epoch, lambda: self._faithfulness(model, maps))
            for curve in ("deletion_auc", "insertion_auc") if scores is not None else ():
                metrics.update({f"explain/{curve}/{name}": value for name, value in scores[curve].items()})
        if metrics:  # logged with the validation metrics, at their step, to every logger
            pl_module.log_dict(metrics, on_step=False, on_epoch=True, rank_zero_only=True)
        self._warn_collapse(epoch, explanation)
        if not self.attribution:
            maps.pop("attribution", None)
        # Lightning logs validation metrics at this step (the optimiser steps taken, less the one in progress).
        step = getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step)
        figures = _warn_on_failure("explanation grids", epoch, lambda: self._render(explanation, maps, epoch))
        if figures is not None:
            _warn_on_failure("explanation PNGs", epoch, lambda: self._save(trainer, epoch, figures))
            _warn_on_failure("explanations to W&B", epoch, lambda: self._log(trainer, explanation, maps, step, figures))
        if self.explorer:
            _warn_on_failure(
                "attention explorer", epoch, lambda: self._explore(trainer, model, maps, scores, epoch, step)
            )

    def _inputs(self, model: nn.Module) -> torch.Tensor:
        """The fixed images normalised for the model, on its device (uint8 images are normalised here, once)."""
        param = next(model.parameters())
        images = self.images.to(param.device)
        return (images if images.is_floating_point() else normalize(images, self.mean, self.std)).to(param.dtype)

    def _attribute(self, model: nn.Module) -> torch.Tensor:
        """Attention attribution of each image's predicted class; gradients need leaving the validation loop's
        inference mode (the model and its parameters are untouched: no ``.grad`` is written)."""
        with torch.inference_mode(False), torch.enable_grad():
            return attention_attribution(model, self._inputs(model)).float().cpu()

    def _explain_method(self, model: nn.Module) -> torch.Tensor:
        """``method``'s patch maps of each image's predicted class, outside the validation loop's inference mode
        (the registry's methods leave the model as it was: no ``.grad``, no hooks)."""
        with torch.inference_mode(False), torch.enable_grad():
            return explain_map(model, self._inputs(model), self.method).patches.float().cpu()

    def _faithfulness(self, model: nn.Module, maps: dict[str, torch.Tensor]) -> dict[str, Any]:
        return faithfulness(model, self._inputs(model), maps, steps=self.faithfulness_steps)

    def _render(self, explanation: Explanation, maps: dict[str, torch.Tensor], epoch: int) -> dict[str, np.ndarray]:
        """A captioned grid per map and, with statistics, the distance plot, as ``uint8`` RGB arrays."""
        figures = {
            name: render_grid(
                explanation,
                grid_map,
                self.ncols,
                title=f"epoch {epoch} · {_title(name)}",
                signed=is_signed(name),
                **self.panel_kwargs,
            )
            for name, grid_map in maps.items()
        }
        if explanation.distance is not None:
            figures["distance"] = distance_plot(explanation.distance, f"epoch {epoch}", explanation.max_distance)
        return figures

    def _save(self, trainer: Trainer, epoch: int, figures: dict[str, np.ndarray]) -> None:
        folder = self.output_dir if self.output_dir is not None else Path(trainer.default_root_dir) / "rollout"
        for name, figure in figures.items():
            write_bytes(folder / FILES.get(name, f"{name}_epoch_{{:03d}}.png").format(epoch), png_bytes(figure))

    def _log(
        self,
        trainer: Trainer,
        explanation: Explanation,
        maps: dict[str, torch.Tensor],
        step: int,
        figures: dict[str, np.ndarray],
    ) -> None:
        for name, figure in figures.items():
            grid_key, panel_key = KEYS.get(name, (METHOD_GRID_KEY, METHOD_KEY))
            if not loggers.log_images(trainer, grid_key, [figure], step):  # no W&B logger: nothing more to render
                return
            if name in maps:
                panels = render_panels(explanation, maps[name], signed=is_signed(name), **self.panel_kwargs)
                loggers.log_images(trainer, panel_key, panels, step, captions=explanation.captions())

    def _explore(
        self,
        trainer: Trainer,
        model: nn.Module,
        maps: dict[str, torch.Tensor],
        scores: dict[str, Any] | None,
        epoch: int,
        step: int,
    ) -> None:
        """Write the explorer of the fixed images into the run folder and log that file to W&B."""
        folder = self.output_dir if self.output_dir is not None else Path(trainer.default_root_dir) / "rollout"
        total = len(self.images)

        def subset_note(count: int) -> str:  # too many images for one file: the first ones that fit
            return f"The first {count} of the {total} explained images (all would pass the size limit)."

        path = write_explorer(
            folder / EXPLORER_FILE.format(epoch), model, self.images, mean=self.mean, std=self.std,
            labels=self.labels, class_names=self.class_names,
            names=[f"validation image {i}" for i in self.indices] if self.indices else None, maps=maps,
            attribution=False, faithfulness=scores, title=f"epoch {epoch}: attention of the validation images",
            max_bytes=self.explorer_max_bytes, bits=self.explorer_bits,
            subset_note=subset_note,
        )  # fmt: skip
        for logger in loggers.wandb_loggers(trainer):
            import wandb  # with a W&B logger attached, wandb is importable

            logger.log_metrics({EXPLORER_KEY: wandb.Html(str(path), inject=False)}, step=step)

    def _warn_collapse(self, epoch: int, explanation: Explanation) -> None:
        """Warn about the blocks that collapsed since the last check (a lasting collapse is warned about once; the
        ``attn/collapsed_blocks`` metric tracks it every epoch)."""
        new = {i: explanation.collapse[i] for i in explanation.collapsed_blocks if i not in self._collapsed}
        self._collapsed = set(explanation.collapsed_blocks)
        if new:
            rank_zero_warn(f"attention collapse at epoch {epoch} in {describe_collapse(new, len(explanation))}")


def _title(name: str) -> str:
    if name in TITLES:
        return TITLES[name]
    method = METHODS[name]
    return f"{method.summary}{' of the predicted class' if method.class_specific else ''}"


def _warn_on_failure(what: str, epoch: int, action: Callable[[], Any]) -> Any:
    """Run ``action``; a failure becomes a warning naming ``what`` and the epoch, and ``None`` is returned."""
    try:
        return action()
    except Exception as err:  # logging must never end a training run
        rank_zero_warn(f"could not log the {what} at epoch {epoch}: {type(err).__name__}: {err}; training continues")
        return None
