"""The one ``vit`` command (vit.main): every subcommand listed and reachable, one error format, the thin aliases."""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from vit import errors
from vit.errors import ArgumentParser, UsageError, suggest
from vit.main import SUBCOMMANDS, main

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = (
    "fit", "validate", "test", "predict", "calibrate", "explain", "compare", "sweep", "bench", "export", "data",
    "serve",
)  # fmt: skip


def test_help_lists_every_subcommand_with_one_line(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = re.findall(r"^  (\w+) +\S", out, flags=re.MULTILINE)
    assert listed == list(EXPECTED) == list(SUBCOMMANDS)


@pytest.mark.parametrize(
    "argv", [[sub, "--help"] for sub in EXPECTED if sub != "data"] + [["data", "prepare", "--help"]]
)
def test_every_subcommand_has_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out and "--" in out  # a usage line and at least one option


def test_data_without_action_lists_the_actions(capsys):
    assert main(["data", "--help"]) == 0
    assert re.search(r"^  prepare +\S", capsys.readouterr().out, flags=re.MULTILINE)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fti"], "error: unknown subcommand 'fti' (did you mean fit?); `vit --help` lists them"),
        (["data", "prep"], "error: vit data: unknown action 'prep' (did you mean prepare?); actions: prepare"),
        (["bench", "--suit", "model"], "error: vit bench: unknown option --suit (did you mean --suite?)"),
        (["compare", "--metri", "val/acc"], "error: vit compare: unknown option --metri (did you mean --metric?)"),
        (["compare"], "error: nothing to compare: pass offline run folders"),
    ],
)
def test_bad_input_is_one_line_and_status_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_no_prefix_matching():
    """``--suit`` is not taken for ``--suite`` (argparse's default abbreviation matching is off)."""
    parser = ArgumentParser(prog="vit x")
    parser.add_argument("--suite")
    assert parser.parse_args(["--suite", "a"]).suite == "a"
    with pytest.raises(SystemExit):
        parser.parse_args(["--suit", "a"])


def test_suggest_ranks_a_whole_word_match_above_the_closest_spelling():
    known = ["--model.lr", "--model.min_lr", "--model.weight_decay", "--trainer.max_epochs", "--trainer.max_steps"]
    assert difflib.get_close_matches("--model.learning_rate", known, n=1) == ["--model.min_lr"]  # spelling alone
    assert suggest("--model.learning_rate", known) == " (did you mean --model.lr?)"  # its initials
    assert suggest("--model.lr_min", known) == " (did you mean --model.min_lr?)"  # the same words, reordered
    assert suggest("--model.LR", known) == " (did you mean --model.lr?)"
    assert suggest("--trainer.epochs", known) == " (did you mean --trainer.max_epochs?)"  # a word of it
    assert suggest("--trainer.max_epoch", known) == " (did you mean --trainer.max_epochs?)"  # spelling


def test_suggest_only_close_names():
    assert suggest("--max_epoch", ["--max_epochs", "--min_epochs", "--seed"]) == " (did you mean --max_epochs?)"
    assert suggest("--zzz", ["--max_epochs"]) == ""


