"""ExplanationLogger: where the model looks, and how its attention is organised, on fixed images while it trains.

The main map is the project's default, AttnLRP (Achtibat et al., "AttnLRP: Attention-Aware Layer-wise Relevance
Propagation for Transformers", ICML 2024; :data:`~vit.explain.DEFAULT_METHOD`, the most faithful map a plain install
has); beside it attention rollout (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020), entropy
and mean attention distance per block (Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021, Fig. 7) and a
warning when a block's attention collapses. The callback decides *when* and *which images*;
:func:`~vit.explain.explain` computes *what*, and :class:`~vit.callbacks.explanation_sink.ExplanationSink` draws it
into the run folder and W&B.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import nn

from .. import loggers
from ..atomic import write_bytes
from ..explain.capture import attention_modules
from ..explain.choice import StaleChoice, read_choice
from ..explain.explanation import Explanation
from ..explain.methods import DEFAULT_METHOD, applicable_methods, get_method, require_extras
from ..explain.mistakes import collect_mistakes
from ..explain.pipeline import explain
from ..explain.render.explorer import DEFAULT_MAX_BYTES
from ..explain.render.explorer_codes import check_bits
from ..explain.render.images import png_bytes
from ..explain.render.mistakes import mistakes_table, render_mistakes
from ..explain.rollout import HeadFusion
from ..explain.selection import fixed_images, select_indices
from ..explain.stats import describe_collapse
from .explanation_sink import DISTANCE_KEY, ROLLOUT_KEY, ExplanationSink, warn_on_failure

MISTAKES_KEY = "val/mistakes"
"""W&B key of the picture of the most confident mistakes (``rollout/mistakes_epoch_XXX.png``)."""
MISTAKES_TABLE_KEY = "val/mistakes_table"
"""W&B key of the table of the most confident mistakes: image, true and predicted class, confidence, both maps."""

__all__ = ["DISTANCE_KEY", "ROLLOUT_KEY", "AttentionRolloutLogger", "ExplanationLogger", "explained_model",
           "logged_step", "select_indices"]  # fmt: skip


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
            f"{type(pl_module).__name__} has no `model` (nor `eval_model`) network: ExplanationLogger explains "
            "pl_module.model, a vit.VisionTransformer"
        )
    return model


def _final_validation(trainer: Trainer) -> bool:
    """Whether this validation sees the final model: the last epoch of a fit (``max_epochs``), a fit that is
    stopping (``max_time``, ``max_steps``, early stopping), or a run that only validates."""
    if trainer.state.fn != "fit" or trainer.should_stop or 0 <= trainer.max_steps <= trainer.global_step:
        return True
    return trainer.max_epochs is not None and 0 <= trainer.max_epochs <= trainer.current_epoch + 1


class ExplanationLogger(Callback):
    """Explain a fixed set of validation images after every ``every_n_epochs``-th validation and the final model's.

    When fitting or validating starts, ``num_images`` validation images are fixed (:func:`select_indices`: the
    first image of distinct classes), kept as the data gives them (uint8 when the data module normalises on the
    device). After validation, on global rank zero, the validated network (``pl_module.eval_model``: the EMA weights
    when enabled) explains them with :func:`~vit.explain.explain` (the model is left as it was) and
    :class:`~vit.callbacks.explanation_sink.ExplanationSink` puts the result in:

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
      and ``explain/insertion_auc/...`` (lower deletion, higher insertion = more faithful), and the symmetric
      relevance gain ``explain/srg/...`` (least-relevant-first area minus deletion area, higher is better);
    - with ``explorer``, the attention explorer of the fixed images (:mod:`vit.explain.render.explorer`: click a
      patch, see its attention in every block and head, the rollout and attribution overlays):
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
            about 60 kB per image for a 64-patch model) and log it to W&B; not for a model rollout cannot explain
            (a distilled model: its grids then hold the maps that apply).
        explorer_max_bytes: Size limit of that file: past it, the explorer holds the first images that fit, and
            says so on the page.
        explorer_bits: Bits per attention code in that file, 2 to 8, or ``"auto"``: the finest of 6 to 3 at which
            the images fit ``explorer_max_bytes`` (:func:`~vit.explain.write_explorer`).
        method: The main map, a name of :data:`~vit.explain.METHODS`. Default: the method ``vit explain --tune``
            chose for the checkpoint the run resumes or validates (``<checkpoint>.explain.json``,
            :mod:`vit.explain.choice`, with its options), else AttnLRP, the most faithful map a plain install has,
            measured in ``docs/results/faithfulness.json``; ``"rollout"`` or ``"attribution"`` draws no further grid.
        method_options: Options per method, as :func:`~vit.explain.explain` takes them, e.g. the gamma rule that
            ``vit explain --tune`` chose for this model: ``{"attnlrp": {"gamma": 0.05, "embed_gamma": 0}}`` (they
            win over stored ones).
        mistakes: At the final validation, the most confident errors over the validated batches, each with the
            main map of the predicted and of the true class (:func:`~vit.explain.mistakes.collect_mistakes`):
            ``rollout/mistakes_epoch_XXX.png``, and in W&B ``val/mistakes`` (the picture) and
            ``val/mistakes_table`` (image, true and predicted class, confidence, both maps); 0: none.
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
        method: str | None = None,
        method_options: dict[str, dict[str, Any]] | None = None,
        mistakes: int = 16,
    ) -> None:
        super().__init__()
        require_extras(method or DEFAULT_METHOD)  # an unknown name or a missing extra fails here, before training
        self.method, self.method_named = get_method(method or DEFAULT_METHOD).name, method is not None
        if mistakes < 0:
            raise ValueError(f"mistakes must be >= 0, got {mistakes}")
        self.mistakes = mistakes
        for name in method_options or {}:
            get_method(name)  # an unknown method's options fail here, before training
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
            options={name: dict(value) for name, value in (method_options or {}).items()},
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
                "ExplanationLogger cannot normalise them; give the Trainer the data module"
            )
        self.images, self.labels, self.indices = batch, labels, indices

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._checkpoint_epoch = checkpoint.get("epoch")
        if not self.method_named and trainer.ckpt_path:
            self.use_stored_choice(trainer.ckpt_path)

    def use_stored_choice(self, checkpoint: str | Path) -> None:
        """Draw the method ``vit explain --tune`` stored beside ``checkpoint`` (with its options, unless
        ``method_options`` name the method), saying so; a stale or missing choice keeps the default."""
        try:
            choice = read_choice(checkpoint)
        except StaleChoice as err:
            rank_zero_info(f"ExplanationLogger: {err}")
            return
        if choice is not None:
            self.method = choice.method
            for name, value in choice.method_options().items():
                self.explain_kwargs["options"].setdefault(name, dict(value))
            rank_zero_info(f"ExplanationLogger draws {choice.describe()} (stored beside {Path(checkpoint).name})")

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
        logged = (epoch + 1) // self.every_n_epochs  # this is the n-th logged epoch
        score = regular and self.faithfulness_every_n > 0 and logged % self.faithfulness_every_n == 0
        explanation = self._explain(model, epoch, score)
        metrics = explanation.metrics()
        scores = explanation.faithfulness
        for curve in ("deletion_auc", "insertion_auc", "srg") if scores is not None else ():
            metrics.update({f"explain/{curve}/{name}": value for name, value in scores[curve].items()})
        if metrics:  # logged with the validation metrics, at their step, to every logger
            pl_module.log_dict(metrics, on_step=False, on_epoch=True, rank_zero_only=True)
        self._warn_collapse(epoch, explanation)
        if not self.attribution:  # scored, not drawn
            explanation.maps.pop("attribution", None)
        names = [f"validation image {i}" for i in self.indices] if self.indices else None
        explorer = dict(model=model, images=self.images, names=names, mean=self.mean, std=self.std)
        explore = self.explorer and "rollout" in explanation.maps  # the explorer is built on the rollout
        self.sink(trainer).write(trainer, explanation, epoch=epoch, step=logged_step(trainer),
                                 explorer=explorer if explore else None)  # fmt: skip
        if self.mistakes and _final_validation(trainer):
            warn_on_failure("most confident mistakes", epoch, lambda: self.log_mistakes(trainer, model, epoch))

    def log_mistakes(self, trainer: Trainer, model: nn.Module, epoch: int) -> None:
        """The most confident errors over the batches this validation ran (``limit_val_batches`` and
        ``fast_dev_run`` hold; :func:`~vit.explain.mistakes.collect_mistakes`): their picture in the run folder and
        W&B, and a W&B table with both maps per mistake."""
        loaders = trainer.val_dataloaders
        loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        limit = trainer.num_val_batches[0] if trainer.num_val_batches else float("inf")
        batches = loader if limit == float("inf") else itertools.islice(loader, int(limit))  # the batches validated
        options = self.explain_kwargs["options"].get(self.method)
        found = collect_mistakes(model, batches, num=self.mistakes, mean=self.mean, std=self.std, method=self.method,
                                 options=options, class_names=self.class_names)  # fmt: skip
        picture = render_mistakes(found, alpha=self.panel_kwargs["alpha"])
        if picture is None:
            return
        folder = self.output_dir if self.output_dir is not None else Path(trainer.default_root_dir) / "rollout"
        write_bytes(folder / f"mistakes_epoch_{epoch:03d}.png", png_bytes(picture))
        step = logged_step(trainer)
        if loggers.log_images(trainer, MISTAKES_KEY, [picture], step, captions=[f"epoch {epoch}"]):
            columns, rows = mistakes_table(found)
            for logger in loggers.wandb_loggers(trainer):
                import wandb  # with a W&B logger attached, wandb is importable

                data = [[wandb.Image(v) if isinstance(v, np.ndarray) else v for v in row] for row in rows]
                logger.log_table(key=MISTAKES_TABLE_KEY, columns=columns, data=data, step=step)

    def _methods(self, model: nn.Module, score: bool) -> list[str]:
        """The maps to compute: the main one first, then rollout, then the attribution (drawn, or only scored); those
        that cannot explain ``model`` (the attention maps of a distilled model's two heads) are left out; the main map
        was checked against the model in :meth:`setup`."""
        names = [self.method, "rollout"] + (["attribution"] if self.attribution or score else [])
        usable = set(applicable_methods(model))
        return [name for name in dict.fromkeys(names) if get_method(name).name in usable]

    def _explain(self, model: nn.Module, epoch: int, score: bool) -> Explanation:
        """:func:`~vit.explain.explain` of the fixed images; a map that fails is warned about once and left out
        from then on (the main map falls back to rollout), and the others are computed without it."""
        options = dict(mean=self.mean, std=self.std, labels=self.labels, class_names=self.class_names, block=None,
                       batch_size=len(self.images), **self.explain_kwargs)  # fmt: skip
        methods = self._methods(model, score)
        while True:
            try:
                return explain(model, self.images, methods, faithfulness=score, steps=self.faithfulness_steps,
                               **options)  # fmt: skip
            except Exception as err:  # one failing map must not take the others, or training, with it
                failed = self._failing(model, methods)
                if failed is None or failed == "rollout":
                    raise
                what = "attention attribution" if failed == "attribution" else f"{failed} maps"
                rank_zero_warn(f"could not log the {what} at epoch {epoch}: {type(err).__name__}: {err}; training "
                               "continues")  # fmt: skip
                if failed == "attribution":
                    self.attribution = False
                else:
                    self.method = "rollout"
                methods = [name for name in methods if name != failed]

    def _failing(self, model: nn.Module, methods: Sequence[str]) -> str | None:
        """The first of ``methods`` that fails on one image, or ``None``."""
        for name in methods:
            try:
                explain(model, self.images[:1], [name], mean=self.mean, std=self.std, statistics=False, block=None)
            except Exception:
                return name
        return None

    def sink(self, trainer: Trainer) -> ExplanationSink:
        """Where the pictures go: the run's ``rollout/`` folder, and W&B when attached."""
        folder = self.output_dir if self.output_dir is not None else Path(trainer.default_root_dir) / "rollout"
        return ExplanationSink(folder, self.panel_kwargs, self.ncols, self.explorer_max_bytes, self.explorer_bits)

    def _warn_collapse(self, epoch: int, explanation: Explanation) -> None:
        """Warn about the blocks that collapsed since the last check (a lasting collapse is warned about once; the
        ``attn/collapsed_blocks`` metric tracks it every epoch)."""
        new = {i: explanation.collapse[i] for i in explanation.collapsed_blocks if i not in self._collapsed}
        self._collapsed = set(explanation.collapsed_blocks)
        if new:
            rank_zero_warn(f"attention collapse at epoch {epoch} in {describe_collapse(new, len(explanation))}")


AttentionRolloutLogger = ExplanationLogger
"""The older name of :class:`ExplanationLogger` (configs written before it keep working)."""


def logged_step(trainer: Trainer) -> int:
    """The step Lightning logs this validation's metrics at: the optimiser steps taken, less the one in progress.

    Lightning keeps it in the private ``fit_loop.epoch_loop._batches_that_stepped`` (a test checks that it still
    exists and that the pictures land on the metrics' step); ``global_step`` where it is missing.
    """
    return getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step)
