"""A self-contained HTML explanation report: one file, every picture embedded as base64 PNG, no network.

Given the model and the pixels, the report opens on the attention explorer (:mod:`vit.explain.explorer`: click a
patch, see its attention in every block and head, with the report's rollout, attribution and faithfulness), and the
static summary follows it. Per image: the image and one overlay per explanation method, side by side (AttnLRP,
Achtibat et al., ICML 2024; attention rollout, Abnar & Zuidema, ACL 2020; class-specific attribution, Chefer et al.,
ICCV 2021; or any method of :data:`~vit.explain.METHODS`), with the prediction and its probability; per-block mean
attention distance and entropy (Dosovitskiy et al., ICLR 2021, Fig. 7); the per-head maps of one block; the
deletion / insertion areas of every method beside random, with their ratios, bootstrap intervals and time per image
(:func:`~vit.explain.benchmark_methods`), and the curves.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .colors import ColorScale, color_scale, is_signed, lookup_table
from .explorer import DEFAULT_MAX_BYTES, explorer_payload, render_explorer
from .method_benchmark import MethodBenchmark, MethodScore
from .methods import METHODS
from .overlay import overlay_heatmap
from .panels import png_bytes, upscale
from .plots import distance_plot, entropy_plot, figure_to_array
from .results import Results

SIZE = 160  # display size of each picture, pixels
HEAD_IMAGES = 8  # images whose per-head maps are shown

STYLE = """
body { font-family: sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ccc; }
.panel { display: inline-block; margin: 6px; padding: 6px; border: 1px solid #ddd; vertical-align: top; }
figure { display: inline-block; margin: 2px; text-align: center; vertical-align: top; }
figcaption { font-size: 12px; color: #555; }
.caption { font-size: 13px; margin: 2px 0 4px; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.note { font-size: 12px; color: #666; max-width: 900px; }
.legend { margin: 2px auto 0; font-size: 10px; color: #333; }
.ramp { height: 8px; border: 1px solid #bbb; }
.ticks { display: flex; justify-content: space-between; font-variant-numeric: tabular-nums; }
"""


def png_data_uri(image: np.ndarray) -> str:
    """A ``uint8`` RGB array as a ``data:image/png;base64,...`` URI."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode("ascii")


def _img(image: np.ndarray, alt: str, label: str, legend: str = "") -> str:
    return (
        f'<figure><img src="{png_data_uri(image)}" alt="{html.escape(alt)}">{legend}'
        f"<figcaption>{label}</figcaption></figure>"
    )


def colorbar_html(scale: ColorScale, width: int) -> str:
    """A numbered colour bar ``width`` pixels wide: the colour map as a CSS gradient, its :meth:`ColorScale.labels`
    under it (``-m 0 +m`` for a signed map, ``0 max`` for an unsigned one)."""
    stops = lookup_table(scale.cmap, 11)
    gradient = ", ".join(f"rgb({r}, {g}, {b})" for r, g, b in np.rint(stops * 255).astype(int))
    ticks = "".join(f"<span>{html.escape(label)}</span>" for label in scale.labels())
    return (
        f'<div class="legend" style="width: {width}px"><div class="ramp" style="background: linear-gradient(to right, '
        f'{gradient})"></div><div class="ticks">{ticks}</div></div>'
    )


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


def faithfulness_html(scores: dict, bench: MethodBenchmark | None = None) -> str:
    """The areas as an HTML table (with ``bench``: ratios to random, 95 % intervals, time per image), with the curves
    below it."""
    if bench is None:
        rows = "".join(
            f"<tr><td>{html.escape(name)}</td><td>{deletion:.4f}</td><td>{scores['insertion_auc'][name]:.4f}</td></tr>"
            for name, deletion in scores["deletion_auc"].items()
        )
        head = "<tr><th>method</th><th>deletion AUC</th><th>insertion AUC</th></tr>"
    else:
        rows = "".join(_benchmark_row(name, score) for name, score in bench.scores.items())
        head = (
            "<tr><th>method</th><th>deletion AUC [95 % CI]</th><th>× random [95 % CI]</th>"
            "<th>insertion AUC [95 % CI]</th><th>× random [95 % CI]</th><th>ms / image</th></tr>"
        )
    return (
        f'<p class="note">{scores["num_images"]} images, {scores["steps"]} steps, removed patches set to the '
        f"{html.escape(scores['baseline'])} baseline, target = the prediction on the intact image. Lower deletion "
        "and higher insertion areas mean the map points at what the model uses; "
        f"random = the mean of {scores.get('num_random', 5)} random orders.</p>"
        f'<table id="faithfulness">{head}{rows}</table>'
        + _img(curves_plot(scores), "deletion and insertion curves", "")
    )


def _benchmark_row(name: str, s: MethodScore) -> str:
    def cell(value: float, ci: tuple[float, float], digits: int) -> str:
        return f"<td>{value:.{digits}f} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]</td>"

    ms = "" if s.seconds_per_image is None else f"{1000 * s.seconds_per_image:.1f}"
    return (
        f"<tr><td>{html.escape(name)}</td>{cell(s.deletion_auc, s.deletion_ci, 3)}"
        f"{cell(s.deletion_ratio, s.deletion_ratio_ci, 2)}{cell(s.insertion_auc, s.insertion_ci, 3)}"
        f"{cell(s.insertion_ratio, s.insertion_ratio_ci, 2)}<td>{ms}</td></tr>"
    )


def render_report(
    files: Sequence[Path],
    results: Results,
    title: str = "explanations",
    alpha: float = 0.6,
    *,
    model: nn.Module | None = None,
    pixels: torch.Tensor | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    bits: int | str = "auto",
) -> str:
    """The whole report as one HTML string (see the module docstring).

    Args:
        files: The image files, in the order of ``results``.
        results: What :func:`~vit.explain.compute` returned for them.
        title: The page title.
        alpha: Opacity of the static overlays.
        model: The explained model; with ``pixels``, the report opens on the attention explorer.
        pixels: ``(B, C, H, W)`` the pixels ``results`` was computed from (uint8, normalised with ``mean``/``std``).
        mean: Per-channel mean of the normalisation.
        std: Per-channel standard deviation.
        max_bytes: Size limit of the explorer, and separately of the static overlays: beyond it, each holds the first
            images that fit, and says so (the statistics and faithfulness cover every image).
        bits: Bits per attention code of the explorer, 2 to 8, or ``"auto"`` (see
            :func:`~vit.explain.write_explorer`).
    """
    body = _static_body(files, results, title, alpha, max_bytes)
    if model is None or pixels is None:
        return (
            f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n"
        )
    return _with_explorer(files, results, title, body, model, pixels, mean, std, max_bytes, bits)


def _with_explorer(files, results, title, body, model, pixels, mean, std, max_bytes, bits) -> str:
    """The explorer of the images (as many as fit under ``max_bytes``, with a note), the static body below it."""
    explanation = results.explanation
    maps = results.shown_maps()
    payload = explorer_payload(
        model, pixels, mean=mean, std=std, class_names=explanation.class_names, labels=explanation.labels,
        names=[file_name(f) for f in files], maps=maps, attribution=False, faithfulness=results.faithfulness,
        title=title, max_bytes=max_bytes, bits=bits,
        subset_note=lambda count: (
            f"The explorer holds the first {count} of {len(files)} images (the file size limit); "
            "the statistics and faithfulness of the summary below cover all of them."
        ),
    )  # fmt: skip
    scoped = re.sub(
        r"([^{}]+)\{", lambda m: ", ".join("#report " + s.strip() for s in m.group(1).split(",")) + " {", STYLE
    )
    extra = f'<style>{scoped}</style><section id="report"><h2>Summary of all images</h2>{body}</section>'
    return render_explorer(payload, extra_html=extra)


def _static_body(files: Sequence[Path], results: Results, title: str, alpha: float, max_bytes: int) -> str:
    """The static sections: overlays (of the first images whose panels fit ``max_bytes``, with a note), statistics,
    per-head maps, faithfulness."""
    explanation = results.explanation
    captions = explanation.captions()
    sections = [f"<h1>{html.escape(title)}</h1>", "<h2>Images</h2>"]
    target = "the predicted class" if results.target is None else f"class {explanation.class_name(results.target)}"
    maps = results.shown_maps()
    described = "; ".join(
        f"{html.escape(name)}: {html.escape(METHODS[name].summary)}" for name in maps if name in METHODS
    )
    sections.append(
        '<p class="note">Signed maps (relevance: AttnLRP, integrated gradients, gradient x input) are red where '
        "a patch speaks for the class, blue where it speaks against it, and fade into the image where the "
        "relevance is near zero, on limits symmetric about zero; unsigned maps (rollout, attention, attribution) "
        "use the inferno colour map from 0 (black) to their maximum (bright). Each map has its own limits, under "
        "it. Class-specific maps "
        f"explain {html.escape(target)}. {described}.</p>"
    )
    panels, size = [], 0
    for i, file in enumerate(files):
        picture = upscale(_uint8(explanation.images[i]), SIZE)
        figures = [_img(picture, f"image {file.name}", "image")]
        for name, grid_map in maps.items():
            signed = is_signed(name, grid_map)
            figures.append(_overlay(picture, grid_map[i], signed, alpha, f"{name} of {file.name}", html.escape(name)))
        panel = (
            f'<div class="panel"><div class="caption"><b>{html.escape(file_name(file))}</b> · '
            f"{html.escape(captions[i])}</div>{''.join(figures)}</div>"
        )
        size += len(panel.encode())
        if panels and size > max_bytes:
            sections.append(
                f'<p class="note" id="overlays-note">The overlays of the first {len(panels)} of {len(files)} images '
                "(the file size limit); the statistics and faithfulness below cover all of them.</p>"
            )
            break
        panels.append(panel)
    sections += panels

    if explanation.distance is not None and explanation.entropy is not None:
        sections.append("<h2>Attention statistics per block</h2>")
        sections.append(
            _img(distance_plot(explanation.distance, "mean attention distance", explanation.max_distance), "", "")
            + _img(entropy_plot(explanation.entropy), "", "")
        )

    heads = results.head_maps
    sections.append(f"<h2>Per-head attention of block {results.block}</h2>")
    sections.append(
        '<p class="note">Each head\'s attention from the class token (or, without one, averaged over the patch '
        f"tokens) to every patch; first {min(HEAD_IMAGES, len(files))} images.</p>"
    )
    for i in range(min(HEAD_IMAGES, len(files))):
        picture = upscale(_uint8(explanation.images[i]), SIZE // 2)
        figures = [_overlay(picture, heads[i, h], False, 0.75, f"head {h}", f"head {h}") for h in range(heads.shape[1])]
        sections.append(f'<div class="heads"><div class="caption">{html.escape(file_name(files[i]))}</div>'
                        f"{''.join(figures)}</div>")  # fmt: skip

    if results.faithfulness is not None:
        sections.append("<h2>Faithfulness</h2>" + faithfulness_html(results.faithfulness, results.benchmark))
    return "\n".join(sections)


def file_name(file: Path) -> str:
    return f"{file.parent.name}/{file.name}" if file.parent.name else file.name


def _uint8(image: torch.Tensor) -> np.ndarray:
    """Display pixels ``(C, H, W)`` in ``[0, 1]`` as ``uint8`` ``(H, W, 3)``."""
    array = (image.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    return np.repeat(array, 3, axis=2) if array.shape[2] == 1 else array
