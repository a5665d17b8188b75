"""Decoded once: a whole split of small images as one uint8 ``(N, 3, H, W)`` tensor, cached on disk.

Decoding 50,000 CIFAR JPEGs costs seconds; doing it again every epoch, image by image in loader workers, was most of
the cost of a CIFAR epoch on two cores. Here a split is decoded (and resized to ``img_size`` with the eval transform's
resize) once, then saved next to the data as ``<split>-<img_size>px-<hash>.pt``, where the hash covers the source
listing (every file's relative path, size and modification time), the image size and the format version: a changed
folder gets a new file name, so it is decoded again. The file carries a CRC-32 of its pixels; a cache that does not
load, does not match its listing or fails the check is rebuilt, never trusted. Writes go to a temporary file in the same
folder, renamed into place (atomic on POSIX), so an interrupted write never leaves a half cache behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import albumentations as A
import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch.utils.data import Dataset

from vit.atomic import atomic_write
from vit.data.datasets import DataError, load_rgb

log = logging.getLogger(__name__)

CACHE_VERSION = 1  # bump when the decoded pixels of the same files change (decoder, resize)
CACHE_FOLDER = ".vit-decoded"
MAX_DECODED_BYTES = 1 << 30  # above this, a split is kept at its source size and enlarged batch by batch on the device


def resize_op(img_size: int) -> A.Resize:
    """The eval transform's resize of small images: bilinear when enlarging, area averaging when shrinking.

    Area averaging anti-aliases: a 64x64 copy of a digit and its 8x8 original give nearly the same 16x16 input.

    Args:
        img_size: Output height and width.
    """
    return A.Resize(img_size, img_size, area_for_downscale="image")


def resize_images(images: np.ndarray, img_size: int) -> np.ndarray:
    """Resize uint8 (N, H, W, 3) images to ``img_size`` with :func:`resize_op`; returns (N, 3, img_size, img_size).

    Args:
        images: uint8 images, channels last.
        img_size: Output height and width.
    """
    if images.shape[1:3] != (img_size, img_size):
        op = resize_op(img_size)
        images = np.stack([op(image=image)["image"] for image in images]) if len(images) else images
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2))


class DecodedSplit(Dataset):
    """A split held as one uint8 tensor: ``split[i]`` is ``(image (3, H, W) uint8, label)``.

    Args:
        images: uint8 (N, 3, H, W), already at the model's image size.
        labels: int64 (N,).
        classes: Class names indexed by label.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, classes: Sequence[str]) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be uint8 (N, 3, H, W), got {images.dtype} {tuple(images.shape)}")
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = labels.to(torch.int64)
        self.classes = list(classes)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])

    def channel_stats(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel mean and standard deviation of all pixels, in [0, 1], rounded to 4 decimals (to normalise with).

        Exact and fast: from a 256-bin histogram of each channel.
        """
        values = torch.arange(256, dtype=torch.float64) / 255.0
        mean, std = [], []
        for c in range(3):
            counts = torch.bincount(self.images[:, c].reshape(-1), minlength=256).double()
            n = counts.sum()
            m = (counts * values).sum() / n
            mean.append(round(float(m), 4))
            std.append(round(float(((counts * (values - m) ** 2).sum() / n).sqrt()), 4))
        return tuple(mean), tuple(std)


def listing_hash(files: Sequence[str | Path], root: str | Path, *extra: object) -> str:
    """A short hash of a file listing: each file's path relative to ``root``, size and modification time.

    Args:
        files: The source files of the split.
        root: Paths are hashed relative to it, so a moved dataset keeps its cache.
        extra: Anything else the decoded pixels depend on (image size, class names).
    """
    digest = hashlib.sha256(json.dumps([CACHE_VERSION, [str(e) for e in extra]]).encode())
    for file in files:
        try:
            stat = os.stat(file)
        except FileNotFoundError:  # a broken symbolic link: the link itself; decoding names it (or skips it)
            stat = os.lstat(file)
        digest.update(f"{os.path.relpath(file, root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _crc(images: torch.Tensor) -> int:
    return zlib.crc32(images.contiguous().numpy().data)


def load_cache(path: Path) -> DecodedSplit | None:
    """The split cached at ``path``, or ``None`` when it is absent, unreadable or fails its checks (then logged).

    Args:
        path: A file written by :func:`save_cache`.
    """
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        images, labels, classes = state["images"], state["labels"], state["classes"]
        if state["version"] != CACHE_VERSION or _crc(images) != state["crc"] or len(images) != len(labels):
            raise ValueError("the pixels do not match the stored checksum")
        return DecodedSplit(images, labels, classes)
    except Exception as err:  # a cache is never trusted: anything wrong means decode again
        log.warning("ignoring the decoded-image cache %s (%s: %s); decoding again", path, type(err).__name__, err)
        return None


def save_cache(split: DecodedSplit, path: Path) -> bool:
    """Write ``split`` to ``path`` atomically (temporary file + rename); ``False`` when the folder is not writable.

    Args:
        split: The decoded split.
        path: Target file; its folder is created.
    """
    state = {
        "version": CACHE_VERSION,
        "images": split.images.contiguous(),
        "labels": split.labels,
        "classes": split.classes,
        "crc": _crc(split.images),
    }
    try:
        with atomic_write(path) as f:
            torch.save(state, f)
        return True
    except OSError as err:
        log.warning("cannot write the decoded-image cache %s (%s); keeping it in memory only", path, err)
        return False


def decode_files(
    samples: Sequence[tuple[str, int]], classes: Sequence[str], img_size: int, skip_corrupt: bool = False
) -> DecodedSplit:
    """Decode image files (in threads: OpenCV and PIL release the GIL) and resize them with :func:`resize_op`.

    Args:
        samples: ``(path, label)`` pairs.
        classes: Class names indexed by label.
        img_size: Output height and width.
        skip_corrupt: Leave out unreadable files (logging each) instead of raising ``DataError`` naming the first.
    """
    op = resize_op(img_size)

    def decode(path: str) -> np.ndarray | None:
        try:
            image = load_rgb(path)
        except OSError as err:
            if not skip_corrupt:
                raise DataError(
                    f"{err}. Delete or replace the file, or pass --data.skip_corrupt true to skip unreadable files."
                ) from None
            log.warning("skipping unreadable image %s: %s", path, err)
            return None
        return op(image=image)["image"] if image.shape[:2] != (img_size, img_size) else image

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        decoded = list(pool.map(decode, [path for path, _ in samples], chunksize=256))
    keep = [i for i, image in enumerate(decoded) if image is not None]
    if not keep:
        raise DataError(f"none of the {len(samples)} image files could be read")
    images = np.stack([decoded[i] for i in keep]).transpose(0, 3, 1, 2)
    labels = torch.tensor([samples[i][1] for i in keep], dtype=torch.int64)
    return DecodedSplit(torch.from_numpy(np.ascontiguousarray(images)), labels, classes)


def cached(path: Path | None, build: callable) -> DecodedSplit:  # type: ignore[valid-type]
    """The split cached at ``path`` if it is valid, else ``build()``, saved there (``path`` ``None``: no disk cache).

    Args:
        path: Cache file, named by :func:`cache_file`.
        build: Decodes the split.
    """
    if path is not None and (split := load_cache(path)) is not None:
        return split
    split = build()
    if path is not None and not writable(path.parent):
        if rank_zero_only.rank == 0:  # once, not once per DDP process
            log.warning(
                "%s is read-only: the decoded images stay in memory only (choose --data.cache_dir)", path.parent
            )
    elif path is not None and save_cache(split, path):
        log.info("decoded %d images once, cached in %s", len(split), path)
    return split


def writable(folder: Path) -> bool:
    """Whether ``folder`` (or its nearest existing parent) may be written: permitted, and not read-only by its mode
    bits (which root's ``os.access`` ignores: a shared dataset marked read-only stays untouched).

    Args:
        folder: The folder to write into.
    """
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return os.access(folder, os.W_OK) and bool(stat.S_IMODE(folder.stat().st_mode) & 0o222)


def cache_file(folder: Path, split: str, img_size: int, digest: str) -> Path:
    """``folder/.vit-decoded/<split>-<img_size>px-<digest>.pt``.

    Args:
        folder: The data folder (or the cache folder the user chose).
        split: ``train``, ``val``, ...
        img_size: Image size of the decoded pixels.
        digest: :func:`listing_hash` of the sources.
    """
    return Path(folder) / CACHE_FOLDER / f"{split}-{img_size}px-{digest}.pt"


@dataclass
class DecodeRequest:
    """What a dataset spec hands over to be decoded once: in-memory pixels or files, and where to cache them.

    Args:
        classes: Class names indexed by label.
        images: uint8 (N, H, W, 3) pixels already in memory (CIFAR pickles, digits), or ``None``.
        labels: Their labels.
        samples: ``(path, label)`` image files to decode, when ``images`` is ``None``.
        sources: Files the pixels come from (hashed into the cache name); empty: no disk cache.
        root: The data folder: the cache goes into ``root/.vit-decoded/`` unless a cache folder is chosen.
        split: Split name for the cache file.
    """

    classes: list[str]
    images: np.ndarray | None = None
    labels: Sequence[int] | None = None
    samples: Sequence[tuple[str, int]] | None = None
    sources: Sequence[str | Path] = ()
    root: Path | None = None
    split: str = "train"

    def decoded_size(self, img_size: int, source_size: int) -> int:
        """The size to store the pixels at: ``img_size``, unless that would pass ``MAX_DECODED_BYTES`` while
        enlarging (CIFAR at 224 px: 7.5 GB); then the source size, and the loader enlarges each batch on the device.

        Args:
            img_size: The model's image size.
            source_size: The larger side of the source images.
        """
        n = len(self.images) if self.images is not None else len(self.samples or [])
        if img_size > source_size and n * 3 * img_size * img_size > MAX_DECODED_BYTES:
            return source_size
        return img_size

    def decode(self, img_size: int, cache_dir: str | Path | None = None, skip_corrupt: bool = False) -> DecodedSplit:
        """Decode (or read from the cache) this split at ``img_size``.

        Args:
            img_size: Output height and width.
            cache_dir: Folder for the cache instead of the data folder.
            skip_corrupt: Leave out unreadable image files.
        """
        path = None
        folder = cache_dir if cache_dir is not None else self.root
        if self.sources and folder is not None:
            root = self.root if self.root is not None else Path(folder)
            digest = listing_hash(self.sources, root, img_size, self.classes)
            path = cache_file(Path(folder), self.split, img_size, digest)

        def build() -> DecodedSplit:
            if self.images is not None:
                pixels = torch.from_numpy(resize_images(self.images, img_size))
                return DecodedSplit(pixels, torch.as_tensor(np.asarray(self.labels)), self.classes)
            return decode_files(self.samples or [], self.classes, img_size, skip_corrupt)

        return cached(path, build)
