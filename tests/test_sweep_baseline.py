"""``vit sweep --baseline``: the configuration the sweep's command trains by itself runs as the first trial of rung 0,
with the values its config file gives (read here from the YAML and from the model it builds), rises through the
rungs only by its rank, and is marked in the table; a baseline the sweep could not draw is one line, nothing created."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from vit.errors import UsageError
from vit.sweep.check import baseline_params
from vit.sweep.halving import BASELINE_ATTR, CONFIG_ATTR, Plan, open_sweep, promotions
from vit.sweep.report import Row, summary, table
from vit.sweep.space import sampler, suggest
from vit.sweep.spec import parse_sweep, read_sweep

optuna.logging.set_verbosity(optuna.logging.ERROR)
ROOT = Path(__file__).resolve().parents[1]
BASE = {"program": "scripts/fit.py", "metric": {"name": "val/acc", "goal": "maximize"}, "run_cap": 4,
        "command": ["${env}", "${interpreter}", "${program}", "--config", "quickstart", "${args}"]}  # fmt: skip


def plan_of(parameters: dict, method: str = "random", count: int = 9, budgets=(20, 60), baseline=None) -> Plan:
    raw = {**BASE, "method": method, "parameters": parameters}
    sweep = parse_sweep(raw, "s.yaml")
    return Plan(sweep, list(budgets), count, 3, list(sweep.fit_args), 0, raw, baseline)


def test_the_recipe_search_reads_the_recipes_own_values():
    """Each searched key of the shipped search file at the value of configs/cifar10_cpu.yaml; the small-data switches
    the recipe leaves out off, as they are by default."""
    sweep = read_sweep(ROOT / "configs/sweeps/cifar10_cpu_search.yaml")
    params = baseline_params(sweep, [*sweep.fit_args, "--data.data_dir=data"], 180.0)
    recipe = yaml.safe_load((ROOT / "configs/cifar10_cpu.yaml").read_text())
    off = {"model.model_overrides.locality_attention": False, "model.model_overrides.shifted_patches": False,
           "model.ema_decay": None}  # fmt: skip
    for name, value in params.items():
        node = recipe
        for key in name.split("."):
            node = node.get(key, {}) if isinstance(node, dict) else {}
        assert value == (off[name] if node == {} else node), name
    assert {p.name for p in sweep.searched} == set(params) and set(off) < set(params)
    assert repr(params["model.warmup_epochs"]) == "2"  # as the recipe and the sweep write it, not the parser's 2.0


def run_rung(study, plan, values):
    """Ask, suggest and tell a trial for each value, as a worker does; the values by trial."""
    told = {}
    for value in values:
        trial = study.ask()
        if CONFIG_ATTR not in trial.user_attrs:
            trial.set_user_attr(CONFIG_ATTR, trial.number)
        told[trial.number] = suggest(trial, plan.sweep)
        study.tell(trial, value)
    return told


@pytest.mark.parametrize(("values", "rises"), [([0.7, 0.1, 0.2, 0.9, 0.3, 0.4, 0.5, 0.6, 0.8], True),
                                               ([0.1, 0.2, 0.9, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], False)])  # fmt: skip
def test_the_baseline_is_trial_zero_of_rung_zero_and_rises_by_its_rank(values, rises):
    baseline = {"a": 0.25, "b": "x"}
    plan = plan_of({"a": {"min": 0.0, "max": 1.0}, "b": {"values": ["x", "y"]}}, baseline=baseline)
    study, _ = open_sweep(optuna.storages.InMemoryStorage(), plan, sampler(plan.sweep, 0))
    told = run_rung(study, plan, values)
    assert told[0] == baseline and len(told) == plan.count  # one of the nine configurations, not a tenth
    assert sum(t == baseline for t in told.values()) == 1
    kept = promotions(study, plan)
    assert any(e["params"] == baseline for e in kept) is rises  # 0.7 is the third best of nine: it stays
    assert any(e["user_attrs"].get(BASELINE_ATTR) for e in kept) is rises
    found = [Row(0, t) for t in study.trials]
    marked = [line.split()[:4] for line in table(found, plan).splitlines() if "baseline" in line]
    assert marked == [["0", "20s", "0", "0"]]
    assert summary(found, plan).endswith(f"; the baseline {values[0]:.4f} (rung 0, trial 0)")


def test_a_grid_runs_the_baseline_first_and_not_twice():
    plan = plan_of({"a": {"values": [1, 2, 3]}, "b": {"values": ["x", "y"]}}, "grid", count=6, budgets=(),
                   baseline={"a": 2, "b": "y"})  # fmt: skip
    study, _ = open_sweep(optuna.storages.InMemoryStorage(), plan, sampler(plan.sweep, 0))
    fixed = [t.system_attrs["fixed_params"] for t in study.get_trials(states=(TrialState.WAITING,))]
    assert fixed[0] == {"a": 2, "b": "y"} and len(fixed) == 6
    assert sorted((p["a"], p["b"]) for p in fixed) == [(a, b) for a in (1, 2, 3) for b in "xy"]


def test_starting_again_without_the_baseline_is_refused_by_its_flag():
    storage = optuna.storages.InMemoryStorage()
    plan = plan_of({"a": {"min": 0.0, "max": 1.0}}, baseline={"a": 0.5})
    open_sweep(storage, plan, sampler(plan.sweep, 0))
    assert open_sweep(storage, plan_of({"a": {"min": 0.0, "max": 1.0}}, baseline={"a": 0.5}), None)[1] is True
    with pytest.raises(UsageError, match=r"--baseline \{\"a\": 0.5\} there, absent now"):
        open_sweep(storage, plan_of({"a": {"min": 0.0, "max": 1.0}}), None)


@pytest.mark.parametrize(
    ("parameter", "message"),
    [
        ({"model.lr": {"min": 0.003, "max": 0.01}}, "parameters.model.lr: the command's own value 0.002 is outside its "
         "range 0.003..0.01"),
        ({"model.warmup_epochs": {"values": [2, 3]}}, "parameters.model.warmup_epochs: the command's own value 1.0 is "
         "not one of its values [2, 3]"),
        ({"model.model_overrides.depth": {"distribution": "q_uniform", "min": 2, "max": 8, "q": 3}},
         "parameters.model.model_overrides.depth: the command's own value 4 is off its step 3 from 2"),
    ],
)  # fmt: skip
def test_a_baseline_the_sweep_could_not_draw_is_one_line_and_nothing_is_created(tmp_path, capsys, parameter, message):
    from vit.main import main

    quickstart = yaml.safe_load((ROOT / "configs/quickstart.yaml").read_text())["model"]
    assert (quickstart["lr"], quickstart["warmup_epochs"], quickstart["model_overrides"]["depth"]) == (2e-3, 1, 4)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, "method": "random", "parameters": parameter}))
    with pytest.raises(SystemExit) as stop:
        main(["sweep", str(path), "--baseline", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and message in err
    assert "--baseline" in err and not (tmp_path / "out").exists()
