"""``vit sweep`` end to end on real ``vit fit`` trials (a tiny model on the digits, seconds each): two workers on one
study, one SIGKILLed mid-trial, a trial that fails on its own; the study completes with every trial accounted for,
resumes without running anything again, and its best.yaml trains with ``vit fit --config``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from vit.sweep.storage import REASON_ATTR, WORKER_ATTR, open_storage

optuna.logging.set_verbosity(optuna.logging.ERROR)
ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "model.model_overrides.depth": {"value": 1},
    "model.model_overrides.embed_dim": {"value": 16},
    "model.model_overrides.global_attn_indexes": {"value": [0]},
    "trainer.callbacks": {"value": []},
    "trainer.logger": {"value": False},
    "trainer.enable_progress_bar": {"value": False},
    "trainer.enable_model_summary": {"value": False},
}


def write_sweep(folder: Path, parameters: dict, **top) -> Path:
    sweep = {"program": "scripts/fit.py", "method": "grid", "metric": {"name": "val/acc", "goal": "maximize"},
             "parameters": {**TINY, **parameters}, **top,
             "command": ["${env}", "${interpreter}", "${program}", "--config", "quickstart", "${args}"]}  # fmt: skip
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def vit_sweep(*args: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "vit", "sweep", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip


def running_trial(out: Path, deadline: float) -> optuna.trial.FrozenTrial:
    """The first running trial of rung 0 whose worker, values and log are known (waiting for one to start); the worker
    sets them one at a time, the log last, just before it starts the trial's process."""
    while time.monotonic() < deadline:
        if (out / "study.journal").is_file():
            try:
                study = optuna.load_study(study_name="tiny", storage=open_storage(None, out, 1))
            except KeyError:  # the journal is there, the study not yet
                time.sleep(0.5)
                continue
            for trial in study.get_trials(states=(TrialState.RUNNING,)):
                known = WORKER_ATTR in trial.user_attrs and "log" in trial.user_attrs
                if known and trial.params.get("model.model_overrides.num_heads") == 2:
                    return trial
        time.sleep(0.5)
    raise AssertionError("no trial started")


@pytest.mark.slow
def test_a_worker_killed_mid_trial_loses_nothing(tmp_path):
    heads = {"model.model_overrides.num_heads": {"values": [2, 3]}}  # 16 channels in 3 heads: vit fit refuses
    sweep_file, out = write_sweep(tmp_path, heads), tmp_path / "sweep"
    command = vit_sweep(str(sweep_file), "--budget", "3s", "--workers", "2", "--out", str(out), cwd=tmp_path)
    victim = running_trial(out, time.monotonic() + 240)
    time.sleep(1.0)
    os.kill(int(victim.user_attrs[WORKER_ATTR].rsplit(":", 1)[1]), signal.SIGKILL)
    output, _ = command.communicate(timeout=600)
    assert command.returncode == 0, output[-3000:]

    study = optuna.load_study(study_name="tiny", storage=open_storage(None, out, 1))
    trials = study.trials
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    killed = trials[victim.number]
    assert killed.state == TrialState.FAIL and not killed.user_attrs[REASON_ATTR]
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == victim.number]
    assert retry.state == TrialState.COMPLETE and retry.params == victim.params
    final = {t.params["model.model_overrides.num_heads"]: t for t in trials if t.number != victim.number}
    assert sorted(final) == [2, 3] and len(trials) == 3  # two configurations, one retry
    assert final[3].state == TrialState.FAIL
    refused = "model.model / model.model_overrides: embed_dim 16 is not divisible by num_heads 3"
    assert final[3].user_attrs[REASON_ATTR] == refused
    assert final[2].number == retry.number and 0.0 <= retry.value <= 1.0
    saved = yaml.safe_load(Path(retry.user_attrs["run_dir"], "config.yaml").read_text())  # an ordinary vit fit run
    assert saved["trainer"]["max_time"] == "00:00:00:03" and saved["model"]["schedule"] == "time"
    assert f"(retry of trial {victim.number})" in output and "is not divisible by num_heads 3" in output
    assert {p.name for p in out.glob("*.png")} == {"progress.png"}  # importance and parallel plots need two values

    again = vit_sweep(str(sweep_file), "--budget", "3s", "--out", str(out), cwd=tmp_path)
    output, _ = again.communicate(timeout=300)
    assert again.returncode == 0 and "resuming sweep tiny" in output, output[-3000:]
    assert len(optuna.load_study(study_name="tiny", storage=open_storage(None, out, 1)).trials) == 3

    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["model"]["model_overrides"]["num_heads"] == 2
    from vit.cli import cli_main

    cli = cli_main(["fit", "--config", str(out / "best.yaml"), "--trainer.fast_dev_run=1", f"--runs_dir={tmp_path}"])
    assert cli.model.model.blocks[0].attn.num_heads == best["model"]["model_overrides"]["num_heads"]
    assert cli.model.model.embed_dim == 16 and len(cli.model.model.blocks) == 1


def trial_process(worker_pid: int) -> int:
    """The pid of the trial process a worker started (its only child)."""
    (child,) = Path(f"/proc/{worker_pid}/task/{worker_pid}/children").read_text().split()
    return int(child)


@pytest.mark.slow
@pytest.mark.parametrize(("target", "signum"), [("trial", signal.SIGINT), ("sweep", signal.SIGTERM)])
def test_a_signal_to_the_trial_alone_or_to_vit_sweep_alone_stops_and_enqueues_the_trial_again(tmp_path, target, signum):
    # Started in the background (SIGINT ignored, as a shell script's `&` does), in a session of its own so that no
    # signal reaches it but the one the test sends. Before, a trial stopped alone was recorded as failed for good.
    parameters = {"model.model_overrides.num_heads": {"values": [2, 4]}, "trainer.enable_progress_bar": {"value": True}}
    sweep_file, out = write_sweep(tmp_path, parameters), tmp_path / "sweep"
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT)}
    command = subprocess.Popen(
        [sys.executable, "-m", "vit", "sweep", str(sweep_file), "--budget", "2m", "--out", str(out)],
        cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    deadline = time.monotonic() + 240
    victim = running_trial(out, deadline)
    log = Path(victim.user_attrs["log"])
    while "Epoch 0" not in (log.read_text(errors="replace") if log.is_file() else ""):  # training, its handler set
        assert time.monotonic() < deadline and command.poll() is None, "the trial did not start training"
        time.sleep(0.5)
    worker = int(victim.user_attrs[WORKER_ATTR].rsplit(":", 1)[1])
    os.kill(trial_process(worker) if target == "trial" else command.pid, signum)
    output, _ = command.communicate(timeout=300)
    assert command.returncode == 130, output[-3000:]

    trials = optuna.load_study(study_name="tiny", storage=open_storage(None, out, 1)).trials
    stopped = trials[victim.number]
    assert stopped.state == TrialState.FAIL
    name = "SIGINT to the trial" if target == "trial" else "Ctrl-C or SIGTERM"
    assert stopped.user_attrs[REASON_ATTR] == f"interrupted ({name}); enqueued again"
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == victim.number]
    assert retry.state == TrialState.WAITING and retry.params == victim.params
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert "with the same options resumes it" in output and f"retry of trial {victim.number}" in output
