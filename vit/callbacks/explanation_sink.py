"""Where the training-time explanations go: PNG grids and the explorer in the run folder, images and pages in W&B.

:class:`ExplanationSink` takes an :class:`~vit.explain.Explanation` of the fixed validation images (what
:class:`~vit.callbacks.ExplanationLogger` computed) and draws it (:mod:`vit.explain.render`): a captioned grid per map,
the distance plot, the per-image panels for W&B, the attention explorer. Logging failures become warnings naming what
and when; a training run never ends because a picture could not be written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch import Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import nn

from .. import loggers
from ..atomic import write_bytes
from ..explain.colors import is_signed
from ..explain.explanation import Explanation
from ..explain.methods import METHODS
from ..explain.render.explorer import explorer_payload, write_explorer
from ..explain.render.images import png_bytes
from ..explain.render.panels import render_grid, render_panels
from ..explain.render.plots import distance_plot

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


class ExplanationSink:
    """Draw and store the explanations of one run: grids and the explorer in ``folder``, and W&B when attached.

    Args:
        folder: The run's ``rollout/`` folder.
        panel: :func:`~vit.explain.render.panels.render_panel` options (``alpha``, ``cmap``, ``size``).
        ncols: Panels per row of the grids.
        explorer_max_bytes: Size limit of the explorer file (the first images that fit, past it).
        explorer_bits: Bits per attention code of the explorer, or ``"auto"``.
    """

    def __init__(
        self, folder: Path, panel: dict[str, Any], ncols: int, explorer_max_bytes: int, explorer_bits: int | str
    ) -> None:
        self.folder, self.panel, self.ncols = folder, panel, ncols
        self.explorer_max_bytes, self.explorer_bits = explorer_max_bytes, explorer_bits

    def write(
        self,
        trainer: Trainer,
        explanation: Explanation,
        *,
        epoch: int,
        step: int,
        explorer: dict[str, Any] | None = None,
    ) -> None:
        """The grids of every map of ``explanation`` (and the distance plot) as PNGs and to W&B at ``step``; with
        ``explorer`` (the keywords of :meth:`explore`: model, images as the data gives them, names, mean, std), the
        explorer page too."""
        figures = warn_on_failure("explanation grids", epoch, lambda: self.render(explanation, epoch))
        if figures is not None:
            warn_on_failure("explanation PNGs", epoch, lambda: self.save(epoch, figures))
            warn_on_failure("explanations to W&B", epoch, lambda: self.log(trainer, explanation, step, figures))
        if explorer is not None:
            write = lambda: self.explore(trainer, explanation, epoch=epoch, step=step, **explorer)  # noqa: E731
            warn_on_failure("attention explorer", epoch, write)

    def render(self, explanation: Explanation, epoch: int) -> dict[str, np.ndarray]:
        """A captioned grid per map and, with statistics, the distance plot, as ``uint8`` RGB arrays."""
        figures = {
            name: render_grid(
                explanation,
                grid_map,
                self.ncols,
                title=f"epoch {epoch} · {title(name)}",
                signed=is_signed(name),
                **self.panel,
            )  # fmt: skip
            for name, grid_map in explanation.maps.items()
        }
        if explanation.distance is not None:
            figures["distance"] = distance_plot(explanation.distance, f"epoch {epoch}", explanation.max_distance)
        return figures

    def save(self, epoch: int, figures: dict[str, np.ndarray]) -> None:
        for name, figure in figures.items():
            write_bytes(self.folder / FILES.get(name, f"{name}_epoch_{{:03d}}.png").format(epoch), png_bytes(figure))

    def log(self, trainer: Trainer, explanation: Explanation, step: int, figures: dict[str, np.ndarray]) -> None:
        for name, figure in figures.items():
            grid_key, panel_key = KEYS.get(name, (METHOD_GRID_KEY, METHOD_KEY))
            if not loggers.log_images(trainer, grid_key, [figure], step):  # no W&B logger: nothing more to render
                return
            if name in explanation.maps:
                panels = render_panels(explanation, explanation.maps[name], signed=is_signed(name), **self.panel)
                loggers.log_images(trainer, panel_key, panels, step, captions=explanation.captions())

    def explore(
        self,
        trainer: Trainer,
        explanation: Explanation,
        *,
        epoch: int,
        step: int,
        model: nn.Module,
        images: Any,
        names: Sequence[str] | None,
        mean: Sequence[float] | None,
        std: Sequence[float] | None,
    ) -> None:
        """Write the explorer of the images into the run folder and log that file to W&B."""
        total = len(images)

        def subset_note(count: int) -> str:  # too many images for one file: the first ones that fit
            return f"The first {count} of the {total} explained images (all would pass the size limit)."

        payload = explorer_payload(
            model, images, mean=mean, std=std, labels=explanation.labels, class_names=explanation.class_names,
            names=names, maps=explanation.maps, attribution=False, faithfulness=explanation.faithfulness,
            title=f"epoch {epoch}: attention of the validation images", max_bytes=self.explorer_max_bytes,
            bits=self.explorer_bits, subset_note=subset_note,
        )  # fmt: skip
        path = write_explorer(self.folder / EXPLORER_FILE.format(epoch), payload)
        for logger in loggers.wandb_loggers(trainer):
            import wandb  # with a W&B logger attached, wandb is importable

            logger.log_metrics({EXPLORER_KEY: wandb.Html(str(path), inject=False)}, step=step)


def title(name: str) -> str:
    """A map's title in the grids: rollout and attribution by name, any other method by its summary."""
    if name in TITLES:
        return TITLES[name]
    method = METHODS[name]
    return f"{method.summary}{' of the predicted class' if method.class_specific else ''}"


def warn_on_failure(what: str, epoch: int, action: Callable[[], Any]) -> Any:
    """Run ``action``; a failure becomes a warning naming ``what`` and the epoch, and ``None`` is returned."""
    try:
        return action()
    except Exception as err:  # logging must never end a training run
        rank_zero_warn(f"could not log the {what} at epoch {epoch}: {type(err).__name__}: {err}; training continues")
        return None
