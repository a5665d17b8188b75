"""The evaluation's pictures as ``uint8`` RGB arrays (matplotlib's Agg canvas, no pyplot state): the confusion matrix,
the reliability diagram (Guo et al. 2017, Fig. 1) and a grid of corrupted examples (Hendrycks & Dietterich 2019).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..explain.render.plots import figure_to_array


def confusion_matrix_figure(
    counts: Sequence[Sequence[int]], class_names: Sequence[str], title: str = "confusion matrix"
) -> np.ndarray:
    """The confusion matrix, rows the true class: the colour is the row-normalised share (a sequential map from 0 to 1
    with its colour bar), each cell prints its count.

    Args:
        counts: ``(C, C)`` counts.
        class_names: The ``C`` class names.
        title: Figure title.
    """
    from matplotlib.figure import Figure

    counts = np.asarray(counts, dtype=np.int64)
    rows = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    n = len(counts)
    side = min(12.0, 2.5 + 0.5 * n)
    figure = Figure(figsize=(side + 1.0, side), dpi=100)
    ax = figure.add_subplot()
    image = ax.imshow(rows, cmap="Blues", vmin=0.0, vmax=1.0)
    bar = figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    bar.set_label("share of the true class (row-normalised)")
    if n <= 30:
        size = 8 if n <= 12 else 6
        for i in range(n):
            for j in range(n):
                colour = "white" if rows[i, j] > 0.5 else "black"
                ax.text(j, i, str(counts[i, j]), ha="center", va="center", fontsize=size, color=colour)
    ticks = list(range(n))
    ax.set_xticks(ticks, [str(c) for c in class_names], rotation=45 if n > 5 else 0, ha="right" if n > 5 else "center")
    ax.set_yticks(ticks, [str(c) for c in class_names])
    ax.set(xlabel="predicted class", ylabel="true class", title=title)
    figure.tight_layout()
    return figure_to_array(figure)


def reliability_figure(reliability: Mapping[str, Any], ece: float, title: str = "reliability diagram") -> np.ndarray:
    """Accuracy against confidence per bin (bars), the diagonal of perfect calibration, the gap (red, from accuracy to
    the bin's mean confidence) and, below, the images per bin.

    Args:
        reliability: :func:`vit.evaluation.metrics.reliability_table`'s numbers.
        ece: The expected calibration error, printed in the legend.
        title: Figure title.
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5.0, 5.6), dpi=100)
    top, bottom = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    _reliability_axes(top, bottom, reliability, ece)
    top.set_title(title)
    figure.tight_layout()
    return figure_to_array(figure)


def reliability_pair_figure(before: Mapping[str, Any], after: Mapping[str, Any], temperature: float) -> np.ndarray:
    """Two reliability diagrams side by side: the logits as they are, and divided by ``temperature``.

    Args:
        before: ``{"reliability": ..., "ece": ...}`` of the raw logits.
        after: The same after temperature scaling.
        temperature: The fitted temperature.
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9.5, 5.6), dpi=100)
    axes = figure.subplots(2, 2, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for column, (part, title) in enumerate(((before, "before (T = 1)"), (after, f"after (T = {temperature:.3f})"))):
        _reliability_axes(axes[0, column], axes[1, column], part["reliability"], part["ece"])
        axes[0, column].set_title(title)
    figure.tight_layout()
    return figure_to_array(figure)


def _reliability_axes(top: Any, bottom: Any, reliability: Mapping[str, Any], ece: float) -> None:
    lower, upper = np.asarray(reliability["lower"]), np.asarray(reliability["upper"])
    width, centre = upper - lower, (lower + upper) / 2
    accuracy = np.array([np.nan if a is None else a for a in reliability["accuracy"]], dtype=float)
    confidence = np.array([np.nan if c is None else c for c in reliability["confidence"]], dtype=float)
    filled = ~np.isnan(accuracy)
    top.bar(centre[filled], accuracy[filled], width=width[filled], color="#4C72B0", edgecolor="black",
            linewidth=0.5, label="accuracy")  # fmt: skip
    gap = confidence - accuracy
    # the gap from the bin's accuracy to its mean confidence, hatched: above the bar over-confident, inside it under
    top.bar(centre[filled], gap[filled], bottom=accuracy[filled], width=width[filled], color="none",
            edgecolor="#CC2222", hatch="///", linewidth=0.8, label="gap to mean confidence")  # fmt: skip
    top.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfect calibration")
    top.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy")
    top.legend(loc="upper left", fontsize=8, title=f"ECE {ece:.4f}", title_fontsize=8)
    top.grid(alpha=0.3)
    bottom.bar(centre, reliability["count"], width=width, color="grey", edgecolor="black", linewidth=0.5)
    bottom.set(xlabel="confidence (top-label probability)", ylabel="images")
    bottom.set_yscale("symlog", linthresh=10)
    bottom.grid(alpha=0.3)


def corruption_grid_figure(
    examples: Mapping[str, Sequence[np.ndarray]], accuracy: Mapping[str, Sequence[float]] | None = None, scale: int = 3
) -> np.ndarray:
    """One example image per corruption (rows) and severity (columns), upscaled ``scale`` times without smoothing,
    captioned with the accuracy at that severity when given.

    Args:
        examples: Corruption name to its uint8 ``(H, W, 3)`` example at each severity.
        accuracy: Corruption name to its accuracy at each severity.
        scale: Pixel magnification.
    """
    from matplotlib.figure import Figure

    names = list(examples)
    columns = max(len(v) for v in examples.values())
    height, width = np.asarray(examples[names[0]][0]).shape[:2]
    cell = max(0.9, scale * max(height, width) / 100)
    figure = Figure(figsize=(1.6 + cell * columns, 0.3 + (cell + 0.2) * len(names)), dpi=100)
    axes = np.atleast_2d(figure.subplots(len(names), columns, squeeze=False))
    for r, name in enumerate(names):
        for c in range(columns):
            ax = axes[r, c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c < len(examples[name]):
                ax.imshow(np.asarray(examples[name][c]), interpolation="nearest")
                if accuracy is not None:
                    ax.set_title(f"{accuracy[name][c]:.3f}", fontsize=7, pad=2)
            if c == 0:
                ax.set_ylabel(name.replace("_", " "), rotation=0, ha="right", va="center", fontsize=8)
            if r == len(names) - 1:
                ax.set_xlabel(f"severity {c + 1}", fontsize=8)
    figure.subplots_adjust(left=0.2, right=0.99, top=0.97, bottom=0.04, wspace=0.08, hspace=0.35)
    return figure_to_array(figure)


__all__ = ["confusion_matrix_figure", "corruption_grid_figure", "reliability_figure", "reliability_pair_figure"]
