"""Data suite: images/s of one loader worker for our pipelines and torchvision v2 equivalents.

The CIFAR preset on 32x32 images (per image in a worker, and batched on a whole uint8 batch as the decoded-once loader
runs it, ``vit.data.BatchAugment``), and JPEG decode -> random-resized crop 224 -> flip -> normalise, with the
normalisation in the worker or, as ``ImageDataModule`` does it, on the device after the copy. Albumentations, OpenCV,
torchvision and ``vit.data`` are imported here only, inside the suite.

The pipelines themselves, each beside its torchvision twin, are :mod:`vit.bench.data_pipelines`; this module times
them and reports.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from vit.bench.data_pipelines import (
    BATCH,
    BATCHED,
    CIFAR,
    CROP,
    DECODE,
    JITTER,
    MINE,
    SHARD_CROP,
    SHARDS,
    Pipeline,
    cifar_pipelines,
    jpeg_pipelines,
    shard_pipelines,
)
from vit.bench.harness import check, log, print_table, summarize, write_report
from vit.bench.photos import make_data, real_photos
from vit.env import device_name

DATA_CIFAR_TARGET = 5000.0  # images/s per worker
DATA_JPEG_TARGET = 600.0
DATA_SHARD_TARGET = 1200.0  # images per CPU second per worker: shard -> random-resized crop 224 -> flip
DATA_SHARD_SPEEDUP = 2.0  # over the folder loader (load_rgb -> albumentations), same photographs, one worker
SHORT_SIDE = 256  # what vit data prepare shrinks ImageNet-size images to
DATA_BATCH_TARGET = 50_000.0  # images/s per core, the batched CIFAR augmentation of the decoded-once loader


def per_sample_rate(fn: Callable[[Any], Any], items: Sequence[Any], samples: int) -> tuple[float, float]:
    """Calls per wall-clock second and per CPU second of ``fn`` on ``samples`` items in turn, in this process.

    With one thread (:func:`one_worker`) the process CPU time is the work itself: it does not count waiting for a
    core that another process holds, so it is the steadier number on a shared machine.
    """
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(samples):
        fn(items[i % len(items)])
    return samples / (time.perf_counter() - wall), samples / max(time.process_time() - cpu, 1e-9)


@contextlib.contextmanager
def one_worker() -> Iterator[None]:
    """Run as one data-loading worker does: one torch thread and one OpenCV thread (both restored afterwards)."""
    import cv2

    threads, cv2_threads = torch.get_num_threads(), cv2.getNumThreads()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    try:
        with warnings.catch_warnings():
            # PIL's arrays are read-only; torch warns when wrapping them, and nothing here writes to them.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            yield
    finally:
        torch.set_num_threads(threads)
        cv2.setNumThreads(cv2_threads)


def shard_samples(folder: Path, files: Sequence[Path]) -> list[bytes]:
    """The JPEG bytes of ``files`` as ``vit data prepare`` stores them (shorter side at most 256), read back from
    LitData shards written into ``folder``."""
    import numpy as np
    from litdata import StreamingDataset
    from PIL import Image

    from vit.data.shard_writer import prepare_shards

    root = folder / "tree"
    for split in ("train", "val"):
        (root / split / "photos").mkdir(parents=True)
    for i, path in enumerate(files):
        split = "val" if i == 0 else "train"
        with Image.open(path) as image:
            np.asarray(image)  # fully readable
        (root / split / "photos" / path.name).symlink_to(path)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        prepare_shards(dataset="imagefolder", data_dir=str(root), out=str(folder / "shards"), short_side=SHORT_SIDE)
    shards = StreamingDataset(str(folder / "shards" / "train"))
    return [bytes(shards[i]["image"]) for i in range(len(shards))]


def check_outputs(pipelines: Sequence[Pipeline], inputs: dict[str, Sequence[Any]]) -> None:
    """The pipelines must produce what the model (after the device step) eats: (3, size, size), uint8 or float32."""
    for name, family, _, where, fn, kind in pipelines:
        out = fn(inputs[kind][0])
        if name != DECODE:
            size = 224 if kind in ("jpeg", "shard") else 32
            shape = (BATCH, 3, size, size) if kind == "batch" else (3, size, size)
            dtype = torch.uint8 if where == "device" else torch.float32
            if tuple(out.shape) != shape or out.dtype != dtype:
                raise RuntimeError(f"{family} {name} ({where}): got {tuple(out.shape)} {out.dtype}")


def time_pipelines(
    pipelines: Sequence[Pipeline], inputs: dict[str, Sequence[Any]], *, rounds: int, samples: int
) -> list[list[tuple[float, float]]]:
    """(wall, CPU) images/s of every pipeline in every round, the rounds alternating the order; ``samples`` JPEG
    samples per round and pipeline (four times as many CIFAR ones)."""
    per_round = samples
    rates: list[list[tuple[float, float]]] = [[] for _ in pipelines]  # (wall, CPU) images/s per round
    for r in range(rounds):
        order = range(len(pipelines)) if r % 2 == 0 else reversed(range(len(pipelines)))  # drift hits all alike
        for i in order:
            *_, fn, kind = pipelines[i]
            if kind == "batch":  # as many images as the per-image CIFAR rows, at least two calls
                calls = max(2, per_round * 4 // BATCH)
                wall, cpu = per_sample_rate(fn, inputs[kind], calls)
                rates[i].append((wall * BATCH, cpu * BATCH))
            else:
                count = per_round * (4 if kind == "cifar" else 1)
                rates[i].append(per_sample_rate(fn, inputs[kind], count))
        log(f"data round {r + 1}/{rounds} done")
    return rates


def run_data_suite(
    *,
    report: dict[str, Any],
    images: int = 200,
    samples: int = 300,
    rounds: int = 5,
    jpeg_size: Sequence[int] = (375, 500),
    cifar_mini: str | None = None,
    seed: int = 0,
    json_path: str | None = None,
) -> None:
    """Measure every pipeline with one worker on the CPU, print the table and the checks, and fill
    ``report["data"]``.

    Args:
        report: The report to fill (written to ``json_path`` when given).
        images: JPEG files to generate.
        samples: JPEG samples per round and pipeline (CIFAR: four times as many).
        rounds: Rounds, alternating the order of the pipelines.
        jpeg_size: Height and width of the JPEG files.
        cifar_mini: Folder of small photos (``<class>/*.jpg`` or ``train/<class>/*.jpg``) for realistic content.
        seed: Seed of the generated images and the augmentations.
        json_path: Where the report is written.
    """
    height, width = jpeg_size
    with one_worker(), tempfile.TemporaryDirectory(prefix="vit-bench-") as tmp:
        log(f"data: writing {images} JPEG files of {height}x{width}")
        cifar_dir = Path(cifar_mini) if cifar_mini else None
        (Path(tmp) / "small").mkdir()
        cifar_images, _, _ = make_data(Path(tmp) / "small", images, (32, 32), seed, cifar_dir)
        # real photographs: random crops of scikit-learn's two sample photographs, rescaled to ImageNet's size
        files = real_photos(Path(tmp), images, (height, width), seed)
        source = "random crops of sklearn.datasets.load_sample_images (china.jpg, flower.jpg) rescaled"
        shard_items = shard_samples(Path(tmp), files)
        sizes = [f.stat().st_size for f in files]
        cifar_rows, batch = cifar_pipelines(cifar_images, seed=seed)
        pipelines = cifar_rows + jpeg_pipelines() + shard_pipelines(seed)
        inputs = {"cifar": cifar_images, "jpeg": files, "batch": [batch], "shard": shard_items}
        check_outputs(pipelines, inputs)
        rates = time_pipelines(pipelines, inputs, rounds=rounds, samples=samples)

    rows = data_rows(pipelines, rates, jpeg_size=(height, width))
    report["data"] = data_report(rows, sizes, source, jpeg_size=(height, width))
    print_data_table(rows, report["data"]["jpeg"]["mean_kib"], len(sizes), rounds=rounds, jpeg_size=(height, width))
    report["data"]["checks"] = data_checks(rows)
    write_report(json_path, report)


def data_rows(
    pipelines: Sequence[Pipeline], rates: Sequence[Sequence[tuple[float, float]]], *, jpeg_size: Sequence[int]
) -> list[dict[str, Any]]:
    """One table row per pipeline: its labels and the medians and spreads of its wall-clock and CPU rates."""
    rows = []
    for (name, family, decoder, where, _, kind), values in zip(pipelines, rates, strict=True):
        spread = summarize([wall for wall, _ in values])
        cpu_spread = summarize([cpu for _, cpu in values])
        rows.append(
            {
                "pipeline": name,
                "implementation": family,
                "decoder": decoder,
                "normalise": where,
                "input": {
                    "cifar": "32x32 uint8 array",
                    "batch": f"{BATCH}x3x32x32 uint8 tensor",
                    "jpeg": f"{jpeg_size[0]}x{jpeg_size[1]} JPEG q90",
                    "shard": f"shard sample (shorter side {SHORT_SIDE}, q90)",
                }[kind],
                "images_per_s": spread["median"],
                "ms_per_image": 1e3 / spread["median"],
                "spread": spread,
                "images_per_cpu_s": cpu_spread["median"],
                "cpu_spread": cpu_spread,
            }
        )
    return rows


def data_report(
    rows: list[dict[str, Any]], sizes: Sequence[int], source: str, *, jpeg_size: Sequence[int]
) -> dict[str, Any]:
    """The report's data section (its checks are added later): the rows, the JPEG files and notes."""
    return {
        "threads": 1,  # torch and OpenCV, whatever the process default in "threads" above
        "results": rows,
        "jpeg": {
            "files": len(sizes),
            "height_width": list(jpeg_size),
            "quality": 90,
            "mean_kib": sum(sizes) / len(sizes) / 1024,
            "content": source + " upscaled with 1/f texture",
        },
        "notes": [
            f"batched rows: one call augments a {BATCH}-image uint8 batch (BatchAugment, the decoded-once loader's "
            "augmentation, also on the GPU there); images/s = calls x batch / seconds, one thread",
            "images per CPU s: per process CPU second (time.process_time) with one thread, the work a core does; "
            "the checks read it (the wall-clock images/s also count waiting for a core on a shared machine)",
            "one worker = main process, torch.set_num_threads(1), cv2.setNumThreads(1); per-sample loop, files read "
            "from the page cache",
            "normalise 'device': the worker's output is the uint8 tensor ImageDataModule's workers return; the data "
            "module normalises the batch after the copy to the accelerator (on_after_batch_transfer), outside the "
            "worker. 'worker': A.Normalize / v2.Normalize in the worker (ImageDataModule(normalize_on_device=False))",
            "PIL draft() is not used: RandomResizedCrop may keep the whole image, so decoding at reduced size "
            "would lose resolution below the 224 output (draft((224, 224)) cannot reduce 500x375 anyway)",
            "torchvision RRC uses bicubic with antialias=True (its default antialiasing); albumentations uses "
            "cv2 INTER_CUBIC",
        ],
    }


def print_data_table(
    rows: list[dict[str, Any]], mean_kib: float, files: int, *, rounds: int, jpeg_size: Sequence[int]
) -> None:
    """Print the data table, the JPEG files' size and what decoding alone allows one worker."""
    print_table(
        f"data (one worker: 1 thread, {device_name('cpu')}, median of {rounds} rounds)",
        rows,
        [
            ("pipeline", "pipeline", ""),
            ("implementation", "implementation", ""),
            ("decoder", "decoder", ""),
            ("normalise", "normalise", ""),
            ("images_per_s", "images/s", ".0f"),
            ("ms_per_image", "ms/image", ".3f"),
            ("images_per_cpu_s", "images per CPU s", ".0f"),
        ],
    )
    print(f"\nJPEG files: {files} × {jpeg_size[0]}x{jpeg_size[1]}, quality 90, mean {mean_kib:.0f} KiB")
    decode_rate = next(r["images_per_s"] for r in rows if r["pipeline"] == DECODE and r["implementation"] == "vit.data")
    print(f"decoding alone (load_rgb) caps one worker at {decode_rate:.0f} images/s on this core")


def data_checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets: batched CIFAR per core, our device-normalised worker rows, the shard loader and its
    speed-up over the folder loader."""
    # The targets read images per CPU second: one thread runs, so that is the work a core does, whatever the load.
    checks = []
    for row in rows:  # the decoded-once loader's batched augmentation, on one core
        if row["implementation"] == BATCHED and row["pipeline"] == CIFAR:
            checks.append(
                check(
                    f"{row['pipeline']} [{BATCHED}, one thread] >= {DATA_BATCH_TARGET:.0f} images/s per core",
                    row["images_per_cpu_s"] >= DATA_BATCH_TARGET,
                    f"{row['images_per_cpu_s']:.0f} images per CPU second (wall clock {row['images_per_s']:.0f}/s)",
                )
            )
    for row in rows:  # the targets apply to what ImageDataModule's workers run
        if row["implementation"] != MINE or row["normalise"] != "device" or row["pipeline"] == JITTER:
            continue
        target = DATA_CIFAR_TARGET if row["pipeline"] == CIFAR else DATA_JPEG_TARGET
        checks.append(
            check(
                f"{row['pipeline']} [{row['decoder']}, normalised on the device] >= {target:.0f} images/s per worker",
                row["images_per_cpu_s"] >= target,
                f"{row['images_per_cpu_s']:.0f} images per CPU second (wall clock {row['images_per_s']:.0f}/s)",
            )
        )
    folder = next(
        r for r in rows if r["pipeline"] == CROP and r["implementation"] == MINE and r["normalise"] == "device"
    )
    for row in rows:  # the shard loader's workers: libjpeg-turbo at a reduced DCT scale
        if (
            row["implementation"] == SHARDS
            and row["pipeline"] == SHARD_CROP
            and row["decoder"].startswith("simplejpeg")
        ):
            checks.append(
                check(
                    f"{SHARD_CROP} [{row['decoder']}] >= {DATA_SHARD_TARGET:.0f} images per CPU second per worker",
                    row["images_per_cpu_s"] >= DATA_SHARD_TARGET,
                    f"{row['images_per_cpu_s']:.0f} images per CPU second (wall clock {row['images_per_s']:.0f}/s)",
                )
            )
            speedup = row["images_per_cpu_s"] / folder["images_per_cpu_s"]
            checks.append(
                check(
                    f"{SHARD_CROP} >= {DATA_SHARD_SPEEDUP:.0f}x the folder loader ({CROP}, load_rgb), one worker",
                    speedup >= DATA_SHARD_SPEEDUP,
                    f"{speedup:.2f}x ({row['images_per_cpu_s']:.0f} vs {folder['images_per_cpu_s']:.0f} per CPU s)",
                )
            )
    return checks
