"""scripts/compare.py from the command line; the W&B sweep's parameters are valid overrides."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

import vit

ROOT = Path(__file__).resolve().parents[1]
CIFAR_MINI = ROOT.parent / "shared" / "data" / "cifar10-mini" / "test"
SWEEPS = sorted((ROOT / "configs" / "sweeps").glob("*.yaml"))


def load_script(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` (in this process: a fresh interpreter would spend its time importing torch)."""
    spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run_script(capsys):
    """``run_script("rollout.py", *args)``: the script's ``main(args)`` with its exit status and printed output."""

    def run(name: str, *args) -> Result:
        capsys.readouterr()
        code = load_script(name.removesuffix(".py")).main([str(a) for a in args])
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return run


# ------------------------------------------------------------------------------------------------- compare.py
def test_compare_script_bad_input(tmp_path, run_script):
    result = run_script("compare.py", tmp_path / "nowhere")
    assert result.returncode == 2 and result.stderr.startswith(f"error: {tmp_path / 'nowhere'} does not exist")
    result = run_script("compare.py", tmp_path)
    assert result.returncode == 2 and "is not a W&B run and holds none" in result.stderr
    (tmp_path / "notes.txt").write_text("hello")
    result = run_script("compare.py", tmp_path / "notes.txt")
    assert result.returncode == 2 and "is not a W&B run: expected a run-*.wandb file" in result.stderr
    run = tmp_path / "wandb" / "offline-run-20260101_000000-abc"
    run.mkdir(parents=True)
    (run / "run-abc.wandb").write_bytes(b"garbage")
    result = run_script("compare.py", tmp_path / "wandb")
    assert result.returncode == 2 and result.stderr.startswith(f"error: cannot read W&B run {run / 'run-abc.wandb'}")
    result = run_script("compare.py")
    assert result.returncode == 2 and "nothing to compare" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_compare_script_online_without_login_is_one_message(tmp_path, monkeypatch, run_script):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: W&B refuses before any connection
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    result = run_script("compare.py", "--project", "someone/vit")
    assert result.returncode == 2
    assert result.stderr.startswith("error: cannot read W&B project someone/vit: UsageError: No API key configured")


# ------------------------------------------------------------------------------------------------------ sweeps
def sweep_combinations(path: Path) -> list[dict]:
    """Every combination of a grid sweep's swept values (``values`` lists; single ``value`` entries included)."""
    sweep = yaml.safe_load(path.read_text())
    names, choices = [], []
    for name, spec in sweep["parameters"].items():
        names.append(name)
        choices.append(spec["values"] if "values" in spec else [spec["value"]])
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*choices)]


def test_there_is_a_window_vs_global_sweep():
    sweep = yaml.safe_load((ROOT / "configs" / "sweeps" / "window_vs_global.yaml").read_text())
    assert sweep["program"] == "scripts/fit.py"
    assert sweep["command"][:3] == ["${env}", "${interpreter}", "${program}"] and sweep["command"][-1] == "${args}"
    assert sweep["metric"] == {"name": "val/acc", "goal": "maximize"}
    window_sizes = {
        combo.get("model.model_overrides.window_size")
        for combo in sweep_combinations(ROOT / "configs" / "sweeps" / "window_vs_global.yaml")
    }
    assert 0 in window_sizes and len(window_sizes - {0}) >= 2  # global against at least two window sizes


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_sweep_parameters_are_valid_overrides(path, capsys):
    """Each combination parses with the CLI (as the agent's ``--key=value`` arguments) and builds the model."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

    from vit.cli import cli_main

    sweep = yaml.safe_load(path.read_text())
    command = sweep["command"]
    base = command[command.index("${program}") + 1 : command.index("${args}")]
    models = set()
    for combo in sweep_combinations(path):
        # The arguments exactly as the W&B agent writes ${args}.
        args = create_sweep_command_args({"args": {name: {"value": value} for name, value in combo.items()}})["args"]
        with pytest.raises(SystemExit) as exit_info:
            cli_main(["fit", *base, *args, "--print_config"])
        assert exit_info.value.code in (0, None), f"{path.name}: {args} is not a valid override"
        config = yaml.safe_load(capsys.readouterr().out)
        for name, value in combo.items():  # the override reached its key
            node = config
            for part in name.split("."):
                node = node[part]
            assert node == value, (name, node, value)
        overrides = {**(config["model"]["model_overrides"] or {}), "img_size": config["data"]["img_size"]}
        models.add((config["model"]["model"], yaml.safe_dump(overrides)))
    for name, overrides in models:  # an override the model does not accept (or a window too large) fails here
        vit.create_model(name, **yaml.safe_load(overrides))
