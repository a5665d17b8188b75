"""``vit bench --suite corruption``: how long the 15 common corruptions x 5 severities take to generate
(:func:`vit.evaluation.corruptions.corrupt`) on real CIFAR-10 test images, and where the time goes.

Per corruption and severity: wall and process CPU seconds of :func:`corrupt` on all the images, then the time to write
the cell to the disk cache (atomically, as :func:`~vit.evaluation.corruptions.iter_corrupted` does) and to read it
back. Then each corruption is profiled once (severity 3, a tenth of the images) and its two costliest functions are
reported with their share of its time. The load average before and after says how busy the cores were.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from vit.atomic import atomic_write
from vit.bench.harness import BenchError, check, log, print_table, write_report
from vit.env import available_cores

PROFILE_FRACTION = 10  # profile each corruption on 1 / PROFILE_FRACTION of the images


def load_test_images(folder: str | Path, limit: int) -> np.ndarray:
    """The first ``limit`` images of ``folder`` (``<class>/*.jpg`` or ``test/<class>/*.jpg``), spread evenly over
    the sorted files, as uint8 ``(N, H, W, 3)``."""
    import cv2

    root = Path(folder)
    root = root / "test" if (root / "test").is_dir() else root
    files = sorted(root.glob("*/*.jpg")) + sorted(root.glob("*/*.png"))
    if not files:
        raise BenchError(f"--corruption_data {folder}: no <class>/*.jpg images; give the CIFAR-10 test folder")
    files = [files[i] for i in np.linspace(0, len(files) - 1, min(limit, len(files))).round().astype(int)]
    return np.stack([cv2.cvtColor(cv2.imread(str(f)), cv2.COLOR_BGR2RGB) for f in files])


def time_cell(images: np.ndarray, name: str, severity: int, seed: int, cache: Path) -> dict[str, Any]:
    """Generate one cell, then write it to ``cache`` atomically and read it back (memory-mapped, every page read)."""
    from vit.evaluation.corruptions import cache_file, cached_corruption, corrupt

    wall, cpu = time.perf_counter(), time.process_time()
    out = corrupt(images, name, severity, seed)
    seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    path = cache_file(cache, "bench", name, severity, seed)
    start = time.perf_counter()
    with atomic_write(path) as f:
        np.save(f, out)
    write = time.perf_counter() - start
    start = time.perf_counter()
    stored = np.array(cached_corruption(images, name, severity, seed, path))
    read = time.perf_counter() - start
    path.unlink()
    if not np.array_equal(stored, out):
        raise BenchError(f"{name} {severity}: the cached cell differs from the generated one")
    return {
        "corruption": name,
        "severity": severity,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "images_per_s": len(images) / seconds,
        "cache_write_s": write,
        "cache_read_s": read,
    }


def hot_spots(images: np.ndarray, name: str, seed: int, top: int = 2) -> list[dict[str, Any]]:
    """The ``top`` functions by own time while corrupting ``images`` at severity 3, with their share."""
    from vit.evaluation.corruptions import corrupt

    profile = cProfile.Profile()
    profile.enable()
    corrupt(images, name, 3, seed)
    profile.disable()
    stats = pstats.Stats(profile).stats  # (file, line, function) -> (calls, primitive calls, own, cumulative, ...)
    total = sum(own for _, _, own, _, _ in stats.values()) or 1.0
    ranked = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    return [
        {"function": f"{Path(file).name}:{func}" if file != "~" else func, "share": own / total, "calls": calls}
        for (file, _, func), (calls, _, own, _, _) in ranked
    ]


def run_corruption_suite(
    *,
    report: dict[str, Any],
    data_dir: str | None,
    images: int = 10000,
    seed: int = 0,
    json_path: str | None = None,
) -> None:
    """Time every corruption and severity on ``images`` CIFAR-10 test images, print the tables, fill
    ``report["corruption"]``.

    Args:
        report: The report to fill (written to ``json_path`` after each corruption).
        data_dir: Folder of the test images (``<class>/*.jpg`` or ``test/<class>/*.jpg``).
        images: How many of them.
        seed: Seed of the corruptions.
        json_path: Where the report is written.
    """
    from vit.evaluation.corruptions import CORRUPTIONS, SEVERITIES

    if not data_dir:
        raise BenchError("--suite corruption needs --corruption_data: the folder of the CIFAR-10 test images")
    pixels = load_test_images(data_dir, images)
    log(f"corruption: {len(pixels)} images of {pixels.shape[1]}x{pixels.shape[2]} from {data_dir}")
    entry: dict[str, Any] = {
        "images": len(pixels),
        "source": str(data_dir),
        "workers": available_cores(),  # corrupt()'s default: a thread per core this process may use
        "load_before": os.getloadavg(),
    }
    report["corruption"] = entry
    rows, totals = [], []
    with tempfile.TemporaryDirectory(prefix="vit-bench-corruption-") as cache:
        for name in CORRUPTIONS:
            cells = [time_cell(pixels, name, s, seed, Path(cache)) for s in SEVERITIES]
            rows.extend(cells)
            spots = hot_spots(pixels[: max(1, len(pixels) // PROFILE_FRACTION)], name, seed)
            totals.append(
                {
                    "corruption": name,
                    "seconds": sum(c["seconds"] for c in cells),
                    "cpu_seconds": sum(c["cpu_seconds"] for c in cells),
                    "hot_spots": spots,
                    "where": ", ".join(f"{s['function']} {s['share']:.0%}" for s in spots),
                }
            )
            log(f"corruption: {name} {totals[-1]['seconds']:.1f} s ({totals[-1]['where']})")
            entry.update(cells=rows, per_corruption=totals)
            write_report(json_path, report)
    total = sum(t["seconds"] for t in totals)
    for t in totals:
        t["share"] = t["seconds"] / total
    cache_seconds = sum(c["cache_write_s"] + c["cache_read_s"] for c in rows)
    entry.update(
        total_seconds=total,
        total_cpu_seconds=sum(t["cpu_seconds"] for t in totals),
        cells_per_total=len(rows),
        corrupted_images=len(rows) * len(pixels),
        cache_write_s=sum(c["cache_write_s"] for c in rows),
        cache_read_s=sum(c["cache_read_s"] for c in rows),
        load_after=os.getloadavg(),
    )
    print_table(
        f"Corruption generation, {len(pixels)} images per cell (seconds for 5 severities)",
        sorted(totals, key=lambda t: -t["seconds"]),
        [("corruption", "corruption", ""), ("seconds", "wall s", ".1f"), ("cpu_seconds", "CPU s", ".1f"),
         ("share", "share", ".0%"), ("where", "where the time goes (severity 3)", "")],
    )  # fmt: skip
    entry["checks"] = [
        check(
            "corruption: every cell generated",
            len(rows) == len(CORRUPTIONS) * len(SEVERITIES),
            f"{len(rows)} cells, {len(rows) * len(pixels)} images in {total:.0f} s "
            f"({len(rows) * len(pixels) / total:.0f} images/s), cache write + read {cache_seconds:.0f} s",
        )
    ]
    write_report(json_path, report)
