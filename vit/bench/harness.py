"""Measurement harness shared by the benchmark suites: timing, spread, device facts, tables, checks, the report.

Only torch and the standard library: the model and attention suites must run where the training extras
(Lightning, albumentations, W&B) are not installed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..atomic import write_text

_START = time.perf_counter()


def log(message: str) -> None:
    """Progress line on stderr with the seconds since start."""
    print(f"[{time.perf_counter() - _START:7.1f}s] {message}", file=sys.stderr, flush=True)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container or ``taskset`` limits it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_threads(cores: int, load: float) -> int:
    """Intra-op threads that do not oversubscribe a shared CPU: the cores minus the busy ones, at least 1.

    PyTorch starts one OpenMP thread per core, and every parallel region ends at a barrier that waits for the slowest
    thread: a core that another process holds makes each of them wait for a time slice. ``vit explain CKPT --split val
    --limit 120 --no-overlays`` on a 2-core machine: 13.4 s idle with 2 threads, 45.0 s beside one busy process with 2
    threads, 15.4 s beside it with 1 thread; with ``--methods attnlrp,ig --faithfulness``, 12 s idle and 104 s beside a
    busy loop with 2 threads. The load average counts the busy processes (it lags by about a minute); rounding it
    leaves all cores to a machine that is merely noisy. See docs/explanations.md for the command that measures it.

    Args:
        cores: The cores this process may use (:func:`available_cores`).
        load: Processes already running, the 1-minute load average (:func:`os.getloadavg`), rounded to the nearest
            whole process.
    """
    return max(1, min(cores, cores - round(load)))


def busy_load() -> float:
    """The 1-minute load average, 0 where the system does not report one."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], steps: int, device: torch.device) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of ``steps`` calls of ``fn``, the device synchronised before and after.

    On a shared CPU the process time (all of this process's threads) is the steadier measure of the work done: it
    does not count time spent waiting for a core that another process holds.
    """
    synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        fn()
    synchronize(device)
    return time.perf_counter() - wall, time.process_time() - cpu


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles, min and max of a list of measurements."""
    ordered = sorted(values)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return {"median": statistics.median(ordered), "q1": q1, "q3": q3, "min": ordered[0], "max": ordered[-1]}


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast for ``precision == "bf16"``, else nothing."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def device_name(device: torch.device) -> str:
    """The CUDA device's name, or the CPU model from ``/proc/cpuinfo``."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def environment(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The report's header: date, versions, device, threads, load and every setting."""
    import timm

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "device_name": device_name(device),
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "settings": {key: value for key, value in vars(args).items() if key != "func"},
    }


def print_table(title: str, rows: list[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> None:
    """Print ``rows`` as a Markdown table; ``columns`` are (key, header, format spec)."""

    def cell(row: dict[str, Any], key: str, spec: str) -> str:
        value = row.get(key)
        if value is None:
            return "–"
        return format(value, spec) if spec else str(value)

    print(f"\n### {title}\n")
    print("| " + " | ".join(header for _, header, _ in columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for row in rows:
        print("| " + " | ".join(cell(row, key, spec) for key, _, spec in columns) + " |")
    sys.stdout.flush()


def check(name: str, passed: bool, detail: str) -> dict[str, Any]:
    """Print a ``PASS``/``FAIL`` line and return it as a report entry."""
    print(f"{'PASS' if passed else 'FAIL'}  {name}: {detail}")
    return {"name": name, "passed": bool(passed), "detail": detail}


def write_report(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Write the JSON report (after every model and suite, so a timeout keeps what was measured)."""
    if args.json:
        write_text(args.json, json.dumps(report, indent=2, default=str) + "\n")


class BenchError(ValueError):
    """A bad setting: the command line prints ``error: <message>`` and exits with status 2."""
