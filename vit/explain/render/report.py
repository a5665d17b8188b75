"""A self-contained HTML explanation report: one file, every picture embedded as base64 PNG, no network.

Given the model and the pixels, the report opens on the attention explorer (:mod:`vit.explain.render.explorer`: click a
patch, see its attention in every block and head, with the report's rollout, attribution and faithfulness), and the
static summary follows it. Per image: the image and one overlay per explanation method, side by side (AttnLRP,
Achtibat et al., ICML 2024; attention rollout, Abnar & Zuidema, ACL 2020; class-specific attribution, Chefer et al.,
ICCV 2021; or any method of :data:`~vit.explain.METHODS`), with the prediction and its probability; per-block mean
attention distance and entropy (Dosovitskiy et al., ICLR 2021, Fig. 7); the per-head maps of one block; the
deletion / insertion areas of every method beside random, with their ratios, bootstrap intervals and time per image
(:func:`~vit.explain.benchmark_methods`), and the curves. The HTML is ``assets/report.html`` (Jinja2 macros) and
its style ``assets/report.css``, scoped to ``#report`` so that it styles the summary alone beside the explorer.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from markupsafe import Markup
from torch import nn

from ..colors import ColorScale, color_scale, is_signed, lookup_table
from ..explanation import Explanation, benchmark_scores
from ..method_benchmark import MethodBenchmark
from ..methods import METHODS
from .explorer import ASSETS, DEFAULT_MAX_BYTES, explorer_payload, render_explorer
from .images import data_uri, to_uint8_image
from .mistakes import mistakes_html
from .overlay import overlay_heatmap
from .panels import upscale
from .plots import distance_plot, entropy_plot, figure_to_array, sanity_plot

if TYPE_CHECKING:
    from ..mistakes import Mistakes

SIZE = 160  # display size of each picture, pixels
HEAD_IMAGES = 8  # images whose per-head maps are shown


@cache
def _macros() -> Any:
    """The macros of ``assets/report.html`` (autoescaped: every name, caption and title is text, never markup)."""
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(ASSETS), autoescape=True, undefined=jinja2.StrictUndefined
    )
    return environment.get_template("report.html").module


def _css() -> str:
    return (ASSETS / "report.css").read_text(encoding="utf-8")


def _img(image: np.ndarray, alt: str, label: str, legend: str = "") -> Markup:
    return _macros().figure(data_uri(image), alt, label, Markup(legend))


def colorbar_html(scale: ColorScale, width: int) -> str:
    """A numbered colour bar ``width`` pixels wide: the colour map as a CSS gradient, its :meth:`ColorScale.labels`
    under it (``-m 0 +m`` for a signed map, ``0 max`` for an unsigned one)."""
    stops = lookup_table(scale.cmap, 11)
    gradient = ", ".join(f"rgb({r}, {g}, {b})" for r, g, b in np.rint(stops * 255).astype(int))
    return str(_macros().colorbar(width, gradient, scale.labels()))


def _overlay(picture: np.ndarray, grid_map: torch.Tensor, signed: bool, alpha: float, alt: str, label: str) -> str:
    """An overlay figure with its numbered colour bar under it."""
    scale = color_scale(grid_map, signed)
    overlay = overlay_heatmap(picture, grid_map, alpha, scale=scale)
    return _img(overlay, alt, label, colorbar_html(scale, overlay.shape[1]))


def curves_plot(scores: dict) -> np.ndarray:
    """Deletion and insertion curves of every method side by side, as a ``uint8`` RGB image."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8.0, 3.2), dpi=100)
    for i, kind in enumerate(("deletion", "insertion")):
        ax = figure.add_subplot(1, 2, i + 1)
        for name, curve in scores[f"{kind}_curve"].items():
            auc = scores[f"{kind}_auc"][name]
            ax.plot(scores["fractions"], curve, marker="o", markersize=3, label=f"{name} ({auc:.3f})")
        ax.set(xlabel="fraction of patches " + ("removed" if kind == "deletion" else "revealed"), title=kind)
        ax.set(ylabel="target probability", xlim=(0, 1), ylim=(0, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    figure.tight_layout()
    return figure_to_array(figure)


def faithfulness_html(scores: dict, bench: MethodBenchmark | None = None, table_id: str = "faithfulness") -> str:
    """The areas as an HTML table (with ``bench``: ratios to random, SRG, 95 % intervals, time per image), with the
    curves below it."""
    rows = None
    if bench is not None:
        rows = [
            {
                "name": name,
                "cells": [
                    (s.deletion_auc, *s.deletion_ci, 3),
                    (s.deletion_ratio, *s.deletion_ratio_ci, 2),
                    (s.insertion_auc, *s.insertion_ci, 3),
                    (s.insertion_ratio, *s.insertion_ratio_ci, 2),
                ],  # fmt: skip
                "ms": "" if s.seconds_per_image is None else f"{1000 * s.seconds_per_image:.1f}",
            }
            for name, s in bench.scores.items()
        ]
    curves = _img(curves_plot(scores), "deletion and insertion curves", "")
    return str(_macros().faithfulness(scores, rows, curves, table_id))


def render_report(
    files: Sequence[Path],
    explanation: Explanation,
    title: str = "explanations",
    alpha: float = 0.6,
    *,
    model: nn.Module | None = None,
    pixels: torch.Tensor | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    bits: int | str = "auto",
    mistakes: Mistakes | None = None,
) -> str:
    """The whole report as one HTML string (see the module docstring).

    Args:
        files: The image files, in the order of ``explanation``.
        explanation: What :func:`~vit.explain.explain` returned for them (its maps, head maps, benchmark).
        title: The page title.
        alpha: Opacity of the static overlays.
        model: The explained model; with ``pixels``, the report opens on the attention explorer.
        pixels: ``(B, C, H, W)`` the pixels ``explanation`` was computed from (uint8, normalised with
            ``mean``/``std``).
        mean: Per-channel mean of the normalisation.
        std: Per-channel standard deviation.
        max_bytes: Size limit of the explorer, and separately of the static overlays: beyond it, each holds the first
            images that fit, and says so (the statistics and faithfulness cover every image).
        bits: Bits per attention code of the explorer, 2 to 8, or ``"auto"`` (see
            :func:`~vit.explain.render.explorer.explorer_payload`).
        mistakes: The most confident errors (:func:`~vit.explain.mistakes.worst_mistakes`) of these images: a
            section of their maps of the predicted and of the true class, and the explorer's "mistakes only" filter.
    """
    standalone = model is None or pixels is None
    body = _static_body(files, explanation, title if standalone else None, alpha, max_bytes, mistakes)
    if standalone:
        return str(_macros().page(title, Markup(_css()), body))
    payload = explorer_payload(
        model, pixels, mean=mean, std=std, class_names=explanation.class_names, labels=explanation.labels,
        names=[file_name(f) for f in files], maps=explanation.maps, attribution=False,
        faithfulness=explanation.faithfulness, title=title, max_bytes=max_bytes, bits=bits,
        importance=None if explanation.heads is None else explanation.heads.logit_drop,
        subset_note=lambda count: (
            f"The explorer holds the first {count} of {len(files)} images (the file size limit); "
            "the statistics and faithfulness of the summary below cover all of them."
        ),
    )  # fmt: skip
    return render_explorer(payload, extra_html=str(_macros().embedded(Markup(_css()), body)))


def _static_body(
    files: Sequence[Path],
    explanation: Explanation,
    title: str | None,
    alpha: float,
    max_bytes: int,
    mistakes: Mistakes | None,
) -> Markup:
    """The static sections: overlays (of the first images whose panels fit ``max_bytes``, with a note), statistics,
    per-head maps, faithfulness; under the ``title`` heading, or under the explorer's (``None``)."""
    macros, captions, maps = _macros(), explanation.captions(), explanation.maps
    target = explanation.target
    target = "the predicted class" if target is None else f"class {explanation.class_name(target)}"
    described = "; ".join(f"{name}: {METHODS[name].summary}" for name in maps if name in METHODS)
    panels, size, subset = [], 0, None
    for i, file in enumerate(files):
        picture = upscale(to_uint8_image(explanation.images[i]), SIZE)
        figures = [_img(picture, f"image {file.name}", "image")]
        for name, grid_map in maps.items():
            signed = is_signed(name, grid_map)
            figures.append(_overlay(picture, grid_map[i], signed, alpha, f"{name} of {file.name}", name))
        panel = macros.panel(file_name(file), captions[i], Markup("".join(figures)))
        size += len(str(panel).encode())
        if panels and size > max_bytes:
            subset = (len(panels), len(files))
            break
        panels.append(panel)
    statistics = ""
    if explanation.distance is not None and explanation.entropy is not None:
        distance = distance_plot(explanation.distance, "mean attention distance", explanation.max_distance)
        statistics = _img(distance, "", "") + _img(entropy_plot(explanation.entropy), "", "")
    heads, shown = [], min(HEAD_IMAGES, len(files))
    for i in range(shown if explanation.head_maps is not None else 0):
        picture = upscale(to_uint8_image(explanation.images[i]), SIZE // 2)
        figures = [_overlay(picture, explanation.head_maps[i, h], False, 0.75, f"head {h}", f"head {h}")
                   for h in range(explanation.head_maps.shape[1])]  # fmt: skip
        heads.append(macros.heads(file_name(files[i]), Markup("".join(figures))))
    tables = [
        faithfulness_html(benchmark_scores(bench), bench, "faithfulness" if i == 0 else f"faithfulness-{removal}")
        for i, (removal, bench) in enumerate(explanation.benchmarks.items())
    ]
    faithfulness = Markup("".join(tables))
    sanity = ""
    if explanation.sanity is not None:
        sanity = macros.sanity(explanation.sanity, _img(sanity_plot(explanation.sanity), "sanity check", ""))
    importance = ""
    if explanation.heads is not None:
        count = min(3, explanation.heads.logit_drop.numel())
        share = (count, explanation.heads.share_of_top(count))
        importance = macros.importance(explanation.heads, explanation.heads.logit_drop.tolist(), share)
    return macros.summary(title, target, described, panels, subset, statistics, explanation.block, shown, heads,
                          faithfulness, sanity, importance, Markup(mistakes_html(mistakes, macros)))  # fmt: skip


def file_name(file: Path) -> str:
    return f"{file.parent.name}/{file.name}" if file.parent.name else file.name
