"""The GPU check's runner: each step under its own time limit inside one budget, the module check up front, a JSON
record written as each step ends, and ``summary.txt``.

Standard library only (and ``vit``'s standard-library modules): it runs before the carried wheels are installed and
before the modules are checked, on a machine where ``vit`` is not installed (``python -m`` from the repository root).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vit.atomic import write_text
from vit.errors import UsageError

MIN_LIMIT_S = 10
"""A step that would get less time than this is skipped rather than started."""
KILL_AFTER_S = 10
"""Seconds between SIGTERM at a step's limit and SIGKILL (a fit writes its checkpoint and JSON on SIGTERM)."""
DRY_SCALE = 3
"""A dry run on a small shared CPU: every limit, reserve and the default budget three times longer."""
DEFAULT_BUDGET_S = 570
"""The whole check on a GPU machine, within a call of 600 s."""
TIMED_OUT = (124, 137)
"""Exit statuses of a step stopped at its limit (as coreutils' ``timeout`` reports them)."""
SUMMARY_LINES = ("PASS  ", "FAIL  ", "RESULT  ")
"""Lines of a step's log copied into the summary."""


@dataclass(frozen=True)
class Step:
    """One command of the check.

    Args:
        name: The step's name: its log is ``NAME.log``, its JSON ``NAME.json``; ``ONLY`` chooses by it.
        max_s: Its own time limit in seconds on a GPU machine (times :data:`DRY_SCALE` in a dry run).
        reserve_s: Seconds it leaves in the budget for the steps after it (times :data:`DRY_SCALE` in a dry run).
        command: The command, run from the repository root.
        needs: Modules that must import (the module check up front), else the step is skipped.
        requires: Earlier steps that must have ended ``ok`` (its data); ``ONLY`` runs them too.
    """

    name: str
    max_s: int
    reserve_s: int
    command: tuple[str, ...]
    needs: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()


def step_limit(step: Step, *, budget_s: int, elapsed_s: float, scale: int = 1, only: bool = False) -> tuple[int, int]:
    """The time limit of ``step`` started ``elapsed_s`` into the check, and the seconds left for it.

    ``limit = min(max_s, budget - elapsed - reserve_s)``, both times ``scale``; under ``ONLY`` nothing is kept back
    for the other steps (``reserve 0``). A limit under :data:`MIN_LIMIT_S` means: skip it.

    Returns:
        ``(limit, left)``: whole seconds.
    """
    reserve = 0 if only else step.reserve_s * scale
    left = int(budget_s - elapsed_s - reserve)
    return min(step.max_s * scale, left), left


@dataclass(frozen=True)
class Settings:
    """What the environment chose (:func:`read_settings`).

    Args:
        out: The folder for the JSON files, logs and ``summary.txt``.
        python: The Python that runs every step (``PYTHON``).
        dry: ``DRY_RUN=1``: every step with tiny settings on the CPU.
        budget_s: ``BUDGET_S``: the whole check's seconds.
        only: ``ONLY``: the steps to run alone (empty: all).
        cifar_tar: ``CIFAR_TAR``: the CIFAR-10 JPEGs as one tarball.
        wheels: ``WHEELS``: the folder of wheels installed first.
        speedrun_time: ``SPEEDRUN_TIME``: the speedrun's ``trainer.max_time``.
    """

    out: Path
    python: str
    dry: bool = False
    budget_s: int = DEFAULT_BUDGET_S
    only: frozenset[str] = field(default_factory=frozenset)
    cifar_tar: Path = Path("data/cifar10-jpeg.tar.gz")
    wheels: Path = Path(".whl")
    speedrun_time: str = "00:00:02:45"

    @property
    def scale(self) -> int:
        return DRY_SCALE if self.dry else 1


def read_settings(out: Path, environ: Mapping[str, str]) -> Settings:
    """The check's settings from ``environ`` (DRY_RUN, BUDGET_S, ONLY, CIFAR_TAR, WHEELS, PYTHON, SPEEDRUN_TIME).

    Raises:
        UsageError: a DRY_RUN other than 0 or 1, or a BUDGET_S that is not a positive whole number of seconds.
    """
    dry = environ.get("DRY_RUN", "0") or "0"
    if dry not in ("0", "1"):
        raise UsageError(f"DRY_RUN={dry!r}: use 1 (a dry run on the CPU) or 0")
    scale = DRY_SCALE if dry == "1" else 1
    budget = environ.get("BUDGET_S") or str(DEFAULT_BUDGET_S * scale)
    if not budget.isdigit() or int(budget) < 1:
        raise UsageError(f"BUDGET_S={budget!r}: give the check's budget in whole seconds, e.g. BUDGET_S=570")
    return Settings(
        out=out,
        python=environ.get("PYTHON") or sys.executable,
        dry=dry == "1",
        budget_s=int(budget),
        only=frozenset(environ.get("ONLY", "").split()),
        cifar_tar=Path(environ.get("CIFAR_TAR") or "data/cifar10-jpeg.tar.gz"),
        wheels=Path(environ.get("WHEELS") or ".whl"),
        speedrun_time=environ.get("SPEEDRUN_TIME") or "00:00:02:45",
    )


