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
