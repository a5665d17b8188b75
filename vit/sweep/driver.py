"""The ``vit sweep`` process: open (or resume) the study, start the workers, print progress, write the report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna

from vit.atomic import write_text
from vit.errors import EXIT_BAD_INPUT, EXIT_OK, UsageError
from vit.text import plural

from .budget import format_duration
from .halving import Plan, load_rung, open_sweep, rung_status
from .report import best_row, rows, summary, table, write_best_config, write_figures
from .space import sampler
from .spec import Sweep
from .storage import describe, open_storage, reap_lost_trials
from .trial import hold_signals
from .wandb_run import log_sweep, wandb_project
from .worker import EXIT_INTERRUPTED, STORAGE_ENV, take_as_ctrl_c

POLL_S = 5.0
"""Seconds between two looks at the study for the progress line."""
PLAN_FILE = "plan.json"
"""The plan the workers of this machine read, in the sweep folder (its presence marks a sweep folder)."""


class Sweeper:
    """One ``vit sweep`` command.

    Args:
        sweep: The sweep file.
        plan_args: ``budgets``, ``count``, ``eta`` and ``seed`` of the :class:`~vit.sweep.halving.Plan`.
        fit_args: The ``vit fit`` arguments before each trial's values.
        folder: The sweep folder.
        storage_url: ``--storage``, or ``None`` for the journal file in ``folder``.
        max_retry: Runs again of a trial whose worker died.
        heartbeat: Seconds between heartbeats of an RDB storage (its grace period is four of them).
    """

    def __init__(self, sweep: Sweep, plan_args: dict[str, Any], fit_args: list[str], folder: Path,
                 storage_url: str | None, max_retry: int, heartbeat: int) -> None:  # fmt: skip
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        self.plan = Plan(sweep, raw=sweep.raw, fit_args=fit_args, **plan_args)
        self.folder, self.url, self.max_retry, self.heartbeat = folder, storage_url, max_retry, heartbeat
        self.storage = open_storage(storage_url, folder, max_retry, heartbeat, 4 * heartbeat)
        self.project = wandb_project(self.plan)  # the trials' W&B project, where the sweep's own run goes too

    def run(self, workers: int) -> int:
        """Open or resume the study, run ``workers`` workers until the last rung is finished, then report."""
        plan = self.plan
        where = describe(self.storage, self.folder)
        study, resumed = open_sweep(self.storage, plan, sampler(plan.sweep, plan.seed), self.remedy())
        if resumed:
            lost = reap_lost_trials(study, self.max_retry)
            again = f"; trials {', '.join(map(str, lost))} had lost their worker: enqueued again" if lost else ""
            print(
                stamp(f"resuming sweep {plan.sweep.name} ({where}): {summary(rows(self.storage, plan), plan)}{again}")
            )
        else:
            print(stamp(f"starting sweep {plan.sweep.name} ({where}): {plural(plan.count, 'configuration')}, method "
                        f"{plan.sweep.method}, {plan.sweep.metric} ({plan.sweep.goal}), budgets "
                        f"{budget_text(plan.budgets)}, keep 1/{plan.eta} per rung, "
                        f"{workers} worker{'s' * (workers != 1)}"))  # fmt: skip
        self.write_plan()
        procs: list[subprocess.Popen] = []
        signal.signal(signal.SIGTERM, take_as_ctrl_c)  # a scheduler's stop, taken as Ctrl-C
        signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
        try:
            start_workers(self.folder / PLAN_FILE, workers, self.url, procs)
            wait_for(procs, self.progress)
        except KeyboardInterrupt:
            hold_signals()  # a second Ctrl-C must not cut the workers' stop short (its waits are bounded)
            print(stamp("interrupted: the workers stop their trials (failed, enqueued again)"), file=sys.stderr)
            _stop(procs)
            return self.interrupted()
        failed = [p.returncode for p in procs if p.returncode]
        if EXIT_INTERRUPTED in failed and not self.finished():  # a signal stopped trials, not this process
            print(stamp("interrupted: a signal stopped the trials (failed, enqueued again)"), file=sys.stderr)
            return self.interrupted()
        status = self.report()
        if failed and not self.finished():
            raise UsageError(f"{len(failed)} of {workers} workers stopped (exit status {failed[0]}) before the sweep "
                             f"finished; `vit sweep {plan.sweep.source}` again resumes it")  # fmt: skip
        return status

    def interrupted(self) -> int:
        """Print the table so far and how to resume; the exit status of an interrupted sweep."""
        plan = self.plan
        found = rows(self.storage, plan)
        print(f"\nsweep {plan.sweep.name}: {summary(found, plan)}\n\n{table(found, plan)}" if found else "")
        print(f"`vit sweep {plan.sweep.source} ...` with the same options resumes it", file=sys.stderr)
        return EXIT_INTERRUPTED

    def remedy(self) -> str:
        """What to do about a study of the same name started with another sweep file or options."""
        name, source = self.plan.sweep.name, self.plan.sweep.source
        if self.url is None:
            return (f"Run this one under another name (vit sweep {source} --name NEW), or remove {self.folder} to "
                    "start this one in its place")  # fmt: skip
        return (f"Run this one under another name (vit sweep {source} --name NEW), or delete the study {name} (and "
                f"its {name}.rungN) from --storage to start this one in its place")  # fmt: skip

    def write_plan(self) -> Path:
        """``plan.json`` in the sweep folder: what this machine's workers run (the storage URL goes through their
        environment, never to disk); ``vit compare`` knows a sweep folder by it."""
        plan, path = self.plan, self.folder / PLAN_FILE
        record = {"plan": plan.fingerprint(), "fit_args": plan.fit_args, "source": str(plan.sweep.source),
                  "max_retry": self.max_retry, "heartbeat_interval": self.heartbeat,
                  "grace_period": 4 * self.heartbeat, "group": plan.sweep.name if self.project else None}  # fmt: skip
        write_text(path, json.dumps(record, indent=1) + "\n")
        return path

    def finished(self) -> bool:
        """Whether the last rung exists and is done."""
        last = self.plan.rungs - 1
        study = load_rung(self.storage, self.plan, last)
        if study is None:
            return False
        return rung_status(study, self.plan, last).done

    def progress(self) -> str:
        """The progress line: the current rung's trials by state, and the best so far."""
        plan, line = self.plan, ""
        for rung in range(plan.rungs):
            study = load_rung(self.storage, plan, rung)
            if study is None:
                break
            s = rung_status(study, plan, rung)
            budget = f" ({budget_text([plan.budgets[rung]])})" if plan.budgets else ""
            line = (f"rung {rung + 1}/{plan.rungs}{budget}: {s.complete} done, {s.running} running, {s.failed} failed,"
                    f" {s.waiting} waiting of {s.size}")  # fmt: skip
            if s.best is not None:
                line += f"; best {plan.sweep.metric} (last) {s.best.value:.4f} (trial {s.best.number})"
            if not s.done:
                break
        return line

    def report(self) -> int:
        """Print the table of trials; write ``best.yaml`` and the figures into the sweep folder."""
        plan = self.plan
        found = rows(self.storage, plan)
        if not found:
            raise UsageError(f"sweep {plan.sweep.name} has no trials yet in {describe(self.storage, self.folder)}")
        print(f"\nsweep {plan.sweep.name}: {summary(found, plan)}\n")
        print(table(found, plan))
        best = best_row(found, plan)
        figures = write_figures(self.storage, plan, found, self.folder)
        for path in figures:
            print(f"wrote {path}")
        if self.project:
            where = log_sweep(plan, found, figures, self.folder, self.project)
            print(f"W&B: the table and figures in {where or 'no run (WANDB_MODE=disabled)'}, group {plan.sweep.name}")
        if best is None:
            reasons = [r.trial.user_attrs.get("reason") for r in found if r.trial.user_attrs.get("reason")]
            print(f"error: no trial of sweep {plan.sweep.name} has a value of {plan.sweep.metric}"
                  + (f" (first failure: {reasons[0]})" if reasons else ""), file=sys.stderr)  # fmt: skip
            return EXIT_BAD_INPUT
        path = write_best_config(self.folder / "best.yaml", plan, best)
        print(f"wrote {path}  (vit fit --config {path})")
        return EXIT_OK


