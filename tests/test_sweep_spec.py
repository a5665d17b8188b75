"""The W&B sweep file reader of ``vit sweep``, its budgets and its Optuna mapping, against W&B's documented rules and
W&B's own sweep-config schema (the ``sweeps`` package)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import yaml

from vit.errors import UsageError
from vit.sweep.budget import max_time, parse_duration, rung_budgets, survivors
from vit.sweep.spec import SweepFileError, parse_sweep, read_sweep

SHIPPED = sorted(Path(__file__).resolve().parents[1].glob("configs/sweeps/*.yaml"))
BASE = {"program": "scripts/fit.py", "method": "random", "metric": {"name": "val/acc", "goal": "maximize"}}


def sweep_of(parameters: dict, **top) -> dict:
    return {**BASE, "parameters": parameters, **top}


def wandb_violations(raw: dict) -> list[str]:
    """W&B's sweep-config schema violations (the ``sweeps`` engine, 0.2.0 of 2022, which predates ``run_cap``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sweeps.config import schema_violations_from_proposed_config

    return schema_violations_from_proposed_config({k: v for k, v in raw.items() if k != "run_cap"})


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_sweep_files_run_under_vit_sweep_and_stay_valid_for_wandb(path):
    raw = yaml.safe_load(path.read_text())
    assert wandb_violations(raw) == []
    sweep = read_sweep(path)
    assert sweep.name == (raw.get("name") or path.stem)
    assert sweep.metric == raw["metric"]["name"]
    assert "--config" in sweep.fit_args and Path(sweep.fit_args[sweep.fit_args.index("--config") + 1]).is_file()
    assert {p.name for p in sweep.parameters} == set(raw["parameters"])


def test_implied_distributions_follow_wandb_rules():
    sweep = parse_sweep(
        sweep_of({"a": {"values": [1, 2]}, "b": {"value": 3}, "c": {"min": 1, "max": 4}, "d": {"min": 0.1, "max": 1}})
    )
    kinds = {p.name: p.distribution for p in sweep.parameters}
    assert kinds == {"a": "categorical", "b": "constant", "c": "int_uniform", "d": "uniform"}


def test_nested_parameters_join_with_dots_and_log_uniform_takes_exponents():
    raw = sweep_of({"model": {"parameters": {"lr": {"distribution": "log_uniform", "min": -9.0, "max": -4.0}}}})
    assert wandb_violations(raw) == []
    (lr,) = parse_sweep(raw).parameters
    assert lr.name == "model.lr"
    assert lr.low == pytest.approx(math.exp(-9.0)) and lr.high == pytest.approx(math.exp(-4.0))


def test_grid_enumerates_values_int_and_q_ranges():
    sweep = parse_sweep(
        {**BASE, "method": "grid", "parameters": {
            "a": {"values": ["x", "y"]}, "b": {"distribution": "int_uniform", "min": 2, "max": 4},
            "c": {"distribution": "q_uniform", "min": 0.1, "max": 0.4, "q": 0.1}, "d": {"value": 7}}}
    )  # fmt: skip
    grids = {p.name: p.grid() for p in sweep.parameters}
    assert grids == {"a": ["x", "y"], "b": [2, 3, 4], "c": [0.1, 0.2, 0.3, 0.4], "d": [7]}


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"parameters": {"lr": {"distribution": "normal", "mu": 0, "sigma": 1}}}, "parameters.lr.mu"),
        ({"parameters": {"lr": {"distribution": "normal", "min": 0, "max": 1}}}, "parameters.lr.distribution"),
        ({"parameters": {"lr": {"values": [1, 2], "probabilities": [0.5, 0.5]}}}, "parameters.lr.probabilities"),
        ({"metric": {"name": "val/acc", "target": 0.9}}, "metric.target"),
        ({"early_terminate": {"type": "hyperband", "min_iter": 3, "strict": True}}, "early_terminate.strict"),
        ({"early_terminate": {"type": "envelope"}}, "early_terminate.type"),
        ({"command": ["${env}", "${program}", "${args_json}"]}, "command"),
        ({"method": "bayes_opt"}, "method"),
        ({"program": "train.py"}, "program"),
        ({"controller": {"type": "local"}}, "controller"),
        ({"method": "grid", "parameters": {"lr": {"min": 0.1, "max": 1.0}}}, "parameters.lr"),
        ({"parameters": {"lr": {"distribution": "log_uniform_values", "min": 0, "max": 1}}}, "parameters.lr.min"),
        ({"run_cap": 0}, "run_cap"),
    ],
)
def test_what_vit_sweep_cannot_run_is_one_error_naming_the_key(change, key):
    raw = {**sweep_of({"lr": {"values": [1, 2]}}), **change}
    with pytest.raises(SweepFileError) as caught:
        parse_sweep(raw, "s.yaml")
    message = str(caught.value)
    assert message.startswith(f"s.yaml: {key}:") and "\n" not in message


def test_unreadable_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="cannot read the sweep file"):
        read_sweep(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("a: [")
    with pytest.raises(UsageError, match="is not YAML"):
        read_sweep(tmp_path / "bad.yaml")


@pytest.mark.parametrize(("text", "seconds"), [("20s", 20), ("5m", 300), ("1.5h", 5400), ("1h30m", 5400)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5", "5x", "m5", "0s", ""])
def test_bad_durations_are_usage_errors(text):
    with pytest.raises(UsageError, match="--budget"):
        parse_duration(text)


def test_rungs_from_a_list_or_from_hyperband():
    assert rung_budgets("5m,15m,45m", eta=3) == [300, 900, 2700]
    assert rung_budgets("20s", eta=3, rungs=3) == [20, 60, 180]  # W&B's brackets min_iter * eta**k, in time
    assert rung_budgets(None, eta=3) == []
    with pytest.raises(UsageError, match="longer than the one before"):
        rung_budgets("5m,5m", eta=3)
    hyperband = parse_sweep(sweep_of({"a": {"value": 1}}, early_terminate={"type": "hyperband", "min_iter": 1,
                                                                           "max_iter": 27, "eta": 3}))  # fmt: skip
    assert (hyperband.eta, hyperband.rungs) == (3, 4)  # brackets at 1, 3, 9, 27 iterations
    assert parse_sweep(sweep_of({"a": {"value": 1}}, early_terminate={"type": "hyperband", "s": 2})).rungs == 2


def test_survivors_and_max_time():
    assert [survivors(n, 3) for n in (1, 2, 3, 8, 9, 27)] == [1, 1, 1, 2, 3, 9]
    assert max_time(20) == "00:00:00:20" and max_time(56 * 60) == "00:00:56:00" and max_time(90000) == "01:01:00:00"


@pytest.mark.parametrize(
    ("top", "options", "message"),
    [
        ({}, ["--workers", "0"], "--workers 0: must be at least 1"),
        ({"run_cap": None}, [], "run_cap: method random needs run_cap in the file, or --trials N"),
        ({"early_terminate": {"type": "hyperband", "s": 2}}, [], "early_terminate: hyperband needs --budget"),
        ({"parameters": {"trainer.max_time": {"value": "00:00:10:00"}}}, ["--budget", "5m"], "--budget sets it"),
        ({}, ["--budget", "5m,1m"], "--budget 5m,1m: each rung's budget must be longer than the one before"),
    ],
)
def test_vit_sweep_refuses_bad_input_in_one_line(tmp_path, capsys, top, options, message):
    from vit.main import main

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**sweep_of({"model.lr": {"values": [1, 2]}}), "run_cap": 2, **top}))
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", str(path), *options])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert message in err
