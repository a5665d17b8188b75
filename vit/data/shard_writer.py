"""The shard writer of ``vit data prepare``: any dataset the data module knows as LitData shards that stream to every
rank (:func:`prepare_shards`).

``DEST/<split>/`` (``train``, ``val``) holds ``litdata.optimize`` output: per sample the JPEG bytes (re-encoded with
the shorter side at most ``short_side``, never upscaled; a JPEG file already that small keeps its own bytes), the
label, the source path (bytes: LitData would read a ``str`` ending in ``.jpg`` as an image file) and a sample id.
``DEST`` also holds ``vit-shards.json`` (class names, per-channel statistics, image counts, skipped files), written
last and atomically: it marks a finished DEST. A DEST without it but with our split folders is half-written and is
started over; a DEST holding anything else is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from vit.atomic import write_text
from vit.data.datasets import load_rgb
from vit.data.decoded import DecodeRequest
from vit.data.jpeg import decode, encode_jpeg, shrink
from vit.data.shard_format import FORMAT, META, SPLITS, read_meta, write_meta
from vit.data.specs import DATASETS, SMALL_IMAGE_MAX, SpecOptions
from vit.errors import UsageError

# the format's reader, re-exported beside its writer
__all__ = ["META", "prepare_shards", "read_meta"]

_SKIPPED = ".skipped"
_OURS = {META, _SKIPPED, *SPLITS}


def _encode(item: tuple[int, Any, int, str], short_side: int, skipped_dir: str, quality: int) -> Iterator[dict]:
    index, image, label, source = item
    original = None
    if isinstance(image, str):
        try:
            original = Path(image).read_bytes()
            image = load_rgb(image)
        except OSError as err:
            name = hashlib.sha1(source.encode()).hexdigest()[:16]
            write_text(Path(skipped_dir) / f"{name}.txt", f"{source}\t{' '.join(str(err).split())}\n")
            return
    yield {
        "image": _kept(original, image, short_side) or _encoded(shrink(image, short_side), quality),
        "label": label,
        "path": os.fsencode(source),
        "id": index,
    }


def _encoded(image: np.ndarray, quality: int) -> bytes:
    """JPEG bytes of a sample to store: small images (decoded once in training) keep their full chroma."""
    return encode_jpeg(image, quality, full_chroma=max(image.shape[:2]) <= SMALL_IMAGE_MAX)


def _kept(original: bytes | None, image: np.ndarray, short_side: int) -> bytes | None:
    """The source file's own bytes when they are a JPEG that needs no shrinking and decodes (here, without EXIF
    rotation or colour conversion) to the image read: no second generation of JPEG loss; ``None`` otherwise."""
    if original is None or original[:2] != b"\xff\xd8" or min(image.shape[:2]) > short_side:
        return None
    try:
        again = decode(original)
    except (ValueError, RuntimeError):  # CMYK and other JPEGs libjpeg-turbo does not turn into RGB
        return None
    if again.shape != image.shape or np.abs(again.astype(np.int16) - image).max() > 1:
        return None
    return original


def _inputs(dataset: str, data_dir: str | None) -> tuple[list[str], dict[str, list[tuple[int, Any, int, str]]], Any]:
    spec = DATASETS[dataset]
    options = SpecOptions.of(spec, data_dir)
    splits: dict[str, list[tuple[int, Any, int, str]]] = {}
    for split, train in zip(SPLITS, (True, False), strict=True):
        source = spec.source(options, train)
        if not isinstance(source, DecodeRequest):
            raise UsageError(f"dataset {dataset} is generated, not read: nothing to prepare")
        if source.images is not None:
            splits[split] = [
                (i, source.images[i], int(label), f"{dataset}:{source.split}/{i:06d}")
                for i, label in enumerate(source.labels)
            ]
        else:
            splits[split] = [(i, str(path), int(label), str(path)) for i, (path, label) in enumerate(source.samples)]
    return list(spec.classes(options)), splits, spec


def _check_dest(dest: Path) -> bool:
    """``True`` when ``dest`` is finished; removes a half-written one; refuses one that holds something else."""
    if not dest.exists():
        return False
    if not dest.is_dir():
        raise UsageError(f"--out {dest} is a file, not a folder; choose a new folder for the shards")
    entries = {entry.name for entry in os.scandir(dest)}
    foreign = sorted(entries - _OURS)
    if foreign:
        raise UsageError(
            f"--out {dest} holds other files ({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}), "
            "not shards of vit data prepare; choose an empty or new folder"
        )
    if META in entries:
        try:
            meta = json.loads((dest / META).read_text())
        except (OSError, ValueError) as err:
            raise UsageError(
                f"--out {dest}: {META} is unreadable ({err}); delete the folder and prepare again"
            ) from None
        if meta.get("format") != FORMAT:
            raise UsageError(f"--out {dest}: {META} is not a vit-shards file; choose another folder")
        return True
    for name in entries:  # half-written by an interrupted run: start over
        path = dest / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return False


def _channel_stats(images: Sequence[bytes]) -> tuple[list[float], list[float]]:
    from vit.data.jpeg import decode

    total = np.zeros(3)
    square = np.zeros(3)
    count = 0
    for data in images:
        pixels = decode(data).reshape(-1, 3).astype(np.float64) / 255.0
        total += pixels.sum(0)
        square += (pixels**2).sum(0)
        count += len(pixels)
    mean = total / count
    return mean.tolist(), np.sqrt(np.maximum(square / count - mean**2, 0.0)).tolist()


def prepare_shards(
    *,
    dataset: str,
    data_dir: str | None,
    out: str,
    short_side: int = 256,
    workers: int = 1,
    quality: int = 90,
    chunk_bytes: str = "64MB",
) -> dict[str, Any]:
    """Write ``dataset`` as LitData shards into ``out`` (see the module docstring) and return its metadata.

    Args:
        dataset: A dataset of the data module (``imagefolder``, ``imagenet``, ``cifar10``, ``cifar100``, ``digits``).
        data_dir: Its ``--data.data_dir``.
        out: The shard folder (created; a finished one is left as it is).
        short_side: Images whose shorter side is longer are shrunk to it; smaller ones keep their size.
        workers: Encoding processes of ``litdata.optimize``.
        quality: JPEG quality of the re-encoded images.
        chunk_bytes: Size of each shard file.

    Raises:
        UsageError: ``out`` holds something else, or the source cannot be read.
    """
    from litdata import StreamingDataset, optimize

    if short_side < 1 or workers < 1:
        raise UsageError(f"--short_side and --workers must be >= 1, got {short_side} and {workers}")
    dest = Path(out).expanduser()
    if _check_dest(dest):
        meta = json.loads((dest / META).read_text())
        if (meta["dataset"], meta["short_side"]) != (dataset, short_side):
            raise UsageError(
                f"--out {dest} already holds {meta['dataset']} prepared with --short_side {meta['short_side']}; "
                "choose another folder"
            )
        print(f"{dest} is already prepared ({meta['images']['train']} train, {meta['images']['val']} val images)")
        return meta
    classes, splits, spec = _inputs(dataset, data_dir)
    skipped_dir = dest / _SKIPPED
    skipped_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, int] = {}
    for split, items in splits.items():
        if split == "train":  # class folders come sorted: shards in that order would stream one class at a time, as
            # LitData reads a chunk's samples together; a fixed permutation mixes the classes in every chunk
            items = [items[i] for i in np.random.default_rng(0).permutation(len(items))]
        print(f"{split}: {len(items)} images -> {dest / split}")
        optimize(
            fn=partial(_encode, short_side=short_side, skipped_dir=str(skipped_dir), quality=quality),
            inputs=items,
            output_dir=str(dest / split),
            chunk_bytes=chunk_bytes,
            num_workers=workers,
            mode="overwrite",
            start_method="fork",
            verbose=True,
        )
        written[split] = len(StreamingDataset(str(dest / split)))
    skipped = sorted(p.read_text().rstrip("\n") for p in skipped_dir.glob("*.txt"))
    for line in skipped:
        print(f"skipped unreadable image {line}")
    if spec.mean is not None and spec.std is not None:
        mean, std = list(spec.mean), list(spec.std)
    else:
        train = StreamingDataset(str(dest / "train"))
        step = max(1, len(train) // 2000)  # statistics from at most ~2,000 images
        mean, std = _channel_stats([train[i]["image"] for i in range(0, len(train), step)])
    meta = {
        "dataset": dataset,
        "source": str(data_dir) if data_dir is not None else None,
        "short_side": short_side,
        "classes": classes,
        "mean": mean,
        "std": std,
        "source_images": {split: len(items) for split, items in splits.items()},
        "images": written,
        "skipped": skipped,
    }
    meta = write_meta(dest, meta)
    shutil.rmtree(skipped_dir, ignore_errors=True)
    print(f"prepared {dest}: {written['train']} train, {written['val']} val images, {len(skipped)} skipped")
    return meta
