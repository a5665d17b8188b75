"""``vit sweep``'s pieces without training: the Optuna mapping, successive halving's promotions, resuming a study,
failing and retrying a trial whose worker died, a trial's arguments and outcome, the table and best.yaml."""

from __future__ import annotations

import math
import os
import socket
import statistics
import subprocess
import sys

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from vit.errors import UsageError
from vit.sweep import worker as sweep_worker
from vit.sweep.halving import CONFIG_ATTR, Plan, open_sweep, promotions, rung_status
from vit.sweep.report import Row, best_row, fit_config, table, write_best_config
from vit.sweep.space import grid_points, sampler, suggest
from vit.sweep.spec import parse_sweep
from vit.sweep.storage import REASON_ATTR, WORKER_ATTR, open_storage, reap_lost_trials
from vit.sweep.trial import Outcome, fit_arguments, read_outcome
from vit.sweep.worker import TrialFailed, TrialStopped, Worker, cpu_share

optuna.logging.set_verbosity(optuna.logging.ERROR)
BASE = {"program": "scripts/fit.py", "metric": {"name": "val/acc", "goal": "maximize"},
        "command": ["${env}", "${interpreter}", "${program}", "--config", "quickstart", "${args}"]}  # fmt: skip


def plan_of(parameters: dict, method: str = "random", count: int = 9, budgets=(), goal="maximize") -> Plan:
    raw = {**BASE, "method": method, "parameters": parameters, "metric": {"name": "val/acc", "goal": goal}}
    sweep = parse_sweep(raw, "s.yaml")
    return Plan(sweep, list(budgets), count, 3, list(sweep.fit_args), 0, raw)


def test_every_distribution_draws_what_wandb_documents():
    plan = plan_of({
        "u": {"distribution": "uniform", "min": 0.1, "max": 0.5},
        "i": {"distribution": "int_uniform", "min": 2, "max": 6},
        "q": {"distribution": "q_uniform", "min": 64, "max": 256, "q": 64},
        "lv": {"distribution": "log_uniform_values", "min": 1e-4, "max": 1e-2},
        "ql": {"distribution": "q_log_uniform_values", "min": 8, "max": 512, "q": 8},
        "c": {"values": [[2, 5], "avg", True]},
        "k": {"value": [0, 3]},
    })  # fmt: skip
    study = optuna.create_study(sampler=sampler(plan.sweep, seed=0))
    draws = [suggest(study.ask(), plan.sweep) for _ in range(300)]
    assert all(0.1 <= d["u"] <= 0.5 for d in draws)
    assert {d["i"] for d in draws} == {2, 3, 4, 5, 6}
    assert {d["q"] for d in draws} == {64, 128, 192, 256}
    assert all(d["ql"] % 8 == 0 and 8 <= d["ql"] <= 512 and isinstance(d["ql"], int) for d in draws)
    assert {repr(d["c"]) for d in draws} == {"[2, 5]", "'avg'", "True"}
    assert all(d["k"] == [0, 3] for d in draws)
    # log-uniform: the log of the value is uniform, so its median is the middle of the log bounds (sd of the
    # median of 300 uniform draws on a 4.6-wide interval: about 0.096)
    middle = (math.log(1e-4) + math.log(1e-2)) / 2
    assert abs(statistics.median(math.log(d["lv"]) for d in draws) - middle) < 0.4
    assert statistics.median(d["u"] for d in draws) == pytest.approx(0.3, abs=0.05)


def test_tpe_is_multivariate_with_constant_liar():
    tpe = sampler(plan_of({"u": {"min": 0.0, "max": 1.0}}, method="bayes").sweep, seed=0)
    assert isinstance(tpe, optuna.samplers.TPESampler)
    assert tpe._multivariate and tpe._constant_liar


def test_a_grid_is_enqueued_once_and_runs_every_combination():
    plan = plan_of({"a": {"values": [1, 2, 3]}, "b": {"values": ["x", "y"]}, "c": {"value": 0}}, "grid", count=6)
    storage = optuna.storages.InMemoryStorage()
    study, resumed = open_sweep(storage, plan, sampler(plan.sweep, 0))
    assert not resumed
    waiting = study.get_trials(states=(TrialState.WAITING,))
    fixed = [t.system_attrs["fixed_params"] for t in waiting]  # enqueue_trial keeps them there until asked
    assert sorted((p["a"], p["b"]) for p in fixed) == [(a, b) for a in (1, 2, 3) for b in "xy"]
    assert len(grid_points(plan.sweep)) == 6
    seen = set()
    for _ in range(6):
        trial = study.ask()
        values = suggest(trial, plan.sweep)
        seen.add((values["a"], values["b"], values["c"]))
        study.tell(trial, 0.5)
    assert len(seen) == 6 and rung_status(study, plan, 0).done


@pytest.mark.parametrize("goal", ["maximize", "minimize"])
def test_promotion_keeps_the_best_third_of_a_rung(goal):
    plan = plan_of({"a": {"min": 0.0, "max": 1.0}}, count=9, budgets=(20, 60), goal=goal)
    study, _ = open_sweep(optuna.storages.InMemoryStorage(), plan, sampler(plan.sweep, 0))
    values = [0.3, 0.9, None, 0.1, 0.7, 0.5, 0.8, 0.2, 0.6]  # None: a trial that failed on its own
    for value in values:
        trial = study.ask()
        trial.set_user_attr(CONFIG_ATTR, trial.number)
        suggest(trial, plan.sweep)
        study.tell(trial, value, state=TrialState.FAIL if value is None else None)
    status = rung_status(study, plan, 0)
    assert (status.done, status.complete, status.failed) == (True, 8, 1)
    kept = promotions(study, plan)
    order = sorted((v, i) for i, v in enumerate(values) if v is not None)
    best = [i for _, i in (order[::-1] if goal == "maximize" else order)][:3]  # 9 configurations // eta 3
    assert [entry["user_attrs"][CONFIG_ATTR] for entry in kept] == best
    assert [entry["params"] for entry in kept] == [study.trials[i].params for i in best]


def test_a_second_start_resumes_and_a_changed_plan_is_refused(tmp_path):
    plan = plan_of({"a": {"min": 0.0, "max": 1.0}}, budgets=(20, 60))
    storage = open_storage(None, tmp_path, max_retry=1)
    assert open_sweep(storage, plan, sampler(plan.sweep, 0))[1] is False
    again = open_storage(None, tmp_path, max_retry=1)  # another process: the journal file read back
    assert open_sweep(again, plan, sampler(plan.sweep, 0))[1] is True
    changed = plan_of({"a": {"min": 0.0, "max": 1.0}}, budgets=(20, 90))
    with pytest.raises(UsageError, match=r"--budget \[20, 60\] there, \[20, 90\] now"):
        open_sweep(again, changed, sampler(changed.sweep, 0))


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("max_retry", [0, 2])
def test_a_trial_whose_worker_died_is_failed_and_enqueued_again(tmp_path, max_retry):
    plan = plan_of({"a": {"min": 0.0, "max": 1.0}})
    study, _ = open_sweep(open_storage(None, tmp_path, max_retry), plan, sampler(plan.sweep, 0))
    host = socket.gethostname()
    lost, alive = study.ask(), study.ask()
    for trial, pid in ((lost, dead_pid()), (alive, None)):
        suggest(trial, plan.sweep)
        trial.set_user_attr(CONFIG_ATTR, trial.number)
        trial.set_user_attr(WORKER_ATTR, f"{host}:{pid or os.getpid()}")
    assert reap_lost_trials(study, max_retry) == [lost.number]
    states = {t.number: t.state for t in study.trials}
    assert states[lost.number] == TrialState.FAIL and states[alive.number] == TrialState.RUNNING
    retries = study.get_trials(states=(TrialState.WAITING,))
    assert len(retries) == (1 if max_retry else 0)
    if retries:
        assert retries[0].params == study.trials[lost.number].params
        assert retries[0].user_attrs[CONFIG_ATTR] == lost.number
        assert retries[0].system_attrs["failed_trial"] == lost.number
    assert reap_lost_trials(study, max_retry) == []  # once only


@pytest.mark.parametrize(("status", "name"), [(130, "SIGINT"), (143, "SIGTERM"), (-2, "SIGINT"), (-15, "SIGTERM")])
def test_a_trial_stopped_by_a_signal_is_enqueued_again_however_small_max_retry(tmp_path, monkeypatch, status, name):
    """130/143: ``vit fit``'s handler stopped it; -2/-15: the signal came before that handler was set. Either way it
    stops the worker and is enqueued again, also with ``max_retry`` 0 and after an earlier interruption."""
    plan = plan_of({"a": {"min": 0.0, "max": 1.0}}, count=1)
    monkeypatch.setattr(sweep_worker, "run_trial", lambda *args: Outcome(None, "", "", status))
    worker = Worker(plan, open_storage(None, tmp_path, 0), tmp_path, max_retry=0, group=None, seed=0)
    for _ in range(2):  # the retry of the first stop is stopped too
        study = worker.study(0)
        with pytest.raises(TrialStopped, match=name):
            study.optimize(lambda trial: worker.objective(trial, 0), n_trials=1, catch=(TrialFailed,))
        worker.retry_interrupted()
        worker.running = None
        trials = study.get_trials(deepcopy=False)
        stopped, (retry,) = trials[-2], study.get_trials(states=(TrialState.WAITING,))
        assert stopped.state == TrialState.FAIL and retry.params == stopped.params
        assert stopped.user_attrs[REASON_ATTR] == f"interrupted ({name} to the trial); enqueued again"
    retry = trials[-1].system_attrs  # a retry of the first trial that has not used up --max_retry (worker deaths)
    assert len(study.trials) == 3 and retry["failed_trial"] == 0 and retry["retry_history"] == []


def test_trial_arguments_are_the_sweep_command_then_budget_then_values(tmp_path):
    args = fit_arguments(["--config", "c.yaml"], {"model.lr": 0.002, "m.idx": [2, 5], "m.flag": True, "m.s": "avg",
                                                  "m.none": None}, tmp_path, 300, "grp")  # fmt: skip
    assert args == ["--config", "c.yaml", f"--runs_dir={tmp_path}", "--model.schedule=time",
                    "--trainer.max_time=00:00:05:00", "--trainer.max_epochs=-1",
                    "--trainer.logger.init_args.group=grp", "--model.lr=0.002", "--m.idx=[2, 5]", "--m.flag=true",
                    "--m.s=avg", "--m.none=null"]  # fmt: skip
    assert fit_arguments([], {}, tmp_path, None, None) == [f"--runs_dir={tmp_path}"]


def test_a_trial_outcome_is_its_metric_or_its_one_line_reason(tmp_path):
    result, log = tmp_path / "r.json", tmp_path / "t.log"
    result.write_text('{"metric": "val/acc", "value": 0.75, "logged": ["val/acc"], "run_dir": "runs/x"}')
    assert read_outcome(result, log, 0).value == 0.75
    result.write_text('{"metric": "val/acc", "value": NaN, "logged": ["val/acc"], "run_dir": "runs/x"}')
    assert read_outcome(result, log, 0).reason == "val/acc is nan"
    result.write_text('{"metric": "val/top5", "value": null, "logged": ["val/acc", "val/loss"], "run_dir": ""}')
    assert read_outcome(result, log, 0).reason == "val/top5 was not logged (logged: val/acc, val/loss)"
    result.unlink()
    log.write_text("Seed set to 0\nerror: training stopped: the loss is nan at step 12\n")
    outcome = read_outcome(result, log, 3)
    assert (outcome.value, outcome.reason) == (None, "training stopped: the loss is nan at step 12")


def test_cpu_shares_partition_the_cores():
    assert [cpu_share(i, 2, [0, 1, 2, 3]) for i in range(2)] == [{0, 1}, {2, 3}]
    assert [cpu_share(i, 3, [0, 1]) for i in range(3)] == [{0}, {1}, {0}]


def test_the_table_and_best_yaml_carry_the_best_trial(tmp_path):
    plan = plan_of({"model.lr": {"values": [0.001, 0.004]}, "model.model_overrides.depth": {"value": 2}},
                   count=2, budgets=(20,))  # fmt: skip
    plan.fit_args.append("--data.batch_size=16")
    study, _ = open_sweep(optuna.storages.InMemoryStorage(), plan, sampler(plan.sweep, 0))
    for value, lr in ((0.6, 0.001), (0.8, 0.004)):
        study.enqueue_trial({"model.lr": lr})
        trial = study.ask()
        suggest(trial, plan.sweep)
        trial.set_user_attr("run_dir", f"runs/lr{lr}")
        study.tell(trial, value)
    found = [Row(0, t) for t in study.trials]
    best = best_row(found, plan)
    assert best.trial.params["model.lr"] == 0.004
    lines = table(found, plan).splitlines()
    assert lines[0].split() == ["rung", "budget", "trial", "config", "lr", "val/acc", "(last)", "run", "folder", "/",
                                "state"]  # fmt: skip
    assert lines[1].split() == ["0", "20s", "1", "1", "0.004", "0.8000", "runs/lr0.004"]
    written = yaml.safe_load(write_best_config(tmp_path / "best.yaml", plan, best).read_text())
    base, _ = fit_config(["--config", "quickstart"])
    assert written["model"]["lr"] == 0.004 and written["model"]["model_overrides"]["depth"] == 2
    assert written["data"] == base["data"] and written["trainer"] == base["trainer"]  # not the trials' --data...
    assert written["model"]["model_overrides"]["embed_dim"] == base["model"]["model_overrides"]["embed_dim"]


def test_the_progress_figure_ticks_whole_trial_numbers():
    from vit.sweep.report import progress_figure

    plan = plan_of({"model.lr": {"values": [0.001, 0.004]}}, count=2)
    study, _ = open_sweep(optuna.storages.InMemoryStorage(), plan, sampler(plan.sweep, 0))
    for value in (0.6, 0.8):
        trial = study.ask()
        suggest(trial, plan.sweep)
        study.tell(trial, value)
    figure = progress_figure([Row(0, t) for t in study.trials], plan)
    figure.canvas.draw()
    ticks = [tick for tick in figure.axes[0].get_xticks() if 0 <= tick <= 1]
    assert ticks and all(float(tick).is_integer() for tick in ticks), ticks  # 0, 1: never 0.2, 0.4...


def test_vit_compare_shows_the_table_of_a_sweep_folder(tmp_path, capsys):
    from vit.compare.command import main as compare
    from vit.sweep.driver import Sweeper

    sweep = parse_sweep({**BASE, "method": "grid", "name": "cmp", "parameters": {"model.lr": {"values": [0.1, 0.2]}}})
    sweeper = Sweeper(sweep, {"budgets": [20.0], "count": 2, "eta": 3, "seed": 0}, [], tmp_path, None, 1, 30)
    study, _ = open_sweep(sweeper.storage, sweeper.plan, sampler(sweep, 0))
    trial = study.ask()
    suggest(trial, sweep)
    trial.set_user_attr("run_dir", "runs/cmp/a")
    study.tell(trial, 0.75)
    sweeper.write_plan()
    assert compare([str(tmp_path)]) == 0  # its trials logged no W&B run: the table is the comparison
    out = capsys.readouterr().out
    assert out.startswith("sweep cmp: 2 of 2 configurations, 2 trials: 1 done, 0 failed, 0 running, 1 waiting")
    assert "0     20s     0      0       0.1  0.7500          runs/cmp/a" in out


def test_a_trial_validates_again_when_its_last_validation_came_before_the_end():
    from types import SimpleNamespace

    from vit.sweep.trial import stale

    def trainer(step, metrics):
        return SimpleNamespace(global_step=step, callback_metrics=metrics)

    planned = SimpleNamespace(time_plan=SimpleNamespace(total_steps=100))
    assert not stale(trainer(100, {"val/acc": 0.5}), planned, "val/acc")  # the plan's own end: validated there
    assert stale(trainer(60, {"val/acc": 0.5}), planned, "val/acc")  # max_time stopped it first
    assert stale(trainer(100, {}), planned, "val/acc")
    assert not stale(trainer(60, {}), SimpleNamespace(), "train/loss")  # not a validation metric
    assert not stale(trainer(60, {"val/acc": 0.5}), SimpleNamespace(), "val/acc")  # epochs: its last validation


def test_the_sweep_run_in_wandb_holds_the_table_and_the_best_value(tmp_path):
    from vit.compare.runs import read_offline_runs
    from vit.sweep.wandb_run import log_sweep, wandb_project

    plan = plan_of({"model.lr": {"values": [0.001, 0.004]}}, count=2, budgets=(20,))
    assert wandb_project(plan) == "vit"  # quickstart's WandbLogger
    assert wandb_project(plan_of({"trainer.logger": {"value": False}})) is None
    study, _ = open_sweep(optuna.storages.InMemoryStorage(), plan, sampler(plan.sweep, 0))
    for value in (0.6, 0.8):
        trial = study.ask()
        suggest(trial, plan.sweep)
        study.tell(trial, value)
    folder = log_sweep(plan, [Row(0, t) for t in study.trials], [], tmp_path, "vit")
    (run,) = read_offline_runs([folder])
    assert (run.kind, run.group) == ("sweep", plan.sweep.name)
    assert run.summary["best/val/acc"] == 0.8 and run.summary["best/trial"] == 1


def test_listings_of_trials_say_the_value_is_the_last_and_how_many_configurations_of_the_plan(tmp_path, monkeypatch):
    """A trial's value is its fit's last: the W&B table's column and progress.png's axis say so; an interrupted sweep
    says how many configurations of the plan it started."""
    import wandb

    from vit.sweep.report import progress_figure, summary
    from vit.sweep.wandb_run import log_sweep

    plan = plan_of({"model.lr": {"values": [0.001, 0.004]}}, count=3, budgets=(20,))
    study, _ = open_sweep(optuna.storages.InMemoryStorage(), plan, sampler(plan.sweep, 0))
    trial = study.ask()
    suggest(trial, plan.sweep)
    study.tell(trial, 0.6)
    found = [Row(0, t) for t in study.trials]
    assert summary(found, plan).startswith("1 of 3 configurations, 1 trial: 1 done")
    assert progress_figure(found, plan).axes[0].get_ylabel() == "val/acc (last)"
    logged = []

    class Table(wandb.Table):
        def __init__(self, columns, data):
            logged.extend(columns)
            super().__init__(columns=columns, data=data)

    monkeypatch.setattr(wandb, "Table", Table)
    log_sweep(plan, found, [], tmp_path, "vit")
    assert "val/acc (last)" in logged and "val/acc" not in logged
