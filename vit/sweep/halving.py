"""Successive halving over Optuna studies: one study per rung, each rung a fresh run of the survivors.

Rung 0 is the study named after the sweep: the sampler draws ``count`` configurations (a grid sweep enqueues its
combinations once). When every trial of rung ``k - 1`` is finished, the first worker to see it creates the study
``<name>.rung<k>`` (creating a study is atomic in both storages, so exactly one worker does) and enqueues the best
``1/eta`` configurations of rung ``k - 1`` with the longer budget; the workers then claim those waiting trials one by
one, as Optuna pops a waiting trial atomically. A study per rung keeps the sampler's history to trials of one budget,
so TPE never mistakes a longer run's higher accuracy for a better region.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from vit.errors import UsageError

from .budget import survivors
from .space import grid_points
from .spec import Sweep, parse_sweep

PLAN_ATTR = "vit_sweep_plan"
"""Study user attribute of rung 0: the plan (:meth:`Plan.fingerprint`); a second start must bring the same."""
READY_ATTR = "ready"
"""Study user attribute: the rung's trials are enqueued (set last by the worker that created the rung)."""
CONFIG_ATTR = "config"
"""Trial user attribute: the rung-0 trial number of the configuration, the same in every rung and retry."""
BASELINE_ATTR = "baseline"
"""Trial user attribute: the configuration is the sweep command's own (``vit sweep --baseline``), in every rung."""
SURPLUS_ATTR = "surplus"
"""Trial user attribute of a rung-0 trial drawn after another worker took the last place: pruned, not counted."""
ENQUEUE_GRACE_S = 30.0
"""A rung created without its ``ready`` mark for this long lost its creator: another worker enqueues its trials."""


@dataclass
class Plan:
    """What every worker of a sweep runs; stored with the study so that a later start can be checked against it.

    Args:
        sweep: The sweep file as read (:class:`~vit.sweep.spec.Sweep`).
        budgets: Seconds of each rung; empty: one rung, trials run as configured.
        count: Configurations of rung 0.
        eta: The halving factor.
        fit_args: The ``vit fit`` arguments of every trial before its own values: the sweep command's and this
            machine's own (after ``--``: a data folder may differ between machines, so they are not fingerprinted).
        seed: The sampler's seed.
        raw: The sweep file as loaded, for the fingerprint.
        baseline: Optuna parameter values of the sweep command's own configuration, the first trial of rung 0
            (``--baseline``), or ``None``.
    """

    sweep: Sweep
    budgets: list[float]
    count: int
    eta: int
    fit_args: list[str]
    seed: int = 0
    raw: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] | None = None

    @property
    def rungs(self) -> int:
        return max(1, len(self.budgets))

    def study_name(self, rung: int) -> str:
        return self.sweep.name if rung == 0 else f"{self.sweep.name}.rung{rung}"

    def budget(self, rung: int) -> float | None:
        return self.budgets[rung] if self.budgets else None

    def fingerprint(self) -> dict[str, Any]:
        """The JSON of what decides the trials: the sweep file (with its command), budgets, count, eta and seed."""
        found = {"sweep": self.raw, "budgets": self.budgets, "count": self.count, "eta": self.eta, "seed": self.seed}
        if self.baseline is not None:
            found["baseline"] = self.baseline
        return json.loads(json.dumps(found))

    @classmethod
    def from_fingerprint(cls, data: dict[str, Any], fit_args: list[str], source: str = "sweep.yaml") -> Plan:
        sweep = parse_sweep(data["sweep"], source)
        return cls(sweep, data["budgets"], data["count"], data["eta"], fit_args, data["seed"], data["sweep"],
                   data.get("baseline"))  # fmt: skip


