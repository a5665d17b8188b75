"""The offline side of ``vit bench --suite serve``: :meth:`ServeModel.predict` in the bench's own process, with no
server in between. Its batched rate is the limit the served rate is held against; at batch 1 it compares the
backends.

The backends are timed in alternating rounds (:func:`vit.bench.harness.alternate`), not one after the other: on a
shared VM the speed of the cores drifts by tens of percent within minutes (the CIFAR recipe's model at batch 1 on two
cores, torch: 2.3 ms in one run, 3.2 ms in the same run three minutes later), and a ratio of two backends timed
apart measures that drift as much as the backends.
"""

from __future__ import annotations

import functools
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from vit.bench.harness import BenchError, alternate

ROUNDS = 10
"""Alternating rounds of the backends' comparison at batch 1."""


def load_model(model: str | Path, backend: str, threads: int | None) -> Any:
    """The :class:`~vit.serve.model.ServeModel` the server runs, in this process (with ``threads``, torch's thread
    count: the bench's own, ``--threads``)."""
    from vit.serve.model import ServeModel

    return ServeModel(model, backend=backend, threads=threads)


def onnx_folder(model: str | Path, folder: Path) -> Path:
    """``model`` itself when it is a ``vit export --onnx`` folder, else its export to ``folder/onnx``."""
    from vit.export import ONNX_FILE

    source = Path(model)
    if source.is_dir() and (source / ONNX_FILE).is_file():
        return source
    out = folder / "onnx"
    command = [sys.executable, "-m", "vit", "export", "--ckpt_path", str(source), "--out", str(out), "--onnx"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise BenchError(f"vit export --onnx of {source} failed:\n{done.stderr[-1500:]}")
    return out


def offline_rate(served: Any, image: Path, *, batch: int, seconds: float) -> dict[str, Any]:
    """:meth:`ServeModel.predict` of ``served`` on batches of ``batch`` copies of ``image`` in this process for about
    ``seconds`` (after one warm-up batch): images/s and milliseconds per batch."""
    images = [served.decode(image.read_bytes())] * batch
    served.predict(images)
    times = []
    start = time.perf_counter()
    while not times or time.perf_counter() - start < seconds:
        tick = time.perf_counter()
        served.predict(images)
        times.append(time.perf_counter() - tick)
    return {"backend": served.backend, "batch": batch, "images_per_s": batch * len(times) / sum(times),
            "batch_ms": 1000 * float(np.median(times))}  # fmt: skip


def backend_rates(served: dict[str, Any], image: Path, *, seconds: float, rounds: int = ROUNDS) -> dict[str, Any]:
    """Batch-1 speed of each backend of ``served`` (its name: its :class:`~vit.serve.model.ServeModel`), timed in
    ``rounds`` alternating rounds, about ``seconds`` per backend in all: per backend ``images_per_s`` and ``batch_ms``
    (the median round) and ``round_ms`` (each round's milliseconds per image, in the order they ran, so that two
    backends' rounds pair up)."""
    import torch

    steps = {}
    for name, model in served.items():
        steps[name] = functools.partial(model.predict, [model.decode(image.read_bytes())])
        steps[name]()  # warm-up
    tick = time.perf_counter()
    for step in steps.values():
        step()
    per_call = (time.perf_counter() - tick) / len(steps)
    per_round = max(1, round(seconds / rounds / max(per_call, 1e-6)))
    speeds = alternate(steps, rounds, per_round, 1, torch.device("cpu"), "batch 1")
    rows = {}
    for name, speed in speeds.items():
        median = statistics.median(speed["wall"])
        rows[name] = {"backend": name, "batch": 1, "images_per_s": median, "batch_ms": 1000 / median,
                      "round_ms": [1000 / ips for ips in speed["wall"]], "rounds": rounds}  # fmt: skip
    return rows
