"""Measurement harness shared by the benchmark suites: timing, spread, tables, checks, the report.

Only torch and the standard library, and torch only inside the functions that need it (``vit bench --help`` reads
:class:`BenchError` and :func:`log` before torch loads): the model and attention suites must run where the training
extras (Lightning, albumentations, W&B) are not installed. The machine, its threads and the report's header are
:mod:`vit.env`'s.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..atomic import write_text
from ..env import default_threads  # noqa: F401  (re-exported: callers read it from here)

if TYPE_CHECKING:
    import torch

_START = time.perf_counter()


def log(message: str) -> None:
    """Progress line on stderr with the seconds since start."""
    print(f"[{time.perf_counter() - _START:7.1f}s] {message}", file=sys.stderr, flush=True)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        import torch

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


def alternate(
    steps: dict[str, Callable[[], Any]], rounds: int, steps_per_round: int, batch: int, device: torch.device, what: str
) -> dict[str, dict[str, list[float]]]:
    """Images/s of each callable per wall-clock and per CPU second, measured alternately for ``rounds`` rounds.

    The order flips every round (A B, B A, A B, ...), so neither model always runs first or second: position effects
    (a warm allocator, a cold cache, load that rises during a round) cancel in the median.
    """
    speeds: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in steps}
    for r in range(rounds):
        order = list(steps.items())
        for name, fn in order if r % 2 == 0 else order[::-1]:
            wall, cpu = timed(fn, steps_per_round, device)
            speeds[name]["wall"].append(batch * steps_per_round / wall)
            speeds[name]["cpu"].append(batch * steps_per_round / max(cpu, 1e-9))
        ratio = ""
        if len(steps) == 2:  # the first's speed against the second's, named
            (a, first), (b, second) = ((name, speeds[name]) for name in steps)
            ratio = f" ratio {a}/{b} {first['wall'][-1] / second['wall'][-1]:.3f}"
            if device.type == "cpu":
                ratio += f" (CPU time {first['cpu'][-1] / second['cpu'][-1]:.3f})"
        log(
            f"  {what} round {r + 1}/{rounds}: "
            + ", ".join(f"{n} {v['wall'][-1]:.1f} img/s" for n, v in speeds.items())
            + ratio
        )
    return speeds


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
        import torch

        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


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


def write_report(path: str | Path | None, report: dict[str, Any]) -> None:
    """Write the JSON report to ``path`` (nothing when ``None``); called after every model and suite, so a timeout
    keeps what was measured."""
    if path:
        write_text(path, json.dumps(report, indent=2, default=str) + "\n")


class BenchError(ValueError):
    """A bad setting: the command line prints ``error: <message>`` and exits with status 2."""
