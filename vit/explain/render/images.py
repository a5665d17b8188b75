"""Pixels to show and to store: the one conversion to ``uint8`` RGB and the one PNG encoder of the renderers.

Panels, the HTML report and the explorer all draw display pixels (:attr:`~vit.explain.Explanation.images`, floats in
``[0, 1]``) and write PNGs; they do it through :func:`to_uint8_image` and :func:`png_bytes` here.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import torch
from PIL import Image

__all__ = ["b64", "data_uri", "png_bytes", "to_uint8_image"]


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


def png_bytes(image: np.ndarray, compress_level: int = 6) -> bytes:
    """A ``uint8`` RGB ``(H, W, 3)`` or grayscale ``(H, W)`` array as PNG file contents (zlib ``compress_level``,
    Pillow's default 6; the explorer stores at 9)."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="PNG", compress_level=compress_level)
    return buffer.getvalue()


def b64(data: bytes) -> str:
    """``data`` as base64 text."""
    return base64.b64encode(data).decode("ascii")


def data_uri(image: np.ndarray) -> str:
    """A ``uint8`` RGB array as a ``data:image/png;base64,...`` URI."""
    return "data:image/png;base64," + b64(png_bytes(image))