def chosen_steps(steps: Sequence[Step], only: Iterable[str], always: Iterable[str] = ()) -> list[Step]:
    """The steps ``ONLY`` chose, with the earlier steps they require and the ``always`` ones, in plan order.

    Raises:
        UsageError: a name in ``only`` that is no step.
    """
    only = set(only)
    if not only:
        return list(steps)
    names = [step.name for step in steps]
    unknown = sorted(only - set(names))
    if unknown:
        raise UsageError(f"ONLY: no step named {', '.join(unknown)}; the steps are: {' '.join(names)}")
    by_name = {step.name: step for step in steps}
    keep, todo = set(always), list(only)
    while todo:
        name = todo.pop()
        if name not in keep:
            keep.add(name)
            todo.extend(by_name[name].requires if name in by_name else ())
    return [step for step in steps if step.name in keep]


def run_command(
    command: Sequence[str], limit_s: float, log: Path, env: Mapping[str, str], kill_after_s: float = KILL_AFTER_S
) -> tuple[int, bool]:
    """Run ``command`` with stdout and stderr in ``log``; at ``limit_s`` send SIGTERM to its process group, and
    SIGKILL ``kill_after_s`` later (what ``timeout --kill-after`` does).

    Returns:
        ``(exit status, timed out)``; a step stopped at its limit exits 124 (SIGTERM) or 137 (SIGKILL), as
        ``timeout`` reports it.
    """
    with open(log, "wb") as sink:
        try:
            process = subprocess.Popen(
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )
        except OSError as err:  # a missing program is a failed step, not a failed check
            sink.write(f"{shlex.join(command)}: {err}\n".encode())
            return 127, False
        try:
            return process.wait(timeout=limit_s), False
        except subprocess.TimeoutExpired:
            return stop(process, kill_after_s), True
        except BaseException:  # the check itself stopped (SIGTERM, Ctrl-C): its step stops too
            stop(process, kill_after_s)
            raise


