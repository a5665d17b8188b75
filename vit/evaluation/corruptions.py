"""The 15 common corruptions at 5 severities (Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to
Common Corruptions and Perturbations", ICLR 2019): generated from clean images, or read from the released files.

- :func:`corrupt` corrupts a batch of uint8 ``(N, H, W, 3)`` images with CIFAR-10-C's constants when they are
  32 x 32 and ImageNet-C's otherwise (:mod:`~vit.evaluation.corruption_constants`), seeded and deterministic: the
  same images, name, severity and seed give the same pixels. Images are processed in blocks of about
  :data:`BLOCK_PIXELS` pixels, each with its own random generator, so memory stays bounded.
- :func:`iter_corrupted` walks the 15 x 5 cells, from ``"cifar10-c"`` (generated, cached on disk when a cache folder
  is given) or from a folder in the released CIFAR-10-C layout (``<corruption>.npy``: 5 severities x 10,000 uint8
  images in order; ``labels.npy``), memory-mapped copy-on-write: the arrays are writable (``torch.from_numpy`` takes
  them without a warning) and the files are never changed.

How each corruption is computed, and which cannot be reproduced exactly (frost: :data:`NOT_EXACT`), is told in
:mod:`~vit.evaluation.corruption_ops`. Only numpy, scipy, OpenCV and PIL are
imported: no torch.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from vit.atomic import atomic_write
from vit.env import available_cores
from vit.errors import DataError, UsageError
from vit.evaluation import corruption_ops as ops
from vit.evaluation.corruption_constants import CIFAR10_C, IMAGENET_C, Params
from vit.evaluation.corruption_overlays import frost, snow
from vit.explain.progress import Progress

log = logging.getLogger(__name__)

CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
)
"""The 15 corruptions of CIFAR-10-C and ImageNet-C, in the benchmark's order (noise, blur, weather, digital)."""

SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)
GENERATED = "cifar10-c"
"""The ``source`` of :func:`iter_corrupted` that generates the corruptions from the clean images."""
NOT_EXACT: dict[str, str] = {
    "frost": "a procedural ice texture with the colours and spread of the authors' frost photographs, which are not "
    "ours to ship, stands in for their crops",
}
"""Corruptions whose formula is not the generators' own, with the reason (for reports). In every corruption the random
draws come from another generator, so the pixels of the released files are matched in distribution, not one by one."""
BLOCK_PIXELS = 1 << 21  # pixels per block (2,048 CIFAR images, 41 at 224 px): bounds the float temporaries
CACHE_VERSION = 1  # bump when the pixels a corruption gives for the same images, severity and seed change

_OPS = {
    "gaussian_noise": ops.gaussian_noise,
    "shot_noise": ops.shot_noise,
    "impulse_noise": ops.impulse_noise,
    "defocus_blur": ops.defocus_blur,
    "glass_blur": ops.glass_blur,
    "motion_blur": ops.motion_blur,
    "zoom_blur": ops.zoom_blur,
    "snow": snow,
    "frost": frost,
    "fog": ops.fog,
    "brightness": ops.brightness,
    "contrast": ops.contrast,
    "elastic_transform": ops.elastic_transform,
    "pixelate": ops.pixelate,
    "jpeg_compression": ops.jpeg_compression,
}


def constants_for(height: int, width: int) -> dict[str, Params]:
    """CIFAR-10-C's constants for 32 x 32 images, ImageNet-C's (made for 224 x 224) for every other size."""
    return CIFAR10_C if (height, width) == (32, 32) else IMAGENET_C


def check_images(images: np.ndarray) -> np.ndarray:
    """``images`` as a uint8 ``(N, H, W, 3)`` array, or a :class:`~vit.errors.DataError` saying what they are."""
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] != 3:
        raise DataError(
            f"corruptions take uint8 images of shape (N, H, W, 3), got {images.dtype} {tuple(images.shape)}; "
            "convert them with np.asarray(images, dtype=np.uint8) channels last"
        )
    return images


