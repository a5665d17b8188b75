"""One option style in every argparse subcommand: LightningCLI's dotted, underscored names; the older spellings
still parse for a release with one ``note:`` line; a typo suggests the new spelling; one help layout. And what
``vit fit`` reads before LightningCLI does: W&B's agent's ``--key=None``, a config named from the repository's root."""

import re
from importlib import import_module
from pathlib import Path

import pytest
import yaml

from vit.cli import cli_main, resolve_config_args
from vit.main import main

ROOT = Path(__file__).resolve().parents[1]

COMMANDS = {
    "calibrate": "vit.evaluation.calibrate",
    "explain": "vit.explain.command",
    "compare": "vit.compare.command",
    "sweep": "vit.sweep.command",
    "bench": "vit.bench.cli",
    "export": "vit.export",
    "data prepare": "vit.data.prepare",
    "serve": "vit.serve.command",
}


def parser_of(name):
    return import_module(COMMANDS[name]).build_parser(f"vit {name}")


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_is_spelled_as_lightningcli_spells_them(name):
    names = parser_of(name).option_names()
    assert names, name
    assert [n for n in names if not re.fullmatch(r"--[a-z0-9_]+(\.[a-z0-9_]+)*", n)] == []


@pytest.mark.parametrize("name", COMMANDS)
def test_one_help_layout(name, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exit_:
        main([*name.split(), "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    usage, description = text.split("\n\n")[:2]
    assert usage.startswith(f"usage: vit {name}")
    assert description[0].isupper() and not description.startswith("vit"), description  # one sentence, no usage
    assert "``" not in text and ":mod:" not in text and ":func:" not in text  # reST markup is the docstring's
    assert max(map(len, text.splitlines())) <= 100 or "    " in text  # filled, except the examples' own lines
    assert "\noptions:\n" in text


def test_calibrate_takes_the_data_dir_as_fit_and_test_do(capsys):
    parser = parser_of("calibrate")
    assert parser.parse_args(["--data.data_dir", "cifar10", "--progress", "false"]).data_dir == "cifar10"
    assert parser.parse_args(["--progress", "false"]).progress is False
    assert parser.parse_args(["--progress"]).progress is True
    assert parser.parse_args([]).progress is True
    assert capsys.readouterr().err == ""  # no note for the new spelling


@pytest.mark.parametrize(
    ("name", "old", "new", "said"),
    [
        ("calibrate", ["--data_dir", "d", "--no-progress"], ["--data.data_dir", "d", "--progress", "false"],
         "use --data.data_dir for --data_dir, --progress false for --no-progress"),
        ("explain", ["--img-size", "32", "--no-overlays", "--tune-images=7"], ["--img_size", "32", "--overlays",
         "false", "--tune_images=7"], "use --img_size for --img-size, --overlays false for --no-overlays, "
         "--tune_images for --tune-images"),
        ("bench", ["--batch-sizes", "8", "16", "--no-keep-freed-memory", "--data-dir", "x"], ["--batch_sizes", "8",
         "16", "--keep_freed_memory", "false", "--data.data_dir", "x"], "use --batch_sizes for --batch-sizes, "
         "--keep_freed_memory false for --no-keep-freed-memory, --data.data_dir for --data-dir"),
    ],
)  # fmt: skip
def test_old_spellings_work_for_a_release_with_one_note(name, old, new, said, capsys):
    parser = parser_of(name)
    assert parser.parse_args(old) == parser.parse_args(new)
    err = capsys.readouterr().err
    assert err == f"note: vit {name}: {said} (the old spelling goes in the next release)\n"


def test_the_note_stops_at_the_arguments_for_another_command(capsys):
    args, rest = parser_of("sweep").parse_known_args(["f.yaml", "--max-retry", "1", "--", "--data-dir", "x"])
    assert args.max_retry == 1 and rest == ["--", "--data-dir", "x"]
    assert (
        capsys.readouterr().err
        == "note: vit sweep: use --max_retry for --max-retry (the old spelling goes in the next release)\n"
    )


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["explain", "--img-sise", "32"], "--img_size"),
        (["explain", "--tune_image", "3"], "--tune_images"),
        (["calibrate", "--data.data_dri", "x"], "--data.data_dir"),
        (["bench", "--batch-size", "8"], "--batch_sizes"),
    ],
)
def test_a_typo_suggests_the_new_spelling(argv, meant, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: vit {argv[0]}: unknown option {argv[1]} ")
    assert f"(did you mean {meant}?)" in err


def test_a_switch_takes_true_or_false_only(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["explain", "--overlays", "maybe"])
    assert exit_.value.code == 2
    assert "expected true or false, got 'maybe'" in capsys.readouterr().err


def test_a_config_path_from_the_repository_root_is_found_from_any_folder(tmp_path, monkeypatch):
    """The sweep files' commands name `--config configs/cifar10_cpu.yaml`, a path from the repository's root: it is
    found when the sweep runs from another folder too."""
    monkeypatch.chdir(tmp_path)
    resolved = resolve_config_args(["fit", "--config", "configs/cifar10_cpu.yaml"])
    assert Path(resolved[2]).resolve() == (ROOT / "configs" / "cifar10_cpu.yaml").resolve()


def test_a_null_written_by_the_wandb_agent_is_read_as_null(capsys):
    """W&B's agent writes a sweep's null with Python's str (`--model.ema_decay=None`): it reaches the model as None,
    over an earlier value, instead of being refused as a number that is not one."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

    args = create_sweep_command_args({"args": {"model.ema_decay": {"value": None}}})["args"]
    assert args == ["--model.ema_decay=None"]  # what the agent writes
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", "quickstart", "--model.ema_decay=0.99", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    assert yaml.safe_load(capsys.readouterr().out)["model"]["ema_decay"] is None
    assert resolve_config_args(["fit", "--trainer.logger=None", "--name", "None"]) == [
        "fit", "--trainer.logger=null", "--name", "None"  # only the agent's --key=None form
    ]  # fmt: skip