def stop(process: subprocess.Popen, kill_after_s: float) -> int:
    """SIGTERM to ``process``'s group, SIGKILL ``kill_after_s`` later if it is still there; returns 124 or 137."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=kill_after_s)
        return TIMED_OUT[0]
    except subprocess.TimeoutExpired:
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()
        return TIMED_OUT[1]


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(pid, sig)


class Check:
    """One run of the check: its budget's clock, the outcome of every step, ``summary.txt`` and ``check.json``.

    Args:
        settings: What the environment chose.
        env: The environment of every step.
        clock: Seconds, monotonic (a fake one in tests).
        min_limit_s: A step that would get less is skipped.
        kill_after_s: Seconds from SIGTERM to SIGKILL at a step's limit.
        modules_reserve_s: What the module check keeps back for the steps after it.
    """

    def __init__(
        self,
        settings: Settings,
        env: Mapping[str, str],
        clock: Any = time.monotonic,
        min_limit_s: float = MIN_LIMIT_S,
        kill_after_s: float = KILL_AFTER_S,
        modules_reserve_s: int = 0,
    ) -> None:
        self.settings = settings
        self.env = dict(env)
        self.clock = clock
        self.min_limit_s, self.kill_after_s = min_limit_s, kill_after_s
        self.modules_reserve_s = modules_reserve_s
        self.start = clock()
        self.records: list[dict[str, Any]] = []
        self.status: dict[str, str] = {}
        self.missing: dict[str, str] = {}
        out = settings.out
        if (out / "summary.txt").exists() or (out / "check.json").exists():
            raise UsageError(f"{out} already holds a check's results (summary.txt); give a new folder")
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / "summary.txt").touch()
        except OSError as err:
            raise UsageError(f"cannot write into {out}: {err.strerror}; give a folder you can write to") from None

    def elapsed(self) -> float:
        return self.clock() - self.start

    def note(self, line: str) -> None:
        """A line of ``summary.txt``, also on stderr."""
        print(line, file=sys.stderr, flush=True)
        with open(self.settings.out / "summary.txt", "a", encoding="utf-8") as summary:
            summary.write(line + "\n")

    def run(self, step: Step) -> str:
        """Run ``step`` if its modules import, the steps it requires succeeded and the budget leaves it at least
        :data:`MIN_LIMIT_S`; record its outcome. Returns its status: ``ok``, ``failed``, ``timed out`` or
        ``skipped``."""
        missing = [name for name in step.needs if name in self.missing]
        failed = [name for name in step.requires if self.status.get(name) != "ok"]
        limit, left = step_limit(
            step,
            budget_s=self.settings.budget_s,
            elapsed_s=self.elapsed(),
            scale=self.settings.scale,
            only=bool(self.settings.only),
        )
        if missing:
            return self.skip(step, f"not importable: {', '.join(missing)}")
        if failed:
            return self.skip(step, f"needs {', '.join(failed)}, which did not succeed")
        if limit < self.min_limit_s:
            return self.skip(step, f"{left}s left of the {self.settings.budget_s}s budget")
        started = self.elapsed()
        print(f"[{started:.0f}s] {step.name} (timeout {limit}s)", file=sys.stderr, flush=True)
        log = self.settings.out / f"{step.name}.log"
        try:
            code, timed_out = run_command(step.command, limit, log, self.env, self.kill_after_s)
        except BaseException:  # the check was stopped (SIGTERM at the call's end, Ctrl-C): say so, then stop
            self.note(f"{step.name}: STOPPED with the check after {self.elapsed() - started:.0f}s")
            self.copy_results(log)
            self.record(step, {"step": step.name, "status": "stopped", "limit_s": limit, "log": log.name})
            raise
        wall = self.elapsed() - started
        if timed_out:
            status, detail = "timed out", f"TIMED OUT after {limit}s (partial JSON kept)"
        elif code:
            status, detail = "failed", f"FAILED rc={code} (see {log.name})"
        else:
            status, detail = "ok", "ok"
        self.note(f"{step.name}: {detail}, {wall:.0f}s, done at {self.elapsed():.0f}s")
        self.copy_results(log)
        record = {
            "step": step.name,
            "status": status,
            "exit": code,
            "limit_s": limit,
            "started_s": round(started, 1),
            "wall_s": round(wall, 1),
            "log": log.name,
            "command": list(step.command),
        }
        return self.record(step, record)

    def skip(self, step: Step, reason: str) -> str:
        self.note(f"{step.name}: skipped, {reason}")
        return self.record(step, {"step": step.name, "status": "skipped", "reason": reason})

    def record(self, step: Step, record: dict[str, Any]) -> str:
        """Keep ``record`` in ``check.json``, and as ``NAME.json`` where the step wrote none of its own."""
        self.status[step.name] = record["status"]
        self.records.append(record)
        own = self.settings.out / f"{step.name}.json"
        if not own.exists():
            write_text(own, json.dumps(record, indent=2) + "\n")
        self.write_report()
        return record["status"]

    def copy_results(self, log: Path) -> None:
        """The step's ``PASS``/``FAIL``/``RESULT`` lines into the summary."""
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith(SUMMARY_LINES)]
        if lines:
            with open(self.settings.out / "summary.txt", "a", encoding="utf-8") as summary:
                summary.write("".join(line + "\n" for line in lines))

    def write_report(self) -> None:
        settings = self.settings
        report = {
            "budget_s": settings.budget_s,
            "dry_run": settings.dry,
            "only": sorted(settings.only),
            "python": settings.python,
            "elapsed_s": round(self.elapsed(), 1),
            "missing_modules": self.missing,
            "steps": self.records,
        }
        write_text(settings.out / "check.json", json.dumps(report, indent=2) + "\n")

    def check_modules(self, names: Sequence[str]) -> None:
        """The ``modules`` step: import every module some step needs, in one process, and note the missing ones
        (each step that needs one is then skipped at once)."""
        out = self.settings.out / "modules.json"
        program = (self.settings.python, "-m", "vit.bench.gpu_check.programs", "modules", str(out), *names)
        status = self.run(Step("modules", 60, self.modules_reserve_s, program))
        if status == "ok" and out.exists():
            self.missing = json.loads(out.read_text())["missing"]
        elif status != "skipped":
            self.missing = {name: f"the module check {status}" for name in names}
        if self.missing:
            self.note(f"modules: missing {'; '.join(f'{name} ({why})' for name, why in self.missing.items())}")


def scratch_folder() -> tempfile.TemporaryDirectory:
    """Checkpoints and extracted data: never in OUTDIR or the repository; removed when the check ends."""
    return tempfile.TemporaryDirectory(prefix="gpu-check-")
