"""The 15 common corruptions of Hendrycks & Dietterich (ICLR 2019), batched over ``(N, H, W, 3)`` uint8 images.

Each corruption is ``op(images, params, rng) -> images``: ``params`` one severity's row of
:mod:`vit.evaluation.corruption_constants`, ``rng`` a :class:`numpy.random.Generator` that draws every random field
(noise, angles, fractals, shuffles) for the whole batch. The formulas are those of the authors' generators,
re-implemented on numpy / scipy / OpenCV / PIL; where a generator left a value as float, the result is truncated to
uint8 as their ``np.uint8(...)`` does. The random parts take the same distributions from another generator, so the
pixels of a released file are not reproduced, only its statistics. What differs beyond that:

- ``motion_blur`` (and the flakes of ``snow``): ImageMagick's ``MotionBlurImage`` (through Wand) is rewritten
  here from its definition: a one-sided Gaussian of ``2 ceil(radius) + 1`` taps, each tap a whole-pixel step along the
  angle rounded as ImageMagick rounds it, edge pixels repeated past the border, the sum stored as ImageMagick 6 (Q16)
  stores it in an 8-bit PNG. It equals ImageMagick 6.9's ``-motion-blur`` pixel for pixel (a test checks it where
  ImageMagick is installed); another ImageMagick version may round the last step differently.
- ``frost``: the generators add a crop of one of five frost photographs, which are not ours to ship. Here a seeded
  procedural texture (a plasma fractal for the mottling plus anti-aliased ice-crystal strokes) takes the per-channel
  mean and spread of the photograph it stands for (:data:`~vit.evaluation.corruption_constants.FROST_PALETTES`), so
  the colour and strength of the added layer match, but its structure is not the photographs': frost is NOT an exact
  reproduction.
- ``impulse_noise``: scikit-image's ``random_noise(mode="s&p")`` as it is today (each value flipped with probability
  ``amount``, then salt or pepper half and half); the release may have used an older version that drew a fixed count.
"""

from __future__ import annotations

import cv2
import numpy as np
from PIL import Image
from scipy import ndimage, sparse

CV_CHANNELS = 128  # OpenCV filters at most this many channels at once


def to_uint8(x: np.ndarray) -> np.ndarray:
    """``np.uint8(np.clip(x, 0, 1) * 255)``: the generators' clip, scale and truncation."""
    return (np.clip(x, 0, 1) * 255).astype(np.uint8)


def per_channel(fn, x: np.ndarray) -> np.ndarray:
    """Apply an OpenCV function ``fn((H, W, k)) -> (H', W', k)`` (a filter, a resize) to every channel of every image
    of ``x`` (N, H, W, C), 128 channels a call; returns (N, H', W', C)."""
    n, h, w, c = x.shape
    stacked = np.ascontiguousarray(x.transpose(1, 2, 0, 3).reshape(h, w, n * c))
    parts = [fn(stacked[:, :, i : i + CV_CHANNELS]) for i in range(0, n * c, CV_CHANNELS)]
    out = np.concatenate([p.reshape(*p.shape[:2], -1) for p in parts], axis=2)
    return out.reshape(*out.shape[:2], n, c).transpose(2, 0, 1, 3)


def gaussian(x: np.ndarray, sigma: float) -> np.ndarray:
    """scikit-image's ``gaussian(x, sigma, multichannel=True)`` over each image of (N, H, W, C) floats: edge values
    repeated, the kernel cut at 4 sigma."""
    return ndimage.gaussian_filter(x, sigma=(0, sigma, sigma, 0), mode="nearest", truncate=4.0)


