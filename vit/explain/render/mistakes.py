"""Pictures of the most confident mistakes (:class:`~vit.explain.mistakes.Mistakes`): per mistake the image, the map
of the predicted class and the map of the true class side by side, both on one colour scale so they compare::

    | true cat · pred dog (97 %)                               |
    | image | pred: dog (its map) | true: cat (its map) | ▮ |

:func:`render_mistakes` tiles them into one PNG-ready array (``vit explain``'s ``mistakes.png``, W&B), and
:func:`mistakes_html` is the report's section.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from ..colors import color_scale, is_signed
from .images import data_uri, to_uint8_image
from .overlay import make_grid, overlay_heatmap
from .panels import BAR_WIDTH, caption_font_size, caption_height, colorbar, font, upscale

if TYPE_CHECKING:
    from ..mistakes import Mistakes


def render_mistake(mistakes: Mistakes, i: int, *, size: int = 96, alpha: float = 0.6, padding: int = 4) -> np.ndarray:
    """Mistake ``i``: its caption, the image, the predicted class's map and the true class's map over it, and one
    numbered colour bar for both maps; ``uint8`` RGB."""
    pair = torch.stack([mistakes.predicted_maps[i], mistakes.true_maps[i]])
    scale = color_scale(pair, is_signed(mistakes.method, pair))
    picture = upscale(to_uint8_image(mistakes.images[i]), size)
    height, width = picture.shape[:2]
    panels = [picture] + [overlay_heatmap(picture, m, alpha, scale=scale) for m in pair]
    label_font, text_font = font(max(9, caption_font_size(size) - 3)), font(caption_font_size(size))
    # short enough for a 96-pixel panel: the method and "map of" are in the figure's title
    names = ["image", f"pred: {mistakes.class_name(int(mistakes.preds[i]))}",
             f"true: {mistakes.class_name(int(mistakes.labels[i]))}"]  # fmt: skip
    labels = scale.labels()
    top, under = caption_height(size) + padding, caption_height(size)
    bar_left = padding + 3 * (width + padding)
    canvas = np.full((top + height + under + padding, bar_left + BAR_WIDTH + 3 + 44 + padding, 3), 255, np.uint8)
    for k, panel in enumerate(panels):
        left = padding + k * (width + padding)
        canvas[top : top + height, left : left + width] = panel
    canvas[top : top + height, bar_left : bar_left + BAR_WIDTH] = colorbar(scale, height, BAR_WIDTH)
    pil = Image.fromarray(canvas)
    draw = ImageDraw.Draw(pil)
    draw.text((padding, padding), mistakes.captions()[i], fill=(0, 0, 0), font=text_font)
    for k, name in enumerate(names):
        draw.text((padding + k * (width + padding), top + height + 2), name, fill=(60, 60, 60), font=label_font)
    label_left = bar_left + BAR_WIDTH + 3
    draw.text((label_left, top), labels[-1], fill=(0, 0, 0), font=label_font, anchor="la")
    draw.text((label_left, top + height), labels[0], fill=(0, 0, 0), font=label_font, anchor="ld")
    if scale.signed:
        draw.text((label_left, top + height / 2), labels[1], fill=(0, 0, 0), font=label_font, anchor="lm")
    return np.asarray(pil).copy()


def render_mistakes(mistakes: Mistakes, *, ncols: int = 2, size: int = 96, alpha: float = 0.6) -> np.ndarray | None:
    """Every mistake's :func:`render_mistake`, ``ncols`` a row, under a title line; ``None`` when there are none."""
    if len(mistakes) == 0:
        return None
    tiles = [render_mistake(mistakes, i, size=size, alpha=alpha) for i in range(len(mistakes))]
    grid = make_grid(tiles, ncols=ncols, padding=4)
    title = (f"the {len(mistakes)} most confident of {mistakes.num_errors} errors in {mistakes.num_images} images: "
             f"{mistakes.method} of the predicted and of the true class, one colour scale per pair")  # fmt: skip
    strip = caption_height(size) + 8
    canvas = np.full((grid.shape[0] + strip, max(grid.shape[1], 10), 3), 255, np.uint8)
    canvas[strip:, : grid.shape[1]] = grid
    pil = Image.fromarray(canvas)
    ImageDraw.Draw(pil).text((6, 4), title, fill=(0, 0, 0), font=font(caption_font_size(size)))
    return np.asarray(pil).copy()


def mistakes_html(mistakes: Mistakes | None, macros) -> str:
    """The report's section: a line saying what is shown, then one figure per mistake (empty without mistakes)."""
    if mistakes is None:
        return ""
    figures = [data_uri(render_mistake(mistakes, i, size=120)) for i in range(len(mistakes))]
    return str(macros.mistakes(mistakes, figures, mistakes.captions()))


def mistakes_table(mistakes: Mistakes, size: int = 96, alpha: float = 0.6) -> tuple[list[str], list[list[Any]]]:
    """Columns and rows of a table of the mistakes (a W&B table): the image, true and predicted class, the
    confidence, the probability of the true class, and each map over the image (``uint8`` arrays)."""
    columns = ["image", "true", "predicted", "confidence", "true class probability", "map of predicted",
               "map of true"]  # fmt: skip
    rows = []
    for i in range(len(mistakes)):
        pair = torch.stack([mistakes.predicted_maps[i], mistakes.true_maps[i]])
        scale = color_scale(pair, is_signed(mistakes.method, pair))
        picture = upscale(to_uint8_image(mistakes.images[i]), size)
        rows.append([
            picture, mistakes.class_name(int(mistakes.labels[i])), mistakes.class_name(int(mistakes.preds[i])),
            round(float(mistakes.confidence[i]), 4), round(float(mistakes.true_prob[i]), 4),
            *(overlay_heatmap(picture, m, alpha, scale=scale) for m in pair),
        ])  # fmt: skip
    return columns, rows
