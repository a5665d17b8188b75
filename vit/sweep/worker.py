"""A sweep worker: a process that runs trials of the current rung until the last rung is finished.

``vit sweep`` starts ``--workers K`` of them (``python -m vit.sweep.worker PLAN.json INDEX K``), each bound to its
share of the cores (CPU affinity, inherited by its trials). Each loops: look at the rung (failing and retrying trials
whose worker died), claim a waiting trial or draw a new configuration, run it as a ``vit fit`` process, record its
value or its one-line reason; when the rung is finished, create the next from its survivors
(:mod:`vit.sweep.halving`); when nothing is left to claim, wait for the other workers' trials. Ctrl-C (or SIGTERM)
stops the running trial, which is failed and enqueued again, so that ``vit sweep FILE`` resumes it; so does a trial
that a signal stopped on its own (exit status 130 or 143 from ``vit fit``'s handler, -2 or -15 before it was set).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import optuna

from .halving import (
    CONFIG_ATTR,
    READY_ATTR,
    SURPLUS_ATTR,
    Plan,
    create_rung,
    is_retry,
    load_rung,
    open_sweep,
    promotions,
    rung_status,
    surplus,
)
from .space import sampler, suggest
from .storage import REASON_ATTR, WORKER_ATTR, open_storage, reap_lost_trials, worker_id
from .trial import fit_arguments, hold_signals, run_trial

STORAGE_ENV = "VIT_SWEEP_STORAGE"
"""How ``vit sweep`` hands ``--storage`` to its workers: the environment, so that a password never shows in ``ps``."""
POLL_S = 5.0
EXIT_INTERRUPTED = 128 + signal.SIGINT
"""The exit status of an interrupted worker, and of ``vit sweep`` when interrupted (as a shell reports Ctrl-C)."""


class TrialFailed(Exception):
    """A trial that ended without a value: its one-line reason is recorded and the sweep goes on."""


class TrialStopped(KeyboardInterrupt):
    """A trial process stopped by SIGINT or SIGTERM that this worker did not get (a signal sent to the trial alone): it
    is failed and enqueued again, as on Ctrl-C."""


STOPPED_BY = {status: s.name for s in (signal.SIGINT, signal.SIGTERM) for status in (128 + s, -s)}
"""The exit statuses of a ``vit fit`` stopped by a signal, and the signal's name: 130 or 143 from its own handler (its
checkpoint written), or killed by the signal before it set its handler."""


def cpu_share(index: int, workers: int, cores: list[int]) -> set[int]:
    """The cores of worker ``index`` of ``workers``: consecutive equal shares, one core each when there are more
    workers than cores."""
    if workers >= len(cores):
        return {cores[index % len(cores)]}
    return set(cores[index * len(cores) // workers : (index + 1) * len(cores) // workers])


class Worker:
    """Runs trials of a sweep's rungs in order (see the module docstring).

    Args:
        plan: The sweep's plan.
        storage: The Optuna storage.
        folder: The sweep folder (trials' run folders, logs, results).
        max_retry: Runs again of a trial whose worker died.
        group: The W&B group of the trials, or ``None``.
        seed: This worker's sampler seed.
    """

    def __init__(self, plan: Plan, storage: Any, folder: Path, max_retry: int, group: str | None, seed: int) -> None:
        self.plan, self.storage, self.folder, self.max_retry = plan, storage, folder, max_retry
        self.group, self.seed = group, seed
        self.running: tuple[optuna.Study, int] | None = None
        self.samplers: dict[int, optuna.samplers.BaseSampler] = {}

    def study(self, rung: int) -> optuna.Study | None:
        """The study of ``rung``, created when this worker is the first to need it."""
        plan = self.plan
        sample = self.samplers.setdefault(rung, sampler(plan.sweep, self.seed + 1000 * rung))  # one draw sequence
        study = load_rung(self.storage, plan, rung)
        if study is not None and study.user_attrs.get(READY_ATTR):
            return optuna.load_study(study_name=plan.study_name(rung), storage=self.storage, sampler=sample)
        if rung == 0:
            return open_sweep(self.storage, plan, sample)[0]
        return create_rung(self.storage, plan, rung, promotions(load_rung(self.storage, plan, rung - 1), plan), sample)

    def run(self) -> None:
        """Work until the last rung is finished."""
        rung = 0
        while rung < self.plan.rungs:
            study = self.study(rung)
            reap_lost_trials(study, self.max_retry)
            status = rung_status(study, self.plan, rung)
            if status.done:
                rung += 1
            elif status.waiting or (rung == 0 and status.drawn < status.size):
                study.optimize(lambda trial, r=rung: self.objective(trial, r), n_trials=1, catch=(TrialFailed,))
            else:
                time.sleep(POLL_S)  # the other workers' trials of this rung are still running

    def objective(self, trial: optuna.Trial, rung: int) -> float:
        """Run ``trial`` as a ``vit fit`` process and return its metric (:class:`TrialFailed` without one)."""
        study = trial.study
        trial.set_user_attr(WORKER_ATTR, worker_id())
        trial.set_user_attr(REASON_ATTR, "")  # a retry inherits the user attributes of the trial it repeats
        frozen = study.get_trials(deepcopy=False)[trial.number]
        if rung == 0 and CONFIG_ATTR not in trial.user_attrs and not is_retry(frozen):
            if self.plan.sweep.method != "grid" and surplus(study, self.plan, trial.number):
                trial.set_user_attr(SURPLUS_ATTR, True)
                raise optuna.TrialPruned("another worker drew the last configuration of rung 0")
            trial.set_user_attr(CONFIG_ATTR, trial.number)
        values = suggest(trial, self.plan.sweep)
        budget = self.plan.budget(rung)
        trial.set_user_attr("budget_s", budget)
        args = fit_arguments(self.plan.fit_args, values, self.folder / "trials", budget, self.group)
        stem = self.folder / "logs" / f"rung{rung}-trial{trial.number}"
        trial.set_user_attr("log", str(stem.with_suffix(".log")))
        self.running = (study, trial.number)  # what an interrupt fails and enqueues again
        try:
            outcome = run_trial(args, self.plan.sweep.metric, stem.with_suffix(".json"), stem.with_suffix(".log"))
        except KeyboardInterrupt:
            trial.set_user_attr(REASON_ATTR, "interrupted (Ctrl-C or SIGTERM); enqueued again")
            raise
        if outcome.exit_status in STOPPED_BY:  # the signal reached the trial alone: it stops this worker all the same
            name = STOPPED_BY[outcome.exit_status]
            trial.set_user_attr(REASON_ATTR, f"interrupted ({name} to the trial); enqueued again")
            raise TrialStopped(f"trial {trial.number} stopped by {name}")
        self.running = None
        trial.set_user_attr("run_dir", outcome.run_dir)
        if outcome.value is None:
            trial.set_user_attr(REASON_ATTR, outcome.reason)
            raise TrialFailed(outcome.reason)
        return outcome.value

    def retry_interrupted(self) -> None:
        """Enqueue again the trial an interrupt stopped (Optuna failed it), however often it was interrupted before
        (``max_retry`` bounds the runs again after a worker died, not after a stop the user asked for)."""
        if self.running is None:
            return
        study, number = self.running
        trial = study.get_trials(deepcopy=False)[number]
        if trial.state == optuna.trial.TrialState.RUNNING:
            study.tell(number, state=optuna.trial.TrialState.FAIL)
            trial = study.get_trials(deepcopy=False)[number]
        # Optuna's retry callback, less its count: retry_history (what --max_retry bounds) holds worker deaths only
        system_attrs = {"failed_trial": trial.number, "retry_history": [], **trial.system_attrs}
        study.add_trial(optuna.create_trial(state=optuna.trial.TrialState.WAITING, params=trial.params,
                                            distributions=trial.distributions, user_attrs=trial.user_attrs,
                                            system_attrs=system_attrs))  # fmt: skip


def take_as_ctrl_c(signum: int, frame: Any) -> None:
    """A signal handler that raises :class:`KeyboardInterrupt`: SIGTERM stops like Ctrl-C."""
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    """``python -m vit.sweep.worker PLAN.json INDEX WORKERS``."""
    plan_file, index, workers = Path(argv[0]), int(argv[1]), int(argv[2])
    data = json.loads(plan_file.read_text(encoding="utf-8"))
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpu_share(index, workers, sorted(os.sched_getaffinity(0))))
    signal.signal(signal.SIGTERM, take_as_ctrl_c)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background, which ignores it
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a failed trial is reported by vit sweep, in one line
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    plan = Plan.from_fingerprint(data["plan"], data["fit_args"], data["source"])
    storage = open_storage(os.environ.get(STORAGE_ENV) or None, plan_file.parent, data["max_retry"],
                           data["heartbeat_interval"], data["grace_period"])  # fmt: skip
    # Each worker and each start draws another sequence (a resumed sweep must not draw its first trials again), and
    # the same history gives the same seeds.
    first = load_rung(storage, plan, 0)
    seed = plan.seed + 7919 * index + 104729 * (len(first.get_trials(deepcopy=False)) if first else 0)
    worker = Worker(plan, storage, plan_file.parent, data["max_retry"], data["group"], seed)
    try:
        worker.run()
    except KeyboardInterrupt:
        hold_signals()  # vit sweep passes an interrupt on after 5 s: it must not cut the retry's enqueueing short
        worker.retry_interrupted()
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