def open_sweep(storage: Any, plan: Plan, sampler: Any, remedy: str = "") -> tuple[optuna.Study, bool]:
    """The rung-0 study of ``plan``: created (:func:`first_entries` enqueued), or loaded when it exists; ``True`` when
    it existed.

    Args:
        storage: The study's storage.
        plan: The plan of this start.
        sampler: The sampler of rung 0.
        remedy: What to do about a study that holds another plan (a sentence), after its differences.

    Raises:
        UsageError: When the study holds another plan (a changed sweep file, budget, count, eta or seed), naming the
            keys that differ: a sweep is never silently replaced, nor mixed with another.
    """
    study = load_rung(storage, plan, 0)
    if study is None:
        study = create_rung(storage, plan, 0, first_entries(plan), sampler)
        if study.user_attrs.get(PLAN_ATTR) == plan.fingerprint():
            return study, False
    stored = study.user_attrs.get(PLAN_ATTR) or {}
    if stored != plan.fingerprint():
        raise UsageError(
            f"the study {plan.sweep.name!r} was started with another sweep: {plan_differences(stored, plan)}. "
            f"{remedy or 'Give this one another name'}"
        )
    return study, True


def first_entries(plan: Plan) -> list[dict[str, Any]]:
    """The trials enqueued in rung 0 as it is created: the baseline first (``--baseline``), then a grid's
    combinations (the baseline's left out), ``plan.count`` in all."""
    first = [{"params": plan.baseline, "user_attrs": {BASELINE_ATTR: True}}] if plan.baseline is not None else []
    if plan.sweep.method != "grid":
        return first
    grid = [{"params": p} for p in grid_points(plan.sweep) if p != plan.baseline]
    return [*first, *grid][: plan.count]


_OPTIONS = {"baseline": "--baseline", "budgets": "--budget", "count": "configurations (--trials, run_cap)",
            "eta": "--eta", "seed": "--seed"}  # fmt: skip


def plan_differences(stored: dict[str, Any], plan: Plan, most: int = 3) -> str:
    """The keys where the ``stored`` plan differs from ``plan``'s, with both values (the sweep file's keys by their
    dotted path, ``parameters.model.lr.max``; the options by their flag), at most ``most`` of them."""
    mine = plan.fingerprint()
    found = _differences(stored.get("sweep"), mine["sweep"], "")
    found += [(_OPTIONS[key], stored.get(key, _ABSENT), mine.get(key, _ABSENT)) for key in _OPTIONS
              if stored.get(key) != mine.get(key)]  # fmt: skip
    parts = [f"{key} {_short(old)} there, {_short(new)} now" for key, old, new in found[:most]]
    more = len(found) - most
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


_ABSENT = object()


