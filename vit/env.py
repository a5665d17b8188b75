"""Where and how a run was measured: the machine, its cores and load, the thread count and the versions.

The header that the benchmarks (``vit bench``) and ``vit explain --faithfulness`` write at the top of their JSON
reports is :func:`run_header`; :func:`default_threads` of :func:`busy_cores` is the thread count both use on a shared
CPU. Standard library
only at import: torch is imported by the functions that read it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

PROC_STAT = Path("/proc/stat")
"""Linux's CPU counters since boot: :func:`busy_cores` reads how busy the cores are now from two readings."""


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container or ``taskset`` limits it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def busy_load() -> float:
    """The 1-minute load average, 0 where the system does not report one."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def cpu_jiffies(cores: set[int], stat: Path = PROC_STAT) -> tuple[int, int] | None:
    """``(busy, total)`` clock ticks of ``cores`` since boot, from the per-CPU lines of ``/proc/stat`` (idle and
    I/O wait are not busy); ``None`` where the file is missing or names none of ``cores``."""
    busy = total = 0
    with contextlib.suppress(OSError, ValueError):
        for line in stat.read_text().splitlines():
            name, *fields = line.split()
            if name[:3] == "cpu" and name[3:].isdigit() and int(name[3:]) in cores:
                ticks = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
                total += sum(ticks)
                busy += sum(ticks) - ticks[3] - ticks[4]
    return (busy, total) if total else None


def busy_cores(window: float = 0.25, stat: Path = PROC_STAT) -> float:
    """How many of this process's cores other processes keep busy now: the busy share of their ``/proc/stat`` ticks
    over ``window`` seconds (this process sleeps meanwhile), times their number. Where ``/proc/stat`` is missing, the
    1-minute load average (:func:`busy_load`), which lags: it still counts a command that ended a minute ago."""
    cores = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    first = cpu_jiffies(cores, stat)
    if first is None:
        return busy_load()
    time.sleep(window)
    second = cpu_jiffies(cores, stat)
    if second is None or second[1] <= first[1]:
        return busy_load()
    return len(cores) * (second[0] - first[0]) / (second[1] - first[1])


def default_threads(cores: int, load: float) -> int:
    """Intra-op threads that do not oversubscribe a shared CPU: the cores minus the busy ones, at least 1.

    PyTorch starts one OpenMP thread per core, and every parallel region ends at a barrier that waits for the slowest
    thread: a core that another process holds makes each of them wait for a time slice. ``vit explain CKPT --split
    val --limit 120 --overlays false`` on a 2-core machine: 13.4 s idle with 2 threads, 45.0 s beside one busy process
    with 2 threads, 15.4 s beside it with 1 thread; with ``--methods attnlrp,ig --faithfulness``, 12 s idle and 104 s
    beside a busy loop with 2 threads. Rounding the busy cores leaves all cores to a machine that is merely noisy. See
    docs/explanations.md for the command that measures it.

    Args:
        cores: The cores this process may use (:func:`available_cores`).
        load: The cores other processes keep busy (:func:`busy_cores`), rounded to the nearest whole core.
    """
    return max(1, min(cores, cores - round(load)))


def device_name(device: torch.device | str = "cpu") -> str:
    """The CUDA device's name, or the CPU model from ``/proc/cpuinfo``."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def run_header(command: str, device: torch.device | str | None = None) -> dict[str, Any]:
    """The header of a measured run's report: what ran, when, where, with which versions, threads and load.

    Args:
        command: The command line that ran (``vit bench --suite model``), as the user would type it again.
        device: The device measured (default: the CPU).

    Returns:
        ``command``, ``date`` (UTC, ISO 8601 to the second), ``machine`` (device name and cores), ``device``,
        ``device_name``, ``cpu_count``, ``platform``, ``cuda`` (the CUDA version on a CUDA device, else ``None``),
        ``versions`` (``torch``, ``vit``, ``python``), ``threads`` (torch's intra-op threads) and ``load_average``
        (1, 5 and 15 minutes, ``None`` where the system has none).
    """
    import torch

    import vit

    device = torch.device(device if device is not None else "cpu")
    name = device_name(device)
    return {
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{name}, {os.cpu_count()} cores",
        "device": str(device),
        "device_name": name,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "versions": {"torch": torch.__version__, "vit": vit.__version__, "python": platform.python_version()},
        "threads": torch.get_num_threads(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }
