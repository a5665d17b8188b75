"""The time-budgeted schedule (``model.schedule: time``): the plan's arithmetic, a run on a fake clock that ends with
its budget, resume, the unmasked tail, one plan for every DDP rank, and the error without ``max_time``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, Timer
from lightning.pytorch.trainer.states import RunningStage
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, TensorDataset

from vit.callbacks import TimeBudget
from vit.cli import cli_main
from vit.schedule import TimePlan, plan_total_steps, warmup_cosine

ROOT = Path(__file__).resolve().parents[1]


class SteppedClock(TimeBudget):
    """A :class:`TimeBudget` on a fake clock: every training step costs ``step_seconds`` (``tail_seconds`` once
    PatchDropout is off) and every validation ``validation_seconds``, times ``1 + skew * rank``. :class:`FakeTimer`
    reads the same clock."""

    latest: SteppedClock | None = None

    def __init__(
        self,
        step_seconds: float = 1.0,
        validation_seconds: float = 5.0,
        tail_seconds: float | None = None,
        skew: float = 0.0,
        replan_every_n_steps: int = 10,
    ) -> None:
        self.now = 0.0
        super().__init__(replan_every_n_steps=replan_every_n_steps, clock=lambda: self.now)
        self.costs = (step_seconds, validation_seconds, tail_seconds or step_seconds)
        self.skew = skew
        SteppedClock.latest = self

    def _scale(self, trainer) -> float:
        return 1.0 + self.skew * trainer.global_rank

    def on_train_batch_end(self, trainer, pl_module, *args, **kwargs) -> None:
        patch_drop = getattr(pl_module.model, "patch_drop", None)
        unmasked = patch_drop is not None and getattr(patch_drop, "prob", 0.0) == 0.0 and pl_module._patch_drop_rate
        self.now += (self.costs[2] if unmasked else self.costs[0]) * self._scale(trainer)
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.now += self.costs[1] * self._scale(trainer)
        super().on_validation_end(trainer, pl_module)


class FakeTimer(Timer):
    """Lightning's ``max_time`` on the fake clock of the last :class:`SteppedClock` made (a loaded machine running
    the tests must not reach the real limit first)."""

    def __init__(self, seconds: float = 180.0) -> None:
        super().__init__(duration=timedelta(seconds=seconds), interval="step")

    def time_elapsed(self, stage: str = RunningStage.TRAINING) -> float:
        clock = SteppedClock.latest
        return clock.elapsed() if stage == RunningStage.TRAINING and clock is not None else 0.0


class Record(Callback):
    """Per step: the learning rate, PatchDropout's rate and whether validation ran after it; written as JSON per rank
    when ``path`` is given."""

    def __init__(self, path: str | None = None) -> None:
        self.path, self.lrs, self.drop, self.validated = path, [], [], []

    def on_train_batch_start(self, trainer, pl_module, *args, **kwargs) -> None:
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])
        self.drop.append(float(getattr(getattr(pl_module.model, "patch_drop", None), "prob", 0.0)))

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.validated.append(trainer.global_step)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.path:
            Path(self.path, f"lr_rank{trainer.global_rank}.json").write_text(json.dumps(self.lrs))


def loader(n: int = 64, batch_size: int = 4) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g))
    return DataLoader(data, batch_size=batch_size)


@pytest.fixture
def module(tiny_classifier):
    """``module(**kwargs)``: the tiny classifier on 16 px images, on the time schedule (lr 1e-3 to 1e-5 after five
    warm-up steps)."""
    return partial(tiny_classifier, img_size=16, lr=1e-3, min_lr=1e-5, warmup_steps=5, schedule="time")


@pytest.fixture
def fit(module, cpu_trainer):
    """``fit(root, budget, model=None, ckpt_path=None, callbacks=(), **trainer_kwargs) -> (trainer, model, record)``:
    a fit under ``budget`` against a fake clock, validating every second epoch; checkpoints only with callbacks."""

    def run(root, budget: TimeBudget, model=None, ckpt_path=None, callbacks=(), **trainer_kwargs):
        model = model or module()
        record = Record()
        trainer = cpu_trainer(
            default_root_dir=root,
            max_epochs=-1,
            check_val_every_n_epoch=2,
            callbacks=[budget, FakeTimer(180.0), record, *callbacks],
            enable_checkpointing=bool(callbacks),
            **trainer_kwargs,
        )
        trainer.fit(model, loader(), loader(16), ckpt_path=ckpt_path)
        return trainer, model, record

    return run


# --------------------------------------------------------------------------------------------------- the plan
def test_plan_solves_the_budget_for_steps_and_validations():
    # 100 s left, 0.1 s a step, 2 s a validation every 50 steps, one more at the end: (100 - 2) / (0.1 + 2 / 50)
    assert plan_total_steps(100, 100.0, 0.1, 2.0, 50) == 100 + 700
    assert plan_total_steps(0, 10.0, 1.0, 0.0, math.inf) == 10  # no validation
    assert plan_total_steps(7, 0.5, 1.0, 0.0, math.inf) == 8  # never before the step under way
    assert plan_total_steps(7, -30.0, 1.0, 5.0, 10) == 8


def test_plan_pays_for_the_tail_that_fits():
    # 100 s, 0.1 s a step, the last 200 steps at twice that: s * 0.1 + 200 * 0.1 = 100 -> s = 800
    assert plan_total_steps(0, 100.0, 0.1, 0.0, math.inf, tail_steps_left=200, tail_cost=2.0) == 800
    # Only 10 s: every step left is a tail step (0.2 s each)
    assert plan_total_steps(0, 10.0, 0.1, 0.0, math.inf, tail_steps_left=200, tail_cost=2.0) == 50
    # the arithmetic by brute force: the largest s whose cost fits
    for seconds in (3.0, 17.0, 40.0, 99.0):
        cost = [s * 0.1 + min(s, 120) * 0.1 * 1.5 + (s / 30 + 1) * 0.7 for s in range(2000)]
        expected = max(s for s in range(1, 2000) if cost[s] <= seconds + 1e-9)
        assert plan_total_steps(0, seconds, 0.1, 0.7, 30, tail_steps_left=120, tail_cost=2.5) == pytest.approx(
            expected, abs=1
        )


def test_time_plan_is_warmup_cosine_and_comes_back_with_the_scheduler():
    plan = TimePlan(warmup_steps=10, total_steps=110, min_ratio=0.01)
    assert [plan(s) for s in (0, 9, 60, 110, 500)] == [warmup_cosine(s, 10, 110, 0.01) for s in (0, 9, 60, 110, 500)]
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = LambdaLR(optimizer, plan)
    plan.total_steps, plan.tail_start, plan.planned = 4321, 4000, True
    restored = TimePlan(warmup_steps=10, total_steps=110, min_ratio=0.01)
    LambdaLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), restored).load_state_dict(
        scheduler.state_dict()
    )
    assert restored == plan
    measured = TimePlan(0, 100, 0.0, tail_steps=20, planned=True)
    assert measured.in_tail(80) and not measured.in_tail(79)
    assert not TimePlan(0, 100, 0.0, tail_steps=20).in_tail(99)  # the first guess, before a step was timed
    assert TimePlan(0, 100, 0.0, tail_steps=20, tail_start=30).in_tail(31)  # once begun, it stays


# ------------------------------------------------------------------------------------------------------- runs
def test_run_on_a_fake_clock_ends_with_its_budget_at_min_lr_validated(tmp_path, fit):
    # 180 s, 1 s a step, 5 s a validation every 32 steps (16 steps an epoch, every 2nd epoch) and at the end, 1 % kept:
    # the largest s with s + 5 * (s // 32) + 5 <= 178.2 is 153.
    budget = SteppedClock(step_seconds=1.0, validation_seconds=5.0)
    trainer, model, record = fit(tmp_path, budget)
    steps = trainer.global_step
    assert 150 <= steps <= 154, steps
    assert 170.0 <= budget.elapsed() <= 180.0
    assert record.validated[-1] == steps  # the plan's last step is validated although 153 is mid-epoch
    assert model.time_plan.total_steps == steps and model.time_plan.planned
    assert record.lrs[-1] == pytest.approx(1e-3 * warmup_cosine(steps - 1, 5, steps, 0.01))
    assert record.lrs[-1] < 1.2e-5  # the cosine is at min_lr as the budget ends
    assert record.lrs[4] == pytest.approx(1e-3)  # the warm-up stays in steps
    summary = budget.summary(trainer)
    assert summary["steps"] == steps and summary["epochs"] == pytest.approx(steps / 16)
    assert summary["budget_s"] == pytest.approx(180.0)  # read from Lightning's Timer
    assert trainer.callback_metrics["train/budget_used"] == pytest.approx(budget.elapsed() / 180.0, abs=0.05)


def test_a_slower_machine_buys_fewer_steps_with_the_same_end(tmp_path, fit):
    fast = fit(tmp_path / "fast", SteppedClock(step_seconds=0.5, validation_seconds=2.0))[0].global_step
    slow_budget = SteppedClock(step_seconds=2.0, validation_seconds=8.0)
    slow, _, record = fit(tmp_path / "slow", slow_budget)
    assert fast > 3.5 * slow.global_step  # 4x the cost of a step, about a quarter of the steps
    assert 170.0 <= slow_budget.elapsed() <= 180.0 and record.lrs[-1] < 1.5e-5


def test_resume_continues_the_plan(tmp_path, fit):
    whole_budget = SteppedClock()
    whole, _, whole_record = fit(tmp_path / "whole", whole_budget)
    # The same run, saved at the end of epoch 5 (step 96) and stopped there, then resumed by a fresh process's objects
    # (the plan saved was capped by max_steps 96: the resumed run plans again at its start, without that cap).
    save = ModelCheckpoint(tmp_path / "cut", save_top_k=-1, every_n_epochs=6, save_on_train_epoch_end=True)
    first_budget = SteppedClock()
    fit(tmp_path / "cut", first_budget, callbacks=[save], max_steps=96)
    ckpt = next((tmp_path / "cut").glob("*.ckpt"))
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert saved["global_step"] == 96
    resumed_budget = SteppedClock()
    resumed, model, record = fit(tmp_path / "cut", resumed_budget, ckpt_path=ckpt)
    state = next(v for k, v in saved["callbacks"].items() if k.startswith("SteppedClock"))
    assert state["elapsed"] == pytest.approx(96 + 5 * 3)  # three validations by step 96
    assert resumed_budget.elapsed_before == pytest.approx(state["elapsed"])
    assert abs(resumed.global_step - whole.global_step) <= 2
    assert 170.0 <= resumed_budget.elapsed() <= 180.0
    assert record.lrs[0] == pytest.approx(whole_record.lrs[96], rel=0.1)  # planned again at once, not a first guess


def test_unmasked_tail_is_the_plans_last_epoch_and_its_cost_is_planned(tmp_path, module, fit):
    # PatchDropout 0.5, one unmasked epoch (16 steps) at the end, whose steps cost 2 s instead of 1 s.
    model = module(model_overrides={"patch_drop_rate": 0.5}, unmasked_epochs=1)
    budget = SteppedClock(step_seconds=1.0, validation_seconds=5.0, tail_seconds=2.0)
    trainer, model, record = fit(tmp_path, budget, model=model)
    steps = trainer.global_step
    tail = [i for i, rate in enumerate(record.drop) if rate == 0.0]
    assert record.drop[0] == 0.5 and tail == list(range(tail[0], steps))
    assert 15 <= len(tail) <= 17  # one epoch's worth of steps, planned from the start
    assert 165.0 <= budget.elapsed() <= 180.0


def test_schedule_time_without_max_time_is_one_error_line(tmp_path, capsys):
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", "quickstart", "--runs_dir", str(runs), "--model.schedule", "time"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model.schedule time fits the run to trainer.max_time, which is not set")
    assert len(err.strip().splitlines()) == 1
    assert not any(path.is_file() for path in runs.rglob("*"))


@pytest.mark.slow
def test_ddp_ranks_follow_one_plan_although_their_clocks_disagree(tmp_path):
    # Rank 1's clock runs three times as fast as rank 0's: alone it would plan a third of the steps. The plan is rank
    # 0's, broadcast, so both ranks take the same learning rate at every step and stop together.
    callbacks = [
        {"class_path": "test_time_budget.SteppedClock", "init_args": {"skew": 2.0}},
        {"class_path": "test_time_budget.FakeTimer", "init_args": {"seconds": 180.0}},
        {"class_path": "test_time_budget.Record", "init_args": {"path": str(tmp_path)}},
    ]
    cmd = [sys.executable, "-m", "vit", "fit", "--config", "quickstart", "--model.model", "vit_tiny_patch4_32"]
    cmd += ["--model.model_overrides", "{embed_dim: 32, depth: 2, num_heads: 2}", "--data.dataset", "synthetic"]
    cmd += ["--data.synthetic_size", "128", "--data.batch_size", "4", "--data.img_size", "16"]
    cmd += ["--model.schedule", "time", "--trainer.max_epochs", "-1"]
    cmd += ["--trainer.callbacks", json.dumps(callbacks), "--trainer.logger", "false"]
    cmd += ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    cmd += ["--trainer.enable_progress_bar", "false", "--data.num_workers", "0", "--runs_dir", str(tmp_path / "runs")]
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT / "tests"), "WANDB_MODE": "offline"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rank0 = json.loads((tmp_path / "lr_rank0.json").read_text())
    rank1 = json.loads((tmp_path / "lr_rank1.json").read_text())
    assert rank0 == rank1
    assert 100 <= len(rank0) <= 160  # rank 0's plan (1 s a step, 16 steps an epoch per rank), not rank 1's third
