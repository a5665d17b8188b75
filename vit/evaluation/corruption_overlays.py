"""The two corruptions that lay something over the image: ``snow`` (falling flakes) and ``frost`` (ice on the lens).

Their formulas are the generators' (see :mod:`vit.evaluation.corruption_ops` for what is re-implemented and how);
frost's texture is procedural here, since the photographs the generators crop are not ours to ship.
"""

from __future__ import annotations

import cv2
import numpy as np

from vit.evaluation.corruption_constants import FROST_PALETTES
from vit.evaluation.corruption_ops import magick_uint8, motion_blur_float, plasma_fractal, to_uint8, zoom_sum

SUPERSAMPLE = 4  # frost's strokes are drawn at this multiple of the image size, then area-averaged down
BRANCHES = 5  # ice-crystal stems per frost texture, each with SIDE_SHOOTS pairs of side shoots
SIDE_SHOOTS = 4


def snow(images: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """:func:`snow_apply` with flakes drawn from a normal distribution and a fall angle in [-135, -45) degrees per
    image."""
    mean, std = params[:2]
    n, h, w = images.shape[:3]
    noise = rng.normal(loc=mean, scale=std, size=(n, h, w))
    return snow_apply(images, params, noise, rng.uniform(-135, -45, size=n))


def snow_apply(images: np.ndarray, params: tuple, noise: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Flakes from given noise (N, H, W): zoomed (the generators' clipped zoom), set to 0 under the threshold, stored
    as 8-bit grey, motion-blurred at ``angles`` (ImageMagick's blur), added twice (upright and turned by 180 degrees)
    to the image lifted towards ``1.5 grey + 0.5``."""
    _, _, zoom, threshold, radius, sigma, keep = params
    x = images.astype(np.float32) / 255.0
    layer = zoom_sum(noise[..., None], (zoom,), dtype=np.float64)
    layer[layer < threshold] = 0
    flakes = (np.clip(layer, 0, 1) * 255).astype(np.uint8)
    flakes = magick_uint8(motion_blur_float(flakes, radius, sigma, angles)) / 255.0
    grey = x @ np.float32([0.299, 0.587, 0.114])  # OpenCV's RGB2GRAY weights
    x = keep * x + (1 - keep) * np.maximum(x, grey[..., None] * 1.5 + 0.5)
    return to_uint8(x + flakes + flakes[:, ::-1, ::-1])


def frost_apply(images: np.ndarray, image_weight: float, frost_weight: float, texture: np.ndarray) -> np.ndarray:
    """``clip(image_weight * image + frost_weight * texture, 0, 255)`` on 0-255 values, truncated to uint8."""
    return np.clip(image_weight * images + frost_weight * texture, 0, 255).astype(np.uint8)


def frost(images: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """:func:`frost_apply` with a :func:`frost_texture` per image. NOT an exact reproduction: the generators add
    crops of frost photographs; this texture has their colours and spread, not their structure."""
    n, h, w = images.shape[:3]
    return frost_apply(images, *params, frost_texture(rng, n, h, w))


def crystal_strokes(rng: np.random.Generator, n: int, h: int, w: int) -> np.ndarray:
    """(n, h, w) float32 in [0, 1]: :data:`BRANCHES` straight stems per image with :data:`SIDE_SHOOTS` pairs of side
    shoots at +-60 degrees, shorter towards the tip, drawn anti-aliased at :data:`SUPERSAMPLE` x (one OpenCV call per
    image) and area-averaged."""
    big_h, big_w, side = h * SUPERSAMPLE, w * SUPERSAMPLE, max(h, w) * SUPERSAMPLE
    start = rng.uniform(0, 1, size=(n, BRANCHES, 1, 2)) * (big_w, big_h)
    angle = rng.uniform(0, 2 * np.pi, size=(n, BRANCHES, 1))
    length = rng.uniform(0.3, 0.8, size=(n, BRANCHES, 1, 1)) * side
    shade = rng.uniform(0.5, 1.0, size=n).tolist()
    along = np.repeat(np.linspace(0.2, 0.8, SIDE_SHOOTS), 2)[:, None]  # (2 S, 1): each point twice, +-60 degrees
    turns = angle + np.tile([np.pi / 3, -np.pi / 3], SIDE_SHOOTS)  # (n, B, 2 S)
    heading = np.stack([np.cos(angle), np.sin(angle)], axis=-1)  # (n, B, 1, 2)
    bases = start + along * length * heading  # (n, B, 2 S, 2)
    tips = bases + 0.35 * (1 - along) * length * np.stack([np.cos(turns), np.sin(turns)], axis=-1)
    stems = np.stack([start, start + length * heading], axis=3)  # (n, B, 1, 2 points, 2)
    segments = np.concatenate([stems, np.stack([bases, tips], axis=3)], axis=2)  # (n, B, 1 + 2 S, 2, 2)
    segments = np.rint(segments).astype(np.int32).reshape(n, -1, 2, 1, 2)  # per image: two-point polylines
    out = np.empty((n, h, w), dtype=np.float32)
    canvas = np.empty((big_h, big_w), dtype=np.float32)
    for i in range(n):
        canvas[:] = 0
        cv2.polylines(canvas, list(segments[i]), False, shade[i], thickness=SUPERSAMPLE // 2, lineType=cv2.LINE_AA)
        out[i] = cv2.resize(canvas, (w, h), interpolation=cv2.INTER_AREA)
    return np.clip(out, 0, 1)


def frost_texture(rng: np.random.Generator, n: int, h: int, w: int) -> np.ndarray:
    """(n, h, w, 3) float64 in [0, 255]: a mottled plasma fractal plus :func:`crystal_strokes`, standardised per
    image, coloured by one of :data:`FROST_PALETTES` (the photograph each image would have drawn) as
    ``mean + std * texture`` per channel."""
    mapsize = 1 << max(max(h, w) - 1, 1).bit_length()
    pattern = plasma_fractal(rng, n, mapsize, 1.7)[:, :h, :w] + 1.5 * crystal_strokes(rng, n, h, w)
    pattern -= pattern.mean(axis=(1, 2), keepdims=True)
    pattern /= np.maximum(pattern.std(axis=(1, 2), keepdims=True), 1e-6)
    means, stds = (np.array([palette[k] for palette in FROST_PALETTES]) for k in (0, 1))
    photo = rng.integers(len(FROST_PALETTES), size=n)
    texture = means[photo][:, None, None, :] + stds[photo][:, None, None, :] * pattern[..., None]
    return np.clip(texture, 0, 255)
