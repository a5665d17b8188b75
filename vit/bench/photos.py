"""Synthetic photographs for the data suite: JPEG files with a photograph's size and statistics.

A smooth layout (an upscaled CIFAR picture when a folder of them is given, else smooth noise) plus 1/f ("pink")
texture, which gives JPEG files the size of real photographs of that resolution (natural images have a roughly 1/f
amplitude spectrum: Field, "Relations between the statistics of natural images...", JOSA A, 1987).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def photo_like(rng: Any, height: int, width: int, base: Any | None = None) -> Any:
    """A uint8 RGB image with a photograph's statistics: a smooth layout plus 1/f texture.

    ``base`` (any uint8 RGB image, e.g. a CIFAR picture) is upscaled for the layout; without it, upscaled smooth
    noise is used. The 1/f (pink) texture gives JPEG files the size of real photographs of this resolution.
    """
    import cv2
    import numpy as np

    if base is None:
        base = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    layout = cv2.resize(base, (width, height), interpolation=cv2.INTER_CUBIC).astype(np.float32)
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    amplitude = 1.0 / np.maximum(np.hypot(fy, fx), 1.0 / max(height, width))
    spectrum = amplitude[None] * (
        rng.standard_normal((3, *amplitude.shape)) + 1j * rng.standard_normal((3, *amplitude.shape))
    )
    texture = np.fft.irfft2(spectrum, s=(height, width)).transpose(1, 2, 0)
    texture = 0.7 * texture.mean(axis=2, keepdims=True) + 0.3 * texture  # mostly luminance, as in photographs
    texture *= 18.0 / texture.std()
    return np.clip(layout + texture, 0, 255).astype(np.uint8)


def make_data(
    folder: Path, count: int, jpeg_size: tuple[int, int], seed: int = 0, cifar_dir: Path | None = None
) -> tuple[list[Any], list[Path], str]:
    """Write ``count`` JPEG files of ``jpeg_size`` (height, width) into ``folder``, plus CIFAR-sized arrays.

    Args:
        folder: where the JPEG files go.
        count: how many JPEG files.
        jpeg_size: (height, width) of each file.
        seed: seed of the texture.
        cifar_dir: an ImageFolder of small photos (``train/<class>/*.jpg``, e.g. cifar10-mini) whose pictures give
            the layout and the 32x32 arrays; smooth noise without it.

    Returns:
        The 32x32 uint8 RGB arrays, the JPEG paths and a description of the content's source.
    """
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    bases: list[Any] = []
    if cifar_dir is not None and cifar_dir.is_dir():
        for path in sorted(cifar_dir.glob("train/*/*.jpg"))[:: max(1, 1000 // count)][:count]:
            with Image.open(path) as image:
                bases.append(np.asarray(image.convert("RGB")))
    source = f"cifar10-mini ({cifar_dir})" if bases else "smooth noise"
    height, width = jpeg_size
    files = []
    for i in range(count):
        base = bases[i % len(bases)] if bases else None
        image = photo_like(rng, height, width, base)
        path = folder / f"{i:04d}.jpg"
        Image.fromarray(image).save(path, quality=90)
        files.append(path)
    if bases:
        small = bases
    else:
        import cv2

        small = [cv2.resize(photo_like(rng, 64, 64), (32, 32), interpolation=cv2.INTER_AREA) for _ in range(100)]
    return small, files, source


def real_photos(folder: Path, count: int, jpeg_size: tuple[int, int], seed: int = 0) -> list[Path]:
    """Write ``count`` JPEG files (quality 90) of real photographs: random crops of scikit-learn's two sample
    photographs (427x640), each rescaled to ``jpeg_size`` (height, width), as ImageNet's typical 375x500.

    Args:
        folder: where the JPEG files go.
        count: how many files.
        jpeg_size: (height, width) of each file.
        seed: seed of the crops.
    """
    import cv2
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    height, width = jpeg_size
    files = []
    for i in range(count):
        photo = photos[i % len(photos)]
        scale = rng.uniform(0.5, 0.9)  # crops of half to 90 % of the photograph's sides, at its aspect ratio
        h, w = round(photo.shape[0] * scale), round(photo.shape[1] * scale)
        top, left = int(rng.integers(0, photo.shape[0] - h + 1)), int(rng.integers(0, photo.shape[1] - w + 1))
        crop = photo[top : top + h, left : left + w]
        image = cv2.resize(crop, (width, height), interpolation=cv2.INTER_AREA if w > width else cv2.INTER_CUBIC)
        path = folder / f"photo-{i:04d}.jpg"
        Image.fromarray(image).save(path, quality=90)
        files.append(path)
    return files
