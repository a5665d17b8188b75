"""Panels a person can read: the image beside its heatmap overlay, a colour bar, the prediction burned in.

A panel (:func:`render_panel`) is laid out as::

    | caption: "true 3 · pred 7 (32 %)"            |
    | image (upscaled) | overlay (upscaled) | ▮ +m  |
    |                  |                    | ▮ 0   |
    |                  |                    | ▮ -m  |

The colour map and limits are :func:`~vit.explain.colors.color_scale`'s: a signed map (AttnLRP, integrated gradients,
...) on ``bwr`` from ``-m`` to ``+m`` (``m = max |value|``, white at zero, fading into the image there), an unsigned
one (rollout, attention) on ``inferno`` from 0 to its maximum. The heatmap is blended over the image, which stays
visible beside it unchanged; the colour bar carries the numbers. :func:`render_grid` tiles the panels of an
:class:`~vit.explain.Explanation` into one captioned grid, each panel on its own limits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from ..colors import ColorScale, color_scale, is_signed
from .images import png_bytes, to_uint8_image
from .overlay import make_grid, overlay_heatmap

if TYPE_CHECKING:
    from ..explanation import Explanation

Resample = Literal["nearest", "bicubic"]
_RESAMPLE = {"nearest": Image.Resampling.NEAREST, "bicubic": Image.Resampling.BICUBIC}
BAR_WIDTH = 12
"""Width in pixels of the colour bar."""


def font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's bundled scalable font at ``size`` pixels (its small bitmap font on a Pillow without FreeType)."""
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError):  # Pillow < 10.1, or built without FreeType
        return ImageFont.load_default()


def upscale(image: np.ndarray, size: int, resample: Resample = "bicubic") -> np.ndarray:
    """Resize a ``uint8`` ``(H, W, 3)`` image so that its longer side is ``size`` pixels (aspect kept)."""
    if resample not in _RESAMPLE:
        raise ValueError(f"resample must be one of {sorted(_RESAMPLE)}, got {resample!r}")
    height, width = image.shape[:2]
    scale = size / max(height, width)
    target = (max(1, round(width * scale)), max(1, round(height * scale)))
    if target == (width, height):
        return image
    return np.asarray(Image.fromarray(image).resize(target, _RESAMPLE[resample]))


