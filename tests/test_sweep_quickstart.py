"""configs/sweeps/quickstart.yaml, the sweep a newcomer runs first: it searches keys the quickstart config has, around
the config's own values, leaves ``--budget`` its keys, and every trial's arguments are ones ``vit fit`` takes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vit.cli import cli_main
from vit.sweep.budget import BUDGET_KEYS
from vit.sweep.spec import read_sweep
from vit.sweep.trial import fit_arguments

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "configs" / "sweeps" / "quickstart.yaml"


def config_value(config: dict, dotted: str):
    """The value at ``dotted`` (``model.lr``) of a nested config; KeyError when a part is absent."""
    for part in dotted.split("."):
        config = config[part]
    return config


def test_searches_keys_of_the_quickstart_config_around_its_values():
    sweep = read_sweep(SWEEP)
    config_file = sweep.fit_args[sweep.fit_args.index("--config") + 1]
    assert config_file == "configs/quickstart.yaml"
    config = yaml.safe_load((ROOT / config_file).read_text())
    assert {p.name for p in sweep.searched} == {"model.lr", "model.weight_decay"}
    for parameter in sweep.parameters:
        assert parameter.name not in BUDGET_KEYS  # --budget sets those: a sweep parameter there is refused
        assert parameter.low < config_value(config, parameter.name) < parameter.high, parameter.name
    assert sweep.metric == "val/acc" and sweep.maximize and sweep.run_cap == 4


@pytest.mark.parametrize("end", [0, 1], ids=["lowest", "highest"])
def test_every_trial_is_a_run_vit_fit_accepts(end, tmp_path, capsys):
    sweep = read_sweep(SWEEP)
    values = {p.name: (p.low, p.high)[end] for p in sweep.parameters}
    base = [str(ROOT / a) if a.endswith(".yaml") else a for a in sweep.fit_args]
    args = fit_arguments(base, values, tmp_path / "runs", budget_s=30.0, group=sweep.name)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", *args, "--print_config"])
    assert exit_info.value.code == 0, capsys.readouterr().err
    config = yaml.safe_load(capsys.readouterr().out)
    for name, value in values.items():
        assert config_value(config, name) == pytest.approx(value)
    assert config["model"]["schedule"] == "time" and config["trainer"]["max_time"] == "00:00:00:30"
    assert config["data"]["dataset"] == "digits" and config["trainer"]["accelerator"] == "cpu"
