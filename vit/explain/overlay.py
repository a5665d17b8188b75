"""Heatmap overlays of patch-grid maps (rollout, statistics) on images, and captioned image grids.

Everything returns ``uint8`` RGB arrays ``(H, W, 3)`` that W&B, PIL and matplotlib display directly. Colours come
from a perceptually uniform matplotlib colormap, ``"inferno"`` by default (any matplotlib name works); ``"jet"`` is
built in (matplotlib's segment data, sampled the same way) for comparison with older figures, not recommended: its
bright bands suggest structure the map does not have. Readable panels (image beside overlay, colour bar, caption)
are :mod:`vit.explain.panels`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont

# matplotlib's "jet" as (x, value) breakpoints per channel (matplotlib/_cm.py, _jet_data).
_JET = (
    ((0.0, 0.0), (0.35, 0.0), (0.66, 1.0), (0.89, 1.0), (1.0, 0.5)),
    ((0.0, 0.0), (0.125, 0.0), (0.375, 1.0), (0.64, 1.0), (0.91, 0.0), (1.0, 0.0)),
    ((0.0, 0.5), (0.11, 1.0), (0.34, 1.0), (0.65, 0.0), (1.0, 0.0)),
)
_LUT_SIZE = 256


def _jet_lut() -> np.ndarray:
    x = np.linspace(0.0, 1.0, _LUT_SIZE)
    return np.stack([np.interp(x, *zip(*channel, strict=True)) for channel in _JET], axis=1)  # (256, 3)


def apply_colormap(values: np.ndarray | torch.Tensor, cmap: str = "inferno") -> np.ndarray:
    """Map values in ``[0, 1]`` (clipped) to ``uint8`` RGB, appending a channel axis of size 3.

    Args:
        values: Array of any shape with values in ``[0, 1]``.
        cmap: ``"jet"`` (built in) or any matplotlib colormap name (needs matplotlib).

    Raises:
        ValueError: If ``cmap`` is unknown or needs matplotlib and it is missing.
    """
    values = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    values = np.clip(np.nan_to_num(values.astype(np.float64)), 0.0, 1.0)
    if cmap == "jet":
        lut = _jet_lut()
    else:
        try:
            import matplotlib
        except ImportError as err:
            raise ValueError(f"colormap {cmap!r} needs matplotlib (pip install matplotlib), or use cmap='jet'") from err
        if cmap not in matplotlib.colormaps:
            raise ValueError(f"unknown colormap {cmap!r}; e.g. 'jet', 'viridis', 'inferno', 'magma', 'gray'")
        lut = matplotlib.colormaps[cmap].resampled(_LUT_SIZE)(np.linspace(0.0, 1.0, _LUT_SIZE))[:, :3]
    index = np.minimum((values * _LUT_SIZE).astype(np.int64), _LUT_SIZE - 1)  # matplotlib's binning
    return np.rint(lut[index] * 255.0).astype(np.uint8)


def to_uint8_image(image: np.ndarray | torch.Tensor) -> np.ndarray:
    """Convert an image to ``uint8`` RGB ``(H, W, 3)``.

    Accepts a numpy array ``(H, W, 3)``, ``(H, W, 1)`` or ``(H, W)`` (``uint8``, or float in ``[0, 1]``) and a
    tensor ``(3, H, W)``, ``(1, H, W)`` or ``(H, W)`` (float in ``[0, 1]``, clipped, or ``uint8``). Grey becomes RGB.

    Raises:
        ValueError: On another shape or channel count.
    """
    if isinstance(image, torch.Tensor):
        array = image.detach().cpu()
        if array.ndim == 3:
            array = array.permute(1, 2, 0)  # CHW -> HWC
        array = array.numpy()
    else:
        array = np.asarray(image)
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 3):
        raise ValueError(
            f"image must be HWC/HW (numpy) or CHW/HW (tensor) with 1 or 3 channels, got shape {tuple(image.shape)}"
        )
    if array.dtype != np.uint8:
        array = np.rint(np.clip(array.astype(np.float64), 0.0, 1.0) * 255.0).astype(np.uint8)
    return np.repeat(array, 3, axis=2) if array.shape[2] == 1 else array


def upsample_map(grid_map: np.ndarray | torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """Min-max normalise a ``(rows, cols)`` map to ``[0, 1]`` and resize it bilinearly to ``size = (H, W)``.

    A constant map becomes all zeros.
    """
    m = torch.as_tensor(np.asarray(grid_map.detach().cpu() if isinstance(grid_map, torch.Tensor) else grid_map))
    if m.ndim != 2:
        raise ValueError(f"grid_map must be 2-D (rows, cols), got shape {tuple(m.shape)}")
    m = m.double()
    low, high = m.min(), m.max()
    m = (m - low) / (high - low) if high > low else torch.zeros_like(m)
    m = F.interpolate(m[None, None], size=size, mode="bilinear", align_corners=False)[0, 0]
    return m.clamp(0.0, 1.0).numpy()


def overlay_heatmap(
    image: np.ndarray | torch.Tensor,
    grid_map: np.ndarray | torch.Tensor,
    alpha: float = 0.5,
    cmap: str = "inferno",
) -> np.ndarray:
    """Blend a colour-mapped patch-grid map over an image.

    The map is min-max normalised (display only), upsampled bilinearly to the image size and coloured; the
    result is ``(1 - alpha) · image + alpha · heatmap``.

    Args:
        image: See :func:`to_uint8_image` (un-normalise a model input first with :func:`unnormalize`).
        grid_map: ``(rows, cols)`` map, e.g. one item of :func:`~vit.explain.rollout_map`.
        alpha: Heatmap weight in ``[0, 1]``; 0 returns the image, 1 the heatmap.
        cmap: See :func:`apply_colormap`.

    Returns:
        ``uint8`` RGB ``(H, W, 3)``.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    rgb = to_uint8_image(image)
    heat = apply_colormap(upsample_map(grid_map, rgb.shape[:2]), cmap)
    blend = (1.0 - alpha) * rgb.astype(np.float64) + alpha * heat.astype(np.float64)
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