def render_panel(
    image: np.ndarray | torch.Tensor,
    grid_map: np.ndarray | torch.Tensor,
    caption: str = "",
    *,
    signed: bool = False,
    scale: ColorScale | None = None,
    cmap: str | None = None,
    size: int = 160,
    alpha: float = 0.6,
    resample: Resample = "bicubic",
    padding: int = 4,
) -> np.ndarray:
    """One readable panel: the image and the heatmap over it side by side, a numbered colour bar, the caption on top.

    Args:
        image: Display pixels, see :func:`~vit.explain.to_uint8_image` (e.g. ``Explanation.images[i]``).
        grid_map: ``(rows, cols)`` map on the patch grid (e.g. ``Explanation.maps["rollout"][i]``), raw values.
        caption: Text burned in above the images, e.g. ``"true 3 · pred 7 (32 %)"``.
        signed: Whether the map is signed (:func:`~vit.explain.colors.is_signed` of its method): ``bwr`` centred on
            zero, labelled ``-m, 0, +m``; otherwise ``inferno`` from 0 to the maximum.
        scale: Colour map and limits instead of the map's own (e.g. shared by the panels of a grid).
        cmap: Sequential colour map of an unsigned map instead of ``inferno`` (``"jet"`` is built in, not
            recommended); a signed map is always ``bwr``.
        size: Longer side in pixels of each of the two images (upscaled from the input resolution).
        alpha: Heatmap weight over the image, in ``[0, 1]`` (a signed map's at its largest value).
        resample: ``"bicubic"`` (photos) or ``"nearest"`` (pixel-exact blocks) to upscale the image.
        padding: White pixels around and between the parts.

    Returns:
        ``uint8`` RGB ``(H, W, 3)`` on a white background. The image occupies rows ``caption_height(size) + padding``
        onwards and columns ``padding`` to ``padding + width``; the overlay follows after another ``padding``.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    raw = torch.as_tensor(np.asarray(grid_map.detach().cpu() if isinstance(grid_map, torch.Tensor) else grid_map))
    if raw.ndim != 2:
        raise ValueError(f"grid_map must be 2-D (rows, cols), got shape {tuple(raw.shape)}")
    scale = scale if scale is not None else color_scale(raw, signed, cmap=cmap)
    picture = upscale(to_uint8_image(image), size, resample)
    height, width = picture.shape[:2]
    overlay = overlay_heatmap(picture, raw, alpha, scale=scale)

    text_font = font(caption_font_size(size))
    label_font = font(max(9, caption_font_size(size) - 3))
    labels = scale.labels()
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    # At least the width of a typical label, so that the panels of a grid share one size.
    label_width = max(probe.textbbox((0, 0), text, font=label_font)[2] for text in (*labels, "-0.00088"))
    top = caption_height(size) + padding
    canvas_w = 3 * padding + 2 * width + padding + BAR_WIDTH + 3 + label_width + padding
    canvas = np.full((top + height + padding, canvas_w, 3), 255, dtype=np.uint8)
    canvas[top : top + height, padding : padding + width] = picture
    left = 2 * padding + width
    canvas[top : top + height, left : left + width] = overlay
    bar_left = left + width + 2 * padding
    canvas[top : top + height, bar_left : bar_left + BAR_WIDTH] = colorbar(scale, height, BAR_WIDTH)

    pil = Image.fromarray(canvas)
    draw = ImageDraw.Draw(pil)
    draw.text((padding, padding), caption, fill=(0, 0, 0), font=text_font)
    label_left = bar_left + BAR_WIDTH + 3
    draw.text((label_left, top), labels[-1], fill=(0, 0, 0), font=label_font, anchor="la")
    draw.text((label_left, top + height), labels[0], fill=(0, 0, 0), font=label_font, anchor="ld")
    if scale.signed:  # zero, level with the bar's white row
        draw.text((label_left, top + height / 2), labels[1], fill=(0, 0, 0), font=label_font, anchor="lm")
    return np.asarray(pil).copy()


def colorbar(scale: ColorScale, length: int, thickness: int, vertical: bool = True) -> np.ndarray:
    """The colour bar of ``scale`` as ``uint8`` RGB: ``(length, thickness, 3)`` with the top at ``scale.high``, or
    ``(thickness, length, 3)`` from ``scale.low`` on the left; a signed bar of odd length has zero's white in its
    middle row."""
    values = np.linspace(scale.high, scale.low, length)  # top to bottom
    strip = scale.colors(values)[:, None].repeat(thickness, axis=1)  # (length, thickness, 3)
    return strip if vertical else strip[::-1].transpose(1, 0, 2).copy()


def caption_font_size(size: int) -> int:
    """Caption font size in pixels for panels of ``size``-pixel images."""
    return max(11, round(size / 11))


def caption_height(size: int) -> int:
    """Height in pixels of the caption strip of a panel of ``size``-pixel images."""
    return round(1.3 * caption_font_size(size))


def render_panels(
    explanation: Explanation,
    maps: torch.Tensor | Sequence[torch.Tensor] | None = None,
    **kwargs,
) -> list[np.ndarray]:
    """One :func:`render_panel` per image of an explanation, captioned with :meth:`Explanation.captions`.

    Args:
        explanation: From :func:`~vit.explain.explain`.
        maps: ``(B, rows, cols)`` maps to show (e.g. ``explanation.maps["attnlrp"]``); ``None`` shows the
            explanation's first map (:attr:`~vit.explain.Explanation.maps`).
        **kwargs: Passed to :func:`render_panel` (``signed``, ``cmap``, ``size``, ``alpha``, ``resample``,
            ``padding``): each panel on its own limits (:mod:`vit.explain.colors`).
    """
    maps = next(iter(explanation.maps.values())) if maps is None else maps
    if len(maps) != len(explanation):
        raise ValueError(f"got {len(maps)} maps for {len(explanation)} images: pass one map per image")
    return [
        render_panel(image, grid_map, caption, **kwargs)
        for image, grid_map, caption in zip(explanation.images, maps, explanation.captions(), strict=True)
    ]


def render_grid(
    explanation: Explanation,
    maps: torch.Tensor | Sequence[torch.Tensor] | None = None,
    ncols: int = 4,
    *,
    title: str = "",
    **kwargs,
) -> np.ndarray:
    """All panels of an explanation tiled into one ``uint8`` RGB grid, with an optional title on top.

    Args:
        explanation: From :func:`~vit.explain.explain`.
        maps: See :func:`render_panels`.
        ncols: Panels per row.
        title: Text above the grid, e.g. ``"epoch 3 · attention rollout"``; empty for none.
        **kwargs: Passed to :func:`render_panel`.
    """
    grid = make_grid(render_panels(explanation, maps, **kwargs), ncols=ncols, padding=6)
    if not title:
        return grid
    size = kwargs.get("size", 160)
    strip_h = caption_height(size) + 8
    canvas = Image.new("RGB", (grid.shape[1], grid.shape[0] + strip_h), (255, 255, 255))
    canvas.paste(Image.fromarray(grid), (0, strip_h))
    ImageDraw.Draw(canvas).text((6, 4), title, fill=(0, 0, 0), font=font(caption_font_size(size) + 2))
    return np.asarray(canvas).copy()


def explanation_png(explanation: Explanation, ncols: int = 8, size: int = 128) -> bytes | None:
    """The maps of ``explanation`` as one PNG, what a notebook shows for it
    (:func:`~vit.explain.render.notebook.show_explanations`): a
    :func:`render_grid` per method (titled with its name, a signed map on its diverging scale), one under the other;
    ``None`` when it holds no maps."""
    if not explanation.maps or not len(explanation):
        return None
    ncols = min(ncols, len(explanation))
    grids = [render_grid(explanation, maps, ncols, title=name, size=size, signed=is_signed(name, maps))
             for name, maps in explanation.maps.items()]  # fmt: skip
    width = max(grid.shape[1] for grid in grids)
    padded = [np.pad(g, ((0, 0), (0, width - g.shape[1]), (0, 0)), constant_values=255) for g in grids]
    return png_bytes(np.concatenate(padded, axis=0))
