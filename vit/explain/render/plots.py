"""Matplotlib figures of attention statistics, rendered to ``uint8`` RGB arrays for W&B and PNG files.

Mean attention distance per head against depth is Fig. 7 of Dosovitskiy et al., "An Image is Worth 16x16 Words"
(ICLR 2021). Figures are drawn with the Agg canvas directly: no pyplot state, no display needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def figure_to_array(figure: Any) -> np.ndarray:
    """Render a matplotlib ``Figure`` with the Agg canvas to a ``uint8`` RGB array ``(H, W, 3)``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[:, :, :3].copy()


def per_head_plot(
    values: torch.Tensor,
    ylabel: str,
    title: str = "",
    ymax: float | None = None,
    reference: tuple[float, str] | None = None,
) -> np.ndarray:
    """One statistic of every head against depth (a dot per head, the mean as a line) as a ``uint8`` RGB image.

    Args:
        values: ``(blocks, heads)`` values, e.g. from :func:`~vit.explain.attention_statistics`.
        ylabel: The y axis label, with its unit.
        title: Figure title.
        ymax: Upper end of the y axis; ``None`` lets matplotlib choose.
        reference: ``(value, label)`` of a dashed horizontal reference line, e.g. the entropy of uniform attention.
    """
    from matplotlib.figure import Figure

    values = values.detach().float().cpu()
    blocks, heads = values.shape
    depth = torch.arange(blocks)
    figure = Figure(figsize=(5.0, 3.5), dpi=100)
    ax = figure.add_subplot()
    for head in range(heads):
        ax.scatter(depth, values[:, head], s=14, alpha=0.8, label=f"head {head}" if heads <= 12 else None)
    ax.plot(depth, values.mean(dim=1), color="black", linewidth=1, label="mean")
    if reference is not None:
        ax.axhline(reference[0], color="grey", linestyle="--", linewidth=1, label=reference[1])
    ax.set(xlabel="block", ylabel=ylabel, xticks=depth.tolist(), title=title)
    ax.set_ylim(0, ymax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2, loc="lower right")
    figure.tight_layout()
    return figure_to_array(figure)


def distance_plot(distance: torch.Tensor, title: str = "", max_distance: float | None = None) -> np.ndarray:
    """Mean attention distance of every head against depth (ViT paper, Fig. 7) as a ``uint8`` RGB image.

    Args:
        distance: ``(blocks, heads)`` distances in pixels, from :func:`~vit.explain.attention_statistics`.
        title: Figure title.
        max_distance: Upper end of the y axis (e.g. the image diagonal); ``None`` lets matplotlib choose.
    """
    return per_head_plot(distance, "mean attention distance (px)", title, max_distance or None)


def entropy_plot(entropy: torch.Tensor, max_entropy: float | None = None) -> np.ndarray:
    """Mean attention entropy (nats) of every head against depth, with the uniform attention's entropy dashed."""
    reference = (max_entropy, "uniform") if max_entropy is not None else None
    ymax = 1.08 * max(float(entropy.max()), max_entropy or 0.0) + 1e-3  # the uniform line stays in view
    return per_head_plot(entropy, "attention entropy (nats)", "attention entropy", ymax, reference)


def sanity_plot(report: Any) -> np.ndarray:
    """The cascading randomisation (:class:`~vit.explain.sanity.SanityReport`): each method's Spearman correlation
    and SSIM with the trained model's maps, stage by stage, with their 95 % intervals, as a ``uint8`` RGB image."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10.0, 4.0), dpi=100)
    for i, (measure, label) in enumerate((("spearman", "Spearman ρ"), ("ssim", "SSIM"))):
        ax = figure.add_subplot(1, 2, i + 1)
        for name, stages in report.stages.items():
            x = np.arange(len(stages) + 1)
            values = [1.0, *(getattr(s, measure) for s in stages)]
            low = [1.0, *(getattr(s, f"{measure}_ci")[0] for s in stages)]
            high = [1.0, *(getattr(s, f"{measure}_ci")[1] for s in stages)]
            style = {"linestyle": "--"} if name in report.insensitive else {}
            ax.plot(x, values, marker="o", markersize=3, label=name, **style)
            ax.fill_between(x, low, high, alpha=0.15)
        names = ["trained", *(s.stage for s in next(iter(report.stages.values())))]
        ax.set_xticks(np.arange(len(names)), names, rotation=45, ha="right", fontsize=7)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set(
            ylabel=f"{label} with the trained maps", ylim=(-1.05, 1.05), title=f"{label}, weights random from the top"
        )
        ax.grid(alpha=0.3)
        if i == 1:
            ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    figure.tight_layout()
    return figure_to_array(figure)
