"""``vit sweep --storage postgresql://...`` on a real PostgreSQL server: workers of many machines join one study, and
a trial whose worker stops beating its heartbeat is failed and enqueued again."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import optuna
import pytest
from optuna.trial import TrialState

from vit.errors import UsageError
from vit.sweep.halving import CONFIG_ATTR, Plan, open_sweep
from vit.sweep.space import sampler
from vit.sweep.spec import parse_sweep
from vit.sweep.storage import open_storage, reap_lost_trials

optuna.logging.set_verbosity(optuna.logging.ERROR)

# A worker on another machine: it claims a trial of the study, beats its heartbeat, and hangs until it is killed.
HANGING_WORKER = """
import sys, time, optuna
storage = optuna.storages.RDBStorage(sys.argv[1], heartbeat_interval=1, grace_period=3)
study = optuna.load_study(study_name=sys.argv[2], storage=storage)
def objective(trial):
    trial.suggest_float("a", 0.0, 1.0)
    trial.set_user_attr("config", trial.number)
    print("running", flush=True)
    time.sleep(600)
study.optimize(objective, n_trials=1)
"""


@pytest.fixture
def plan() -> Plan:
    raw = {"program": "scripts/fit.py", "method": "random", "name": f"pg-{uuid.uuid4().hex[:8]}",
           "metric": {"name": "val/acc", "goal": "maximize"},
           "parameters": {"a": {"min": 0.0, "max": 1.0}}}  # fmt: skip
    sweep = parse_sweep(raw)
    return Plan(sweep, [20.0], 3, 3, [], 0, raw)


def test_machines_join_one_study_and_a_changed_plan_is_refused(postgres_url, plan, tmp_path):
    first = open_storage(postgres_url, tmp_path / "a", max_retry=1, heartbeat_interval=1, grace_period=3)
    second = open_storage(postgres_url, tmp_path / "b", max_retry=1, heartbeat_interval=1, grace_period=3)
    study, resumed = open_sweep(first, plan, sampler(plan.sweep, 0))
    assert not resumed
    trial = study.ask()
    study.tell(trial, 0.5)
    joined, resumed = open_sweep(second, plan, sampler(plan.sweep, 0))
    assert resumed and [t.value for t in joined.trials] == [0.5]
    other = Plan(plan.sweep, [30.0], 3, 3, [], 0, plan.raw)
    with pytest.raises(UsageError, match=r"--budget \[20.0\] there, \[30.0\] now"):
        open_sweep(second, other, sampler(plan.sweep, 0))
    optuna.delete_study(study_name=plan.sweep.name, storage=first)


def test_a_trial_without_heartbeat_is_failed_and_enqueued_again(postgres_url, plan, tmp_path):
    storage = open_storage(postgres_url, tmp_path, max_retry=1, heartbeat_interval=1, grace_period=3)
    study, _ = open_sweep(storage, plan, sampler(plan.sweep, 0))
    worker = subprocess.Popen([sys.executable, "-c", HANGING_WORKER, postgres_url, plan.sweep.name],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert worker.stdout.readline().strip() == "running"
    time.sleep(1.5)
    assert reap_lost_trials(study, max_retry=1) == []  # its heartbeat is fresh
    worker.kill()
    worker.wait()
    time.sleep(4.0)  # past the grace period
    reap_lost_trials(study, max_retry=1)
    lost, retry = study.trials
    assert lost.state == TrialState.FAIL and retry.state == TrialState.WAITING
    assert retry.params == lost.params and retry.user_attrs[CONFIG_ATTR] == lost.number
    assert retry.system_attrs["failed_trial"] == lost.number
    optuna.delete_study(study_name=plan.sweep.name, storage=storage)


def test_an_unreachable_database_is_one_usage_error(tmp_path):
    with pytest.raises(UsageError, match=r"--storage postgresql://me:\*\*\*@127.0.0.1:9/db: cannot open the database"):
        open_storage("postgresql://me:secret@127.0.0.1:9/db", tmp_path, max_retry=1)