def test_usage_error_from_a_subcommand_is_one_line(monkeypatch, capsys):
    def raises(argv: list[str]) -> int:
        raise UsageError("DEST x holds something else:\n  pick an empty folder")

    monkeypatch.setitem(SUBCOMMANDS, "export", (SUBCOMMANDS["export"][0], raises))
    with pytest.raises(SystemExit) as exit_info:
        main(["export"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: DEST x holds something else: pick an empty folder\n"


@pytest.mark.parametrize(
    ("kind", "status", "builtin"),
    [
        (errors.UsageError, 2, Exception),
        (errors.ConfigError, 2, ValueError),
        (errors.InputError, 2, Exception),
        (errors.DataError, 2, ValueError),
        (errors.MissingCheckpointError, 2, FileNotFoundError),
        (errors.CheckpointFolderError, 2, IsADirectoryError),
        (errors.CorruptCheckpointError, 2, RuntimeError),
        (errors.UnsafeCheckpointError, 2, RuntimeError),
        (errors.IncompatibleCheckpointError, 2, RuntimeError),
        (errors.NonFiniteError, 3, RuntimeError),
    ],
)
def test_every_user_error_is_one_line_and_its_own_exit_status(kind, status, builtin, monkeypatch, capsys):
    """One hierarchy: each error is a VitError with the status of the table, and still the built-in exception that
    callers caught before (a DataError is a ValueError)."""
    assert issubclass(kind, errors.VitError) and issubclass(kind, builtin)
    assert kind.exit_status == status
    assert next(code for base, code in errors.EXIT_STATUSES.items() if issubclass(kind, base)) == status

    def raises(argv: list[str]) -> int:
        raise kind("the culprit:\n  the fix")

    monkeypatch.setitem(SUBCOMMANDS, "export", (SUBCOMMANDS["export"][0], raises))
    with pytest.raises(SystemExit) as exit_info:
        main(["export"])
    assert exit_info.value.code == status
    assert capsys.readouterr().err == "error: the culprit: the fix\n"


def test_an_error_from_a_loader_worker_is_its_own_message_only():
    """torch re-raises a worker's error in the main process as the same class, with the worker's traceback as its
    message: the line printed is the message at its end."""
    from torch.utils.data._utils import ExceptionWrapper

    try:
        raise errors.DataError("cannot read image a.jpg: truncated. Delete or replace the file")
    except errors.DataError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(errors.DataError) as raised:
        wrapped.reraise()
    assert "Traceback" in str(raised.value)
    assert errors.error_message(raised.value) == "cannot read image a.jpg: truncated. Delete or replace the file"


def exit_status(argv: list[str]) -> int:
    """The status ``vit ARGV`` exits with (a subcommand returns it or raises ``SystemExit``)."""
    try:
        return main(argv)
    except SystemExit as exit_info:
        return int(exit_info.code)


def checkpoint_folder_argv(sub: str, folder: Path, tmp_path: Path) -> list[str]:
    if sub == "explain":
        pictures = tmp_path / "pictures"
        pictures.mkdir(exist_ok=True)
        Image.new("RGB", (8, 8)).save(pictures / "0.png")
        return ["explain", str(folder), str(pictures), "--out", str(tmp_path / "explained")]
    if sub == "export":
        return ["export", "--ckpt_path", str(folder), "--out", str(tmp_path / "exported")]
    return [sub, "--ckpt_path", str(folder), "--runs_dir", str(tmp_path / "runs"), "--trainer.logger", "false"]


@pytest.mark.parametrize("sub", ["explain", "predict", "export", "test", "validate", "fit"])
def test_a_run_folder_means_its_last_checkpoint_in_every_subcommand(sub, tmp_path, capsys):
    """A run folder names its checkpoints/last.ckpt in every subcommand: here a file that is not a checkpoint, so the
    same sentence from each, naming that file, and nothing written."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("epoch003-acc0.9000.ckpt", "last.ckpt"):
        (run / "checkpoints" / name).write_bytes(b"not read")
    status = exit_status(checkpoint_folder_argv(sub, run, tmp_path))
    err = capsys.readouterr().err
    assert status == 2 and err.splitlines()[-1] == (
        f"error: {run}/checkpoints/last.ckpt is not a PyTorch checkpoint (neither torch.save's zip archive nor its "
        "legacy format: another kind of file, or corrupt); pass a .ckpt written by `vit fit` or a .pth/.safetensors "
        "file"
    ), err
    assert {p.name for p in tmp_path.iterdir()} <= {"run", "pictures"}


def test_a_folder_of_checkpoints_that_is_no_run_names_the_files_inside(tmp_path, capsys):
    folder = tmp_path / "saved"
    folder.mkdir()
    for name in ("epoch003-acc0.9000.ckpt", "epoch001-acc0.8000.ckpt"):
        (folder / name).write_bytes(b"not read")
    os.utime(folder / "epoch001-acc0.8000.ckpt", (1, 1))
    assert exit_status(checkpoint_folder_argv("export", folder, tmp_path)) == 2
    assert capsys.readouterr().err == (
        f"error: {folder} is a folder, not a checkpoint file: pass a .ckpt file inside it, e.g. "
        f"{folder}/epoch003-acc0.9000.ckpt (found: epoch003-acc0.9000.ckpt, epoch001-acc0.8000.ckpt)\n"
    )


@pytest.mark.parametrize("sub", ["explain", "predict", "export", "test"])
def test_a_checkpoint_folder_without_checkpoints_says_where_they_are(sub, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    status = exit_status(checkpoint_folder_argv(sub, empty, tmp_path))
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {empty} is a folder, not a checkpoint file, and holds no .ckpt file: ")
    assert "<run>/checkpoints/last.ckpt" in err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "usage"),
    [
        ([sys.executable, "scripts/fit.py", "--help"], "usage: vit fit"),
        ([sys.executable, "scripts/compare.py", "--help"], "usage: vit compare"),
        ([sys.executable, "scripts/benchmark.py", "--help"], "usage: vit bench"),
        ([sys.executable, "-m", "vit", "--help"], "usage: vit SUBCOMMAND"),
        ([sys.executable, "-m", "vit.bench", "--help"], "usage: vit bench"),
        (["vit", "--help"], "usage: vit SUBCOMMAND"),
    ],
)
def test_aliases_run_the_same_command(command, usage):
    if command[0] == "vit":
        command[0] = str(Path(sys.executable).with_name("vit"))
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert usage in done.stdout
