"""Heatmap overlays of patch-grid maps (rollout, relevance, statistics) on images, and captioned image grids.

Everything returns ``uint8`` RGB arrays ``(H, W, 3)`` that W&B, PIL and matplotlib display directly. The colour map
and its limits are :func:`~vit.explain.colors.color_scale`'s: a signed map on ``bwr`` centred on zero, fading into
the image where it is near zero; an unsigned one on ``inferno`` from 0 to its maximum (any matplotlib name may replace
``inferno``; ``"jet"`` is built in for comparison with older figures, not recommended: its bright bands suggest
structure the map does not have). Readable panels (image beside overlay, colour bar, caption) are
:mod:`vit.explain.render.panels`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont

from ..colors import ColorScale, apply_colormap, color_scale
from .images import to_uint8_image

__all__ = ["apply_colormap", "make_grid", "overlay_heatmap", "to_uint8_image", "upsample_map", "upsample_values"]


def _grid(grid_map: np.ndarray | torch.Tensor) -> torch.Tensor:
    m = torch.as_tensor(np.asarray(grid_map.detach().cpu() if isinstance(grid_map, torch.Tensor) else grid_map))
    if m.ndim != 2:
        raise ValueError(f"grid_map must be 2-D (rows, cols), got shape {tuple(m.shape)}")
    return m.double().nan_to_num(0.0, 0.0, 0.0)


def upsample_values(grid_map: np.ndarray | torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """Resize a ``(rows, cols)`` map bilinearly to ``size = (H, W)``, its values kept (signs included)."""
    m = _grid(grid_map)
    return F.interpolate(m[None, None], size=size, mode="bilinear", align_corners=False)[0, 0].numpy()


def upsample_map(grid_map: np.ndarray | torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """Min-max normalise a ``(rows, cols)`` map to ``[0, 1]`` and resize it bilinearly to ``size = (H, W)``.

    A constant map becomes all zeros. For drawing, :func:`overlay_heatmap` uses :func:`upsample_values` and the
    map's :func:`~vit.explain.colors.color_scale` instead.
    """
    m = _grid(grid_map)
    low, high = m.min(), m.max()
    m = (m - low) / (high - low) if high > low else torch.zeros_like(m)
    m = F.interpolate(m[None, None], size=size, mode="bilinear", align_corners=False)[0, 0]
    return m.clamp(0.0, 1.0).numpy()


def overlay_heatmap(
    image: np.ndarray | torch.Tensor,
    grid_map: np.ndarray | torch.Tensor,
    alpha: float = 0.5,
    cmap: str | None = None,
    *,
    signed: bool = False,
    scale: ColorScale | None = None,
) -> np.ndarray:
    """Blend a colour-mapped patch-grid map over an image.

    The map is upsampled bilinearly to the image size and coloured by its :class:`~vit.explain.colors.ColorScale`;
    the result is ``(1 - w) · image + w · heatmap`` with ``w = alpha`` for an unsigned map and
    ``w = alpha · |value| / max |value|`` for a signed one (the image shows where the relevance is near zero).

    Args:
        image: See :func:`to_uint8_image` (un-normalise a model input first with :func:`unnormalize`).
        grid_map: ``(rows, cols)`` map, e.g. one item of :func:`~vit.explain.rollout_map`, raw values.
        alpha: Heatmap weight in ``[0, 1]`` (a signed map's largest); 0 returns the image.
        cmap: Sequential colour map of an unsigned map instead of ``inferno`` (see
            :func:`~vit.explain.colors.apply_colormap`).
        signed: Whether the map is signed (:func:`~vit.explain.colors.is_signed` of its method).
        scale: Colour map and limits to use instead of the map's own (e.g. one shared by several panels).

    Returns:
        ``uint8`` RGB ``(H, W, 3)``.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    rgb = to_uint8_image(image)
    scale = scale if scale is not None else color_scale(grid_map, signed, cmap=cmap)
    values = upsample_values(grid_map, rgb.shape[:2])
    weight = scale.opacity(values, alpha)[:, :, None]
    blend = (1.0 - weight) * rgb.astype(np.float64) + weight * scale.colors(values).astype(np.float64)
    return np.rint(blend).astype(np.uint8)


def make_grid(
    images: Sequence[np.ndarray | torch.Tensor],
    ncols: int,
    captions: Sequence[str] | None = None,
    padding: int = 2,
    background: int = 255,
) -> np.ndarray:
    """Tile images into one ``uint8`` RGB array, row by row, optionally with a caption under each.

    Cells are as large as the largest image; smaller images sit in the top-left corner of their cell. Captions
    use PIL's default font on a strip below each image.

    Args:
        images: Images accepted by :func:`to_uint8_image`.
        ncols: Images per row (at least 1).
        captions: One string per image, or ``None``.
        padding: Pixels between and around cells.
        background: Grey level of the padding and empty cells.

    Returns:
        ``uint8`` RGB ``(H, W, 3)``.
    """
    if len(images) == 0:
        raise ValueError("make_grid needs at least one image")
    if ncols < 1:
        raise ValueError(f"ncols must be >= 1, got {ncols}")
    if captions is not None and len(captions) != len(images):
        raise ValueError(f"got {len(captions)} captions for {len(images)} images: pass one caption per image")
    arrays = [to_uint8_image(image) for image in images]
    cell_h = max(a.shape[0] for a in arrays)
    cell_w = max(a.shape[1] for a in arrays)
    font = ImageFont.load_default()
    caption_h = 0
    if captions is not None:
        probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
        caption_h = max(probe.textbbox((0, 0), text or " ", font=font)[3] for text in captions) + 2 * padding
    ncols = min(ncols, len(arrays))
    nrows = -(-len(arrays) // ncols)
    step_h, step_w = cell_h + caption_h + padding, cell_w + padding
    canvas = np.full((padding + nrows * step_h, padding + ncols * step_w, 3), background, dtype=np.uint8)
    for i, array in enumerate(arrays):
        top, left = padding + (i // ncols) * step_h, padding + (i % ncols) * step_w
        canvas[top : top + array.shape[0], left : left + array.shape[1]] = array
    if captions is not None:
        pil = Image.fromarray(canvas)
        draw = ImageDraw.Draw(pil)
        ink = (0, 0, 0) if background > 127 else (255, 255, 255)
        for i, text in enumerate(captions):
            top, left = padding + (i // ncols) * step_h, padding + (i % ncols) * step_w
            draw.text((left, top + cell_h + padding), text, fill=ink, font=font)
        canvas = np.asarray(pil).copy()
    return canvas