def corrupt(images: np.ndarray, name: str, severity: int, seed: int = 0, *, workers: int | None = None) -> np.ndarray:
    """Corrupt a batch of images.

    Args:
        images: uint8 ``(N, H, W, 3)``.
        name: One of :data:`CORRUPTIONS`.
        severity: 1 (mildest) to 5.
        seed: Seed of the random parts; with the same images, name and severity it gives the same pixels.
        workers: Threads corrupting blocks of images at once (numpy, scipy, OpenCV and PIL release the GIL);
            ``None``: the cores this process may use. The pixels do not depend on it.

    Returns:
        uint8 ``(N, H, W, 3)``, a new array.
    """
    images = check_images(images)
    if name not in _OPS:
        raise UsageError(f"unknown corruption {name!r}: choose one of {', '.join(CORRUPTIONS)}")
    if severity not in SEVERITIES:
        raise UsageError(f"corruption severity {severity!r} is not one of 1, 2, 3, 4, 5")
    n, h, w = images.shape[:3]
    params = constants_for(h, w)[name][severity - 1]
    block = max(1, BLOCK_PIXELS // (h * w))
    out = np.empty_like(images)

    def run(index: int) -> None:
        rows = slice(index * block, (index + 1) * block)
        rng = np.random.default_rng([int(seed), CORRUPTIONS.index(name), severity, index])
        out[rows] = _OPS[name](np.ascontiguousarray(images[rows]), params, rng)

    blocks = range(-(-n // block))
    workers = min(len(blocks), workers or available_cores())
    if workers <= 1:
        for index in blocks:
            run(index)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(run, blocks))
    return out


def images_digest(images: np.ndarray) -> str:
    """A short hash of the pixels and shape of ``images`` (it names their cached corruptions)."""
    digest = hashlib.sha256(repr((images.shape, CACHE_VERSION)).encode())
    digest.update(np.ascontiguousarray(images).data)
    return digest.hexdigest()[:16]


def cache_file(cache_dir: str | Path, digest: str, name: str, severity: int, seed: int) -> Path:
    """``cache_dir/<name>-<severity>-seed<seed>-<digest>.npy``."""
    return Path(cache_dir) / f"{name}-{severity}-seed{seed}-{digest}.npy"


def cached_corruption(images: np.ndarray, name: str, severity: int, seed: int, path: Path | None) -> np.ndarray:
    """:func:`corrupt` read from ``path`` when a valid copy is there (memory-mapped), else computed and written there
    atomically. A copy that does not load or has another shape is computed again, never trusted; a folder that
    cannot be written keeps the result in memory only."""
    if path is not None and path.exists():
        try:
            stored = np.load(path, mmap_mode="c")
            if stored.shape == images.shape and stored.dtype == np.uint8:
                return stored
            raise ValueError(f"shape {stored.shape} {stored.dtype}, expected {images.shape} uint8")
        except (OSError, ValueError) as err:
            log.warning("ignoring the cached corruption %s (%s); computing it again", path, err)
    out = corrupt(images, name, severity, seed)
    if path is not None:
        try:
            with atomic_write(path) as f:
                np.save(f, out)
        except OSError as err:
            log.warning("cannot write the corruption cache %s (%s); keeping it in memory only", path, err)
    return out


def iter_corrupted(
    source: str | Path,
    images: np.ndarray | None,
    labels: np.ndarray | None,
    *,
    seed: int = 0,
    progress: bool = True,
    cache_dir: str | Path | None = None,
) -> Iterator[tuple[str, int, np.ndarray, np.ndarray]]:
    """The 15 corruptions x 5 severities, in :data:`CORRUPTIONS` order, severity 1 to 5.

    Args:
        source: ``"cifar10-c"`` to corrupt ``images`` here, or a folder in the released CIFAR-10-C layout (its own
            images and ``labels.npy`` are read; ``images`` and ``labels`` are not used).
        images: The clean uint8 ``(N, H, W, 3)`` images to corrupt.
        labels: Their ``(N,)`` classes, yielded with each cell.
        seed: Seed of the random corruptions.
        progress: Show the progress on stderr.
        cache_dir: Keep each generated cell there as ``.npy`` (named by the images' hash, corruption, severity and
            seed) and read it back, memory-mapped, next time; ``None``: no disk cache.

    Yields:
        ``(name, severity, images, labels)`` for each cell; the images are uint8 ``(N, H, W, 3)``.
    """
    if str(source) != GENERATED:
        yield from _released(Path(source), progress)
        return
    images = check_images(images)
    labels = np.asarray(labels)
    if len(labels) != len(images):
        raise DataError(f"{len(images)} images but {len(labels)} labels to corrupt")
    digest = images_digest(images) if cache_dir is not None else ""
    bar = Progress("corruptions", len(CORRUPTIONS) * len(SEVERITIES) * len(images), enabled=progress)
    try:
        for name in CORRUPTIONS:
            for severity in SEVERITIES:
                path = cache_file(cache_dir, digest, name, severity, seed) if cache_dir is not None else None
                yield name, severity, cached_corruption(images, name, severity, seed, path), labels
                bar.update(len(images))
    finally:
        bar.stop()
    bar.close(f"{len(CORRUPTIONS)} corruptions x {len(SEVERITIES)} severities of {len(images)} images")


def _released(folder: Path, progress: bool) -> Iterator[tuple[str, int, np.ndarray, np.ndarray]]:
    """The cells of a folder of released CIFAR-10-C files, each checked before the first is yielded."""
    if not folder.is_dir():
        raise DataError(
            f"{folder} is not a folder: pass {GENERATED!r} to generate the corruptions, or the folder of the released "
            "CIFAR-10-C files (<corruption>.npy and labels.npy)"
        )
    arrays = {name: _load_released(folder / f"{name}.npy", images=True) for name in CORRUPTIONS}
    labels = _load_released(folder / "labels.npy", images=False)
    for name, array in arrays.items():
        per_severity = len(array) // len(SEVERITIES)
        if len(array) % len(SEVERITIES) or len(labels) not in (len(array), per_severity):
            raise DataError(
                f"{folder / 'labels.npy'} holds {len(labels)} labels for the {len(array)} images of {name}.npy: the "
                f"released layout is {len(SEVERITIES)} severities x N images in order, with N or 5 x N labels"
            )
    bar = Progress("corruptions", sum(len(a) for a in arrays.values()), enabled=progress)
    try:
        for name, array in arrays.items():
            n = len(array) // len(SEVERITIES)
            for severity in SEVERITIES:
                rows = slice((severity - 1) * n, severity * n)
                yield name, severity, array[rows], labels[rows] if len(labels) == len(array) else labels
                bar.update(n)
    finally:
        bar.stop()
    bar.close(f"{len(CORRUPTIONS)} corruptions x {len(SEVERITIES)} severities read from {folder}")


def _load_released(path: Path, images: bool) -> np.ndarray:
    """One released file, memory-mapped and checked: uint8 (N, H, W, 3) images or (N,) integer labels."""
    if not path.is_file():
        raise DataError(f"{path} is missing: a CIFAR-10-C folder holds the 15 <corruption>.npy files and labels.npy")
    try:
        array = np.load(path, mmap_mode="c", allow_pickle=False)
    except (OSError, ValueError) as err:
        raise DataError(f"{path} is not a readable .npy file ({err}); download it again") from None
    wanted = "uint8 images of shape (N, H, W, 3)" if images else "integer labels of shape (N,)"
    if images and not (array.dtype == np.uint8 and array.ndim == 4 and array.shape[3] == 3):
        raise DataError(f"{path} holds {array.dtype} {tuple(array.shape)}, not {wanted}")
    if not images and not (np.issubdtype(array.dtype, np.integer) and array.ndim == 1):
        raise DataError(f"{path} holds {array.dtype} {tuple(array.shape)}, not {wanted}")
    return array