def _stop(procs: list[subprocess.Popen]) -> None:
    """Let the workers stop their trials after an interrupt: the terminal's Ctrl-C reached them too; one that is still
    running after a few seconds (the interrupt went to this process alone) gets SIGTERM, which it takes as Ctrl-C."""
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_workers(plan_file: Path, workers: int, storage: str | None, procs: list[subprocess.Popen]) -> None:
    """Start ``workers`` processes of :mod:`vit.sweep.worker` on ``plan_file`` into ``procs``, one by one (an
    interrupt meanwhile stops those started); ``storage`` reaches them through the environment."""
    env = {**os.environ, STORAGE_ENV: storage or ""}
    command = [sys.executable, "-m", "vit.sweep.worker", str(plan_file)]
    for i in range(workers):
        procs.append(subprocess.Popen([*command, str(i), str(workers)], env=env))


def stamp(text: str) -> str:
    """A progress line with the time of day."""
    return f"[{datetime.now():%H:%M:%S}] {text}"


def wait_for(workers: list[subprocess.Popen], progress) -> None:
    """Print ``progress()`` whenever it changes until every worker has exited."""
    last = None
    while True:
        line = progress()
        if line != last:
            print(stamp(line), flush=True)
            last = line
        if all(w.poll() is not None for w in workers):
            return
        time.sleep(POLL_S)


def budget_text(budgets: list[float]) -> str:
    return ", ".join(format_duration(b) for b in budgets) if budgets else "as configured"