def _differences(old: Any, new: Any, key: str) -> list[tuple[str, Any, Any]]:
    """``(dotted key, old, new)`` of every leaf where two loaded YAML mappings differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for name in [*old, *(k for k in new if k not in old)]:
            child = f"{key}.{name}" if key else str(name)
            found += _differences(old.get(name, _ABSENT), new.get(name, _ABSENT), child)
        return found
    return [] if old == new else [(key or "the sweep file", old, new)]


def _short(value: Any, width: int = 60) -> str:
    text = "absent" if value is _ABSENT else json.dumps(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def load_rung(storage: Any, plan: Plan, rung: int) -> optuna.Study | None:
    """The study of ``rung``, or ``None`` while it does not exist."""
    try:
        return optuna.load_study(study_name=plan.study_name(rung), storage=storage)
    except KeyError:
        return None


def create_rung(storage: Any, plan: Plan, rung: int, entries: Sequence[dict[str, Any]], sampler: Any) -> optuna.Study:
    """Create the study of ``rung`` and enqueue ``entries`` (``{"params": ..., "user_attrs": ...}``) in it, or load it
    when another worker created it first.

    Args:
        storage: The Optuna storage.
        plan: The sweep's plan.
        rung: The rung.
        entries: The trials to enqueue: rung 0 of a grid, or the survivors of the previous rung.
        sampler: The sampler of the study.
    """
    direction = "maximize" if plan.sweep.maximize else "minimize"
    try:
        study = optuna.create_study(study_name=plan.study_name(rung), storage=storage, direction=direction,
                                    sampler=sampler)  # fmt: skip
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=plan.study_name(rung), storage=storage, sampler=sampler)
        _repair(study, entries)
        return study
    if rung == 0:
        study.set_user_attr(PLAN_ATTR, plan.fingerprint())
    for entry in entries:
        study.enqueue_trial(entry["params"], user_attrs=entry.get("user_attrs"))
    study.set_user_attr(READY_ATTR, True)
    return study


def _repair(study: optuna.Study, entries: Sequence[dict[str, Any]]) -> None:
    """A rung another worker created: wait for its ``ready`` mark; if its creator died before setting it, enqueue the
    entries it had not enqueued yet."""
    deadline = time.monotonic() + ENQUEUE_GRACE_S
    while not study.user_attrs.get(READY_ATTR):
        if time.monotonic() > deadline:
            for entry in entries:
                study.enqueue_trial(entry["params"], user_attrs=entry.get("user_attrs"), skip_if_exists=True)
            study.set_user_attr(READY_ATTR, True)
            return
        time.sleep(1.0)


@dataclass
class RungStatus:
    """The trials of one rung by state (surplus draws left out); ``done`` when none will run any more."""

    rung: int
    size: int
    complete: int = 0
    running: int = 0
    waiting: int = 0
    failed: int = 0
    drawn: int = 0
    best: FrozenTrial | None = None

    @property
    def done(self) -> bool:
        return self.drawn >= self.size and not self.running and not self.waiting


def is_retry(trial: FrozenTrial) -> bool:
    """Whether ``trial`` is a second run of a trial whose worker died (Optuna's retry callbacks mark it)."""
    return "failed_trial" in trial.system_attrs


def counted(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The trials of a rung that count: surplus draws left out."""
    return [t for t in trials if not t.user_attrs.get(SURPLUS_ATTR)]


def rung_status(study: optuna.Study, plan: Plan, rung: int) -> RungStatus:
    """Count the trials of ``rung``; its size is ``plan.count`` for rung 0, else the trials enqueued in it."""
    trials = counted(study.get_trials(deepcopy=False))
    size = plan.count if rung == 0 else sum(1 for t in trials if not is_retry(t))
    status = RungStatus(rung, size, drawn=sum(1 for t in trials if not is_retry(t)))
    for t in trials:
        if t.state == TrialState.COMPLETE:
            status.complete += 1
        elif t.state == TrialState.RUNNING:
            status.running += 1
        elif t.state == TrialState.WAITING:
            status.waiting += 1
        elif t.state == TrialState.FAIL:
            status.failed += 1
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if complete:
        status.best = (max if plan.sweep.maximize else min)(complete, key=lambda t: t.value)
    return status


def promotions(study: optuna.Study, plan: Plan) -> list[dict[str, Any]]:
    """The survivors of a finished rung: the best ``1/eta`` of its configurations (of those that completed), as the
    entries of the next rung, best first."""
    complete = [t for t in counted(study.get_trials(deepcopy=False)) if t.state == TrialState.COMPLETE]
    configs = {t.user_attrs.get(CONFIG_ATTR, t.number) for t in counted(study.get_trials(deepcopy=False))
               if not is_retry(t)}  # fmt: skip
    ranked = sorted(complete, key=lambda t: t.value, reverse=plan.sweep.maximize)
    keep = ranked[: survivors(len(configs), plan.eta)]
    return [{"params": dict(t.params), "user_attrs": {CONFIG_ATTR: t.user_attrs.get(CONFIG_ATTR, t.number),
                                                      **({BASELINE_ATTR: True} if is_baseline(t) else {})}}
            for t in keep]  # fmt: skip


def is_baseline(trial: FrozenTrial) -> bool:
    """Whether ``trial`` runs the sweep command's own configuration (``--baseline``)."""
    return bool(trial.user_attrs.get(BASELINE_ATTR))


def surplus(study: optuna.Study, plan: Plan, trial_number: int) -> bool:
    """Whether a freshly drawn rung-0 trial came after the last place was taken (two workers drew at once)."""
    before = [t for t in counted(study.get_trials(deepcopy=False)) if t.number < trial_number and not is_retry(t)]
    return len(before) >= plan.count
