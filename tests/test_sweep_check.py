"""``vit sweep`` checks its whole file before the first trial: every parameter against the options of the config it
trains (with ``vit fit``'s did-you-mean), every value against the option's type, in one ``error:`` line with nothing
created; a changed file for an existing study is refused naming the keys that differ and both remedies."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from vit.sweep.halving import Plan, open_sweep
from vit.sweep.space import sampler
from vit.sweep.spec import read_sweep
from vit.sweep.storage import open_storage

optuna.logging.set_verbosity(optuna.logging.ERROR)


def sweep_file(path, parameters: dict, **top) -> str:
    raw = {
        "program": "scripts/fit.py",
        "method": "random",
        "run_cap": 2,
        "metric": {"name": "val/acc", "goal": "maximize"},
        "parameters": parameters,
        "command": ["${env}", "${interpreter}", "${program}", "--config", "quickstart", "${args}"],
        **top,
    }
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def run_vit_sweep(capsys, *args: str) -> tuple[int, str]:
    from vit.main import main

    with pytest.raises(SystemExit) as stop:
        main(["sweep", *args])
    return stop.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"model.lrr": {"values": [0.001, 0.002]}}, "parameters.model.lrr: not an option of vit fit (value '0.001') "
         "(did you mean model.lr?); `vit fit --config quickstart --help` lists the options"),
        ({"modle.lr": {"min": 0.001, "max": 0.002}}, "parameters.modle.lr: not an option of vit fit (value '0.001') "
         "(did you mean model.lr?)"),
        ({"model.lr": {"values": [0.001, "fast"]}, "trainer.max_epochs": {"values": [1, 2, 3]}},
         "parameters.model.lr: bad value: expected float, got 'fast'"),
        ({"trainer.max_epochs": {"min": 1.5, "max": 3.0}}, "parameters.trainer.max_epochs: bad value: expected one "
         "of int, null, got '1.5'"),
    ],
)  # fmt: skip
def test_a_bad_parameter_is_one_line_before_anything_is_created(tmp_path, capsys, parameters, message):
    path = sweep_file(tmp_path / "s.yaml", parameters)
    status, err = run_vit_sweep(capsys, path, "--out", str(tmp_path / "out"))
    assert status == 2 and err.count("\n") == 1 and err.startswith(f"error: {path}: ")
    assert message in err
    assert not (tmp_path / "out").exists()


def test_the_shipped_sweep_files_pass_the_check():
    from pathlib import Path

    from vit.sweep.check import check_against_config

    for path in sorted(Path("configs/sweeps").glob("*.yaml")):
        sweep = read_sweep(path)
        check_against_config(sweep, list(sweep.fit_args))  # raises for a key or value vit fit refuses


def test_a_changed_sweep_file_names_the_keys_that_differ_and_both_remedies(tmp_path, capsys):
    out = tmp_path / "out"
    first = read_sweep(sweep_file(tmp_path / "s.yaml", {"model.lr": {"values": [0.001, 0.002]}}))
    plan = Plan(first, [], 2, 3, list(first.fit_args), 0, first.raw)  # what `vit sweep s.yaml` starts
    open_sweep(open_storage(None, out, 1), plan, sampler(first, 0))
    path = sweep_file(tmp_path / "s.yaml", {"model.lr": {"values": [0.001, 0.003]}, "model.min_lr": {"value": 0}})
    status, err = run_vit_sweep(capsys, path, "--out", str(out))
    assert status == 2 and err.startswith("error: ") and err.count("\n") <= 3
    assert "parameters.model.lr.values [0.001, 0.002] there, [0.001, 0.003] now" in err
    assert 'parameters.model.min_lr absent there, {"value": 0} now' in err
    assert f"vit sweep {path} --name NEW" in err and f"remove {out} " in err
    assert len(err) < 600


def test_a_changed_option_is_named_by_its_flag(tmp_path):
    from vit.errors import UsageError

    sweep = read_sweep(sweep_file(tmp_path / "s.yaml", {"model.lr": {"values": [0.001, 0.002]}}))
    storage = open_storage(None, tmp_path / "out", 1)
    open_sweep(storage, Plan(sweep, [20.0, 60.0], 2, 3, [], 0, sweep.raw), sampler(sweep, 0))
    with pytest.raises(UsageError, match=r"--budget \[20.0, 60.0\] there, \[20.0, 90.0\] now"):
        open_sweep(storage, Plan(sweep, [20.0, 90.0], 2, 3, [], 0, sweep.raw), sampler(sweep, 0))


def test_name_gives_the_study_another_name_that_the_workers_read_back(tmp_path, monkeypatch):
    from vit.sweep import command

    made = {}
    monkeypatch.setattr("vit.sweep.check.check_against_config", lambda *args: None)
    monkeypatch.setattr("vit.sweep.driver.Sweeper.run", lambda self, workers: made.setdefault("plan", self.plan) and 0)
    path = sweep_file(tmp_path / "s.yaml", {"model.lr": {"values": [0.001, 0.002]}})
    assert command.main([path, "--name", "again", "--out", str(tmp_path / "out")]) == 0
    plan = made["plan"]
    assert plan.sweep.name == "again" and plan.study_name(0) == "again"
    assert Plan.from_fingerprint(plan.fingerprint(), []).sweep.name == "again"  # as a worker reads plan.json


@pytest.mark.parametrize(
    ("parameters", "metric", "message"),
    [
        ({"data.batch_size": {"distribution": "uniform", "min": 8, "max": 64}}, "val/acc",
         "parameters.data.batch_size: distribution uniform draws fractions such as 38.93 (expected int, got '38.93'); "
         "for whole numbers use int_uniform, q_uniform with a whole q, or values"),
        ({"data.batch_size": {"distribution": "log_uniform_values", "min": 8, "max": 64}}, "val/acc",
         "parameters.data.batch_size: distribution log_uniform_values draws fractions such as"),
        ({"model.lr": {"values": [0.001, 0.002]}}, "val/accc",
         "metric.name: 'val/accc' is not logged by vit fit (did you mean val/acc?); the metrics are train/loss_step"),
        ({"model.model": {"values": ["vit_tiny_patch16_224", "vit_tiny_patch4_31"]}}, "val/acc",
         "parameters.model.model: unknown model 'vit_tiny_patch4_31' (did you mean vit_tiny_patch4_32?); "
         "the models are vit_base_patch16_224, "),
    ],
)  # fmt: skip
def test_what_the_parser_cannot_see_is_one_line_before_anything_is_created(tmp_path, capsys, parameters, metric,
                                                                          message):  # fmt: skip
    path = sweep_file(tmp_path / "s.yaml", parameters, metric={"name": metric, "goal": "maximize"})
    status, err = run_vit_sweep(capsys, path, "--out", str(tmp_path / "out"))
    assert status == 2 and err.count("\n") == 1 and err.startswith(f"error: {path}: ")
    assert message in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "parameter",
    [
        {"distribution": "int_uniform", "min": 8, "max": 64},
        {"distribution": "q_uniform", "min": 8, "max": 64, "q": 8},
        {"distribution": "q_log_uniform_values", "min": 8, "max": 64, "q": 4},
        {"values": [8, 16]},
    ],
)
def test_whole_number_distributions_pass_on_an_integer_option(tmp_path, parameter):
    from vit.sweep.check import check_against_config

    sweep = read_sweep(sweep_file(tmp_path / "s.yaml", {"data.batch_size": parameter}))
    check_against_config(sweep, list(sweep.fit_args))


def test_a_timm_model_among_the_values_passes_the_check(tmp_path):
    """``timm:NAME`` is not one of our presets, and ``vit fit`` builds it all the same."""
    from vit.sweep.check import check_against_config

    models = {"model.model": {"values": ["vit_tiny_patch4_32", "timm:resnet18"]}}
    sweep = read_sweep(sweep_file(tmp_path / "s.yaml", models))
    check_against_config(sweep, list(sweep.fit_args))


def test_a_fit_logs_the_metrics_the_check_knows():
    """The names of :data:`FIT_METRICS` that the module and its metric collections make, against the collections."""
    from vit.evaluation.metrics import accuracy_metrics
    from vit.sweep.check import FIT_METRICS

    for stage in ("train", "val"):
        for name in accuracy_metrics(10, stage).keys(keep_base=False):
            assert name in FIT_METRICS
    source = Path("vit/lit_module.py").read_text(encoding="utf-8")
    for name in ("train/lr", "train/loss_step", "train/loss_epoch", "{stage}/loss"):
        assert f'"{name}"' in source
