"""Where and how a run was measured: the machine, its cores and load, the thread count and the versions.

The header that the benchmarks (``vit bench``) and ``vit explain --faithfulness`` write at the top of their JSON
reports is :func:`run_header`; :func:`default_threads` is the thread count both use on a shared CPU. Standard library
only at import: torch is imported by the functions that read it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container or ``taskset`` limits it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def busy_load() -> float:
    """The 1-minute load average, 0 where the system does not report one."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


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