def gaussian_noise(images: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """Additive Gaussian noise of standard deviation ``params[0]`` (in [0, 1] units)."""
    x = images / 255.0
    return to_uint8(x + rng.normal(size=x.shape, scale=params[0]))


def shot_noise(images: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """Poisson noise: ``poisson(x * c) / c``."""
    c = params[0]
    return to_uint8(rng.poisson(images / 255.0 * c) / c)


def impulse_noise(images: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """Salt and pepper: each value becomes 1 or 0 (half and half) with probability ``params[0]``."""
    x = images / 255.0
    flipped = rng.random(x.shape) < params[0]
    salted = rng.random(x.shape) < 0.5
    x[flipped & salted] = 1.0
    x[flipped & ~salted] = 0.0
    return to_uint8(x)


def disk_kernel(radius: float, alias_blur: float) -> np.ndarray:
    """The generators' defocus kernel: a disk of ``radius`` on a grid of at least 17 x 17, normalised, smoothed by a
    Gaussian of ``alias_blur`` (3 x 3 up to radius 8, else 5 x 5); returned without its all-zero margin."""
    half = 8 if radius <= 8 else int(radius)
    grid = np.arange(-half, half + 1)
    xx, yy = np.meshgrid(grid, grid)
    disk = np.asarray(xx**2 + yy**2 <= radius**2, dtype=np.float32)
    disk /= disk.sum()
    kernel = cv2.GaussianBlur(disk, ksize=(3, 3) if radius <= 8 else (5, 5), sigmaX=alias_blur)
    keep = int(np.abs(grid[np.nonzero(kernel.any(axis=0))]).max())
    return kernel[half - keep : half + keep + 1, half - keep : half + keep + 1]


def defocus_blur(images: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """Correlation with :func:`disk_kernel` (OpenCV's ``filter2D``, mirrored border)."""
    kernel = disk_kernel(*params).astype(np.float64)
    return to_uint8(per_channel(lambda x: cv2.filter2D(x, -1, kernel), images / 255.0))


def glass_shuffle(images: np.ndarray, delta: int, shifts: np.ndarray) -> np.ndarray:
    """The generators' local shuffle, in place: rows from ``H - delta`` down to ``delta + 1``, in each the columns from
    ``W - delta`` down to ``delta + 1``, pixel ``(h, w)`` takes the value of ``(h + dy, w + dx)``.

    The generators write a swap, ``x[h, w], x[h + dy, w + dx] = x[h + dy, w + dx], x[h, w]``, but on an RGB array
    both sides are views: ``(h, w)`` gets its neighbour's value and the neighbour keeps its own. With ``delta`` 1
    (every CIFAR-10-C severity) each source lies up or left of its target, not yet visited, so a round reads the
    image as it was before the round and is one gather; with larger shifts a source may already have been visited,
    and the pixels are visited one by one as the generators do.

    Args:
        images: uint8 (N, H, W, C), changed in place.
        delta: Largest shift.
        shifts: int (rounds, H - 2 delta, W - 2 delta, N, 2): ``(dx, dy)`` of every step, in ``[-delta, delta)``.
    """
    n, h, w = images.shape[:3]
    rows, cols = np.arange(h - delta, delta, -1), np.arange(w - delta, delta, -1)  # the visiting order
    index = np.arange(n)
    for step in shifts:
        if delta == 1:
            r, c = rows[:, None, None], cols[None, :, None]
            images[index, r, c] = images[index, r + step[..., 1], c + step[..., 0]]
            continue
        for i, r in enumerate(rows):
            for j, c in enumerate(cols):
                images[:, r, c] = images[index, r + step[i, j, :, 1], c + step[i, j, :, 0]]
    return images


def glass_blur(images: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """Gaussian blur, local pixel shuffling (:func:`glass_shuffle`), Gaussian blur again."""
    sigma, delta, rounds = params
    n, h, w = images.shape[:3]
    x = (gaussian(images / 255.0, sigma) * 255).astype(np.uint8)
    shifts = rng.integers(-delta, delta, size=(rounds, h - 2 * delta, w - 2 * delta, n, 2), dtype=np.int8)
    return to_uint8(gaussian(glass_shuffle(x, delta, shifts) / 255.0, sigma))


def motion_offsets(radius: float, angle: float) -> np.ndarray:
    """ImageMagick's taps of a motion blur at ``angle`` degrees: int (width, 2) ``(dx, dy)`` whole-pixel steps."""
    width = int(2 * np.ceil(radius) + 1)
    point_x, point_y = width * np.sin(np.deg2rad(angle)), width * np.cos(np.deg2rad(angle))
    steps = np.arange(width)[:, None] * np.array([point_y, point_x]) / np.hypot(point_x, point_y)
    return np.ceil(steps - 0.5).astype(np.int64)


def motion_blur_float(images: np.ndarray, radius: float, sigma: float, angles: np.ndarray) -> np.ndarray:
    """ImageMagick's ``MotionBlurImage`` on (N, H, W, C) values, one angle (degrees) per image, before rounding.

    Output pixel ``(y, x)`` is ``sum_i k_i * image(y + dy_i, x + dx_i)`` over :func:`motion_offsets`, edge pixels
    repeated past the border, with ``k_i`` proportional to ``exp(-i^2 / (2 sigma^2))``. Images whose taps round
    alike are shifted together.
    """
    n, h, w, _ = images.shape
    width = int(2 * np.ceil(radius) + 1)
    taps = np.exp(-(np.arange(width) ** 2) / (2.0 * sigma**2))
    taps /= taps.sum()
    offsets = np.stack([motion_offsets(radius, a) for a in angles]).reshape(n, -1)
    patterns, which = np.unique(offsets, axis=0, return_inverse=True)
    out = np.empty(images.shape, dtype=np.float64)
    pad = width - 1
    for pattern, steps in enumerate(patterns.reshape(len(patterns), width, 2)):
        index = np.flatnonzero(which.reshape(-1) == pattern)
        padded = np.pad(images[index], ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="edge").astype(np.float64)
        acc = np.zeros((len(index), h, w, images.shape[3]))
        for tap, (dx, dy) in zip(taps, steps, strict=True):
            acc += tap * padded[:, pad + dy : pad + dy + h, pad + dx : pad + dx + w]
        out[index] = acc
    return out


def magick_uint8(x: np.ndarray) -> np.ndarray:
    """0-255 values as ImageMagick 6 (Q16) stores them in an 8-bit PNG: rounded to a 16-bit quantum, which is then
    divided by 257 and truncated."""
    quanta = np.clip(x, 0, 255)
    quanta *= 257
    quanta += 0.5
    np.floor(quanta, out=quanta)
    quanta /= 257  # a whole quantum over 257 is exact at multiples of 257 and 1/257 short of one elsewhere
    return np.floor(quanta, out=quanta).astype(np.uint8)


def motion_blur(images: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """:func:`motion_blur_float` at an angle drawn uniformly in [-45, 45) degrees per image, stored as ImageMagick
    stores it (:func:`magick_uint8`)."""
    angles = rng.uniform(-45, 45, size=len(images))
    return magick_uint8(motion_blur_float(images, *params, angles))


def zoom_matrix(size: int, zoom: float) -> np.ndarray:
    """The generators' ``clipped_zoom`` along one axis as a (size, size) matrix: the centred ``ceil(size / zoom)``
    pixels enlarged by scipy's ``zoom(order=1)`` (corner pixels aligned) to ``round(crop * zoom)`` and centre-cropped
    back to ``size``."""
    crop = int(np.ceil(size / zoom))
    top = (size - crop) // 2
    zoomed = int(round(crop * zoom))
    trim = (zoomed - size) // 2
    coords = (np.arange(size) + trim) * ((crop - 1) / (zoomed - 1) if zoomed > 1 else 0.0)
    low = np.minimum(np.floor(coords).astype(np.int64), crop - 1)
    frac = coords - low
    matrix = np.zeros((size, size))
    matrix[np.arange(size), top + low] = 1 - frac
    high = np.minimum(low + 1, crop - 1)
    matrix[np.arange(size), top + high] += frac
    return matrix


def zoom_sum(x: np.ndarray, factors: tuple[float, ...], dtype: type = np.float32) -> np.ndarray:
    """The sum of the :func:`zoom_matrix` zooms of (N, H, W, C) images, one per factor, as one sparse (H W, H W)
    matrix ``sum_z kron(M_z, M_z)`` applied to every image and channel at once (each row has at most 4 non-zeros
    per distinct zoom, so this costs a few multiply-adds per pixel and factor), in ``dtype`` (zoom blur: float32 like
    the generators; snow's flakes: float64)."""
    n, h, w, c = x.shape
    operator = sum(
        sparse.kron(sparse.csr_matrix(zoom_matrix(h, z)), sparse.csr_matrix(zoom_matrix(w, z)), format="csr")
        for z in factors
    )
    columns = np.ascontiguousarray(x.transpose(1, 2, 0, 3), dtype=dtype).reshape(h * w, n * c)
    total = operator.astype(dtype) @ columns  # (H * W, N * C)
    return total.reshape(h, w, n, c).transpose(2, 0, 1, 3)


def zoom_blur(images: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """The mean of the image and its zooms by each of ``params[0]``, computed in float32 as the generators do."""
    factors = params[0]
    x = (images / 255.0).astype(np.float32)
    return to_uint8((x + zoom_sum(x, factors)) / (len(factors) + 1))


def plasma_fractal(rng: np.random.Generator, n: int, mapsize: int, wibbledecay: float) -> np.ndarray:
    """The generators' diamond-square height maps, (n, mapsize, mapsize) in [0, 1]: each midpoint is the mean of its
    four neighbours plus ``wibble * uniform(-wibble, wibble)``, ``wibble`` starting at 100 and divided by
    ``wibbledecay`` at every halving of the step."""
    maps = np.zeros((n, mapsize, mapsize))
    step, wibble = mapsize, 100.0

    def wibbled_mean(total: np.ndarray) -> np.ndarray:
        return total / 4 + wibble * rng.uniform(-wibble, wibble, total.shape)

    while step >= 2:
        half = step // 2
        corners = maps[:, ::step, ::step]
        squares = corners + np.roll(corners, -1, axis=1)
        squares += np.roll(squares, -1, axis=2)
        maps[:, half::step, half::step] = wibbled_mean(squares)
        centres, corners = maps[:, half::step, half::step], maps[:, ::step, ::step]
        left = centres + np.roll(centres, 1, axis=1) + corners + np.roll(corners, -1, axis=2)
        maps[:, ::step, half::step] = wibbled_mean(left)
        top = centres + np.roll(centres, 1, axis=2) + corners + np.roll(corners, -1, axis=1)
        maps[:, half::step, ::step] = wibbled_mean(top)
        step //= 2
        wibble /= wibbledecay
    maps -= maps.min(axis=(1, 2), keepdims=True)
    return maps / maps.max(axis=(1, 2), keepdims=True)


def fog_apply(images: np.ndarray, strength: float, fractal: np.ndarray) -> np.ndarray:
    """Fog with given height maps (N, >= H, >= W): ``(x + strength * map) * max(x) / (max(x) + strength)``."""
    h, w = images.shape[1:3]
    x = images / 255.0
    peak = x.max(axis=(1, 2, 3), keepdims=True)
    x += strength * fractal[:, :h, :w, None]
    return to_uint8(x * peak / (peak + strength))


def fog(images: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """:func:`fog_apply` with a :func:`plasma_fractal` per image (32 x 32 for CIFAR, else the next power of two)."""
    strength, decay = params
    mapsize = 1 << max(int(max(images.shape[1:3])) - 1, 1).bit_length()
    return fog_apply(images, strength, plasma_fractal(rng, len(images), mapsize, decay))


def rgb_to_hsv(x: np.ndarray) -> np.ndarray:
    """The hexcone HSV of (..., 3) RGB values in [0, 1], with scikit-image's ``rgb2hsv`` conventions (which the
    generators call): where channels tie for the maximum, blue's hue formula wins over green's over red's; grey has
    hue and saturation 0."""
    red, green, blue = x[..., 0], x[..., 1], x[..., 2]
    value = np.maximum(np.maximum(red, green), blue)  # x.max(-1), faster over a last axis of 3
    delta = value - np.minimum(np.minimum(red, green), blue)
    grey = delta == 0
    safe = np.where(grey, 1.0, delta)
    hue = np.where(red == value, (green - blue) / safe, 0.0)
    hue = np.where(green == value, 2.0 + (blue - red) / safe, hue)
    hue = np.where(blue == value, 4.0 + (red - green) / safe, hue)
    hue = np.where(grey, 0.0, (hue / 6.0) % 1.0)
    saturation = np.where(grey, 0.0, delta / np.where(value == 0, 1.0, value))
    return np.stack([hue, saturation, value], axis=-1)


def hsv_to_rgb(hsv: np.ndarray) -> np.ndarray:
    """The inverse of :func:`rgb_to_hsv`, as scikit-image's ``hsv2rgb`` computes it: the hue's sextant picks which of
    ``v``, ``p = v (1 - s)``, ``q = v (1 - f s)`` and ``t = v (1 - (1 - f) s)`` each channel takes."""
    hue, saturation, value = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    sextant = np.floor(hue * 6)
    f = hue * 6 - sextant
    p = value * (1 - saturation)
    q = value * (1 - f * saturation)
    t = value * (1 - (1 - f) * saturation)
    options = np.stack([value, p, q, t], axis=-1)  # each channel takes one of them, by sextant:
    table = np.array([[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]])  # R, G, B: (v t p) (q v p) ...
    index = sextant.astype(np.int64) % 6
    return np.stack([np.take_along_axis(options, table[k][index][..., None], -1)[..., 0] for k in range(3)], -1)


def brightness(images: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """``params[0]`` added to the HSV value (:func:`rgb_to_hsv`), clipped to 1, and back to RGB."""
    hsv = rgb_to_hsv(images / 255.0)
    hsv[..., 2] = np.clip(hsv[..., 2] + params[0], 0, 1)
    return to_uint8(hsv_to_rgb(hsv))


def contrast(images: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """Each channel pulled towards its image mean: ``(x - mean) * c + mean``."""
    x = images / 255.0
    means = x.mean(axis=(1, 2), keepdims=True)
    return to_uint8((x - means) * params[0] + means)


def pixelate(images: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """PIL's box resize to ``int(side * c)`` and back."""
    h, w = images.shape[1:3]
    small = (int(w * params[0]), int(h * params[0]))
    box = Image.Resampling.BOX
    return np.stack([np.asarray(Image.fromarray(im).resize(small, box).resize((w, h), box)) for im in images])


def jpeg_compression(images: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """JPEG at quality ``params[0]``, decoded again: the generators' PIL round trip, run through OpenCV's libjpeg
    (the same quantisation tables, 4:2:0 chroma and decoder settings give the same pixels, several times faster)."""
    out = np.empty_like(images)
    for i, image in enumerate(images):
        _, encoded = cv2.imencode(".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, params[0]])
        out[i] = cv2.imdecode(encoded, cv2.IMREAD_COLOR_RGB)
    return out


def elastic_apply(images: np.ndarray, jitter: np.ndarray, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """The generators' elastic transform with given random parts: an affine warp that moves three points by
    ``jitter`` (OpenCV, mirrored border), then every pixel displaced by ``(dx, dy)`` with bilinear interpolation
    (scipy's ``map_coordinates``, half-sample symmetric border).

    Args:
        images: uint8 (N, H, W, C).
        jitter: (N, 3, 2) moves of the points ``centre + s``, ``(centre_0 + s, centre_1 - s)``, ``centre - s``, with
            ``centre = (H // 2, W // 2)`` and ``s = min(H, W) // 3`` (read by OpenCV as ``(x, y)``, as written).
        dx: (N, H, W) displacement along the width.
        dy: (N, H, W) displacement along the height.
    """
    n, h, w, c = images.shape
    x = images.astype(np.float32) / 255.0
    centre, size = np.float32((h, w)) // 2, min(h, w) // 3
    src = np.float32([centre + size, [centre[0] + size, centre[1] - size], centre - size])
    for i in range(n):
        affine = cv2.getAffineTransform(src, src + jitter[i].astype(np.float32))
        x[i] = cv2.warpAffine(x[i], affine, (w, h), borderMode=cv2.BORDER_REFLECT_101).reshape(h, w, c)
    return to_uint8(bilinear_reflect(x, np.arange(h)[:, None] + dy, np.arange(w) + dx))


def bilinear_reflect(images: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """scipy's ``map_coordinates(order=1, mode="reflect")`` of each image of (N, H, W, C) at (N, H, W) fractional
    ``rows`` and ``cols``: bilinear between the four nearest pixels, indices past the border mirrored about it
    (``d c b a | a b c d | d c b a``). Returns float32."""
    n, h, w, c = images.shape
    r0, c0 = np.floor(rows), np.floor(cols)
    fr, fc = (rows - r0).astype(np.float32)[..., None], (cols - c0).astype(np.float32)[..., None]
    r0, c0 = r0.astype(np.int64), c0.astype(np.int64)
    base = np.arange(n)[:, None, None] * (h * w)
    ra, rb = base + _mirror(r0, h) * w, base + _mirror(r0 + 1, h) * w
    ca, cb = _mirror(c0, w), _mirror(c0 + 1, w)
    pixels = images.reshape(-1, c)
    top = pixels.take(ra + ca, axis=0) * (1 - fc) + pixels.take(ra + cb, axis=0) * fc
    bottom = pixels.take(rb + ca, axis=0) * (1 - fc) + pixels.take(rb + cb, axis=0) * fc
    return (top * (1 - fr) + bottom * fr).astype(np.float32)


def _mirror(index: np.ndarray, size: int) -> np.ndarray:
    """``index`` mirrored into ``[0, size)`` about the half-pixel borders."""
    index = np.mod(index, 2 * size)
    return np.where(index >= size, 2 * size - 1 - index, index)


def elastic_transform(images: np.ndarray, params: tuple, rng: np.random.Generator) -> np.ndarray:
    """:func:`elastic_apply` with ``jitter`` uniform in ``±params[2]`` and displacements ``params[0]`` times uniform
    noise in [-1, 1] smoothed by a Gaussian of ``params[1]`` (mirrored border, cut at 3 sigma)."""
    alpha, sigma, shift = params
    n, h, w = images.shape[:3]
    jitter = rng.uniform(-shift, shift, size=(n, 3, 2))

    def field() -> np.ndarray:
        noise = rng.uniform(-1, 1, size=(n, h, w))
        return (ndimage.gaussian_filter(noise, sigma=(0, sigma, sigma), mode="reflect", truncate=3) * alpha).astype(
            np.float32
        )

    dx = field()
    return elastic_apply(images, jitter, dx, field())
