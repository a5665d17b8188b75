"""One way to name a checkpoint (vit.checkpoints.naming): a file, a run folder, last / best of the newest run, with
the same sentence for the same mistake in every subcommand."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from PIL import Image

from vit.checkpoints.naming import find_checkpoint
from vit.errors import CheckpointFolderError, MissingCheckpointError
from vit.main import main


def make_run(runs: Path, config: str, name: str, mtime: int, best: str | None = None) -> Path:
    """A run folder as `vit fit` leaves it: checkpoints/last.ckpt (written at ``mtime``) recording ``best`` as
    ModelCheckpoint's best file, which is written beside it."""
    folder = runs / config / name / "checkpoints"
    folder.mkdir(parents=True)
    state = {"best_model_path": str(folder / best) if best else ""}
    torch.save({"callbacks": {"ModelCheckpoint{'monitor': 'val/acc'}": state}}, folder / "last.ckpt")
    if best:
        torch.save({}, folder / best)
    os.utime(folder / "last.ckpt", (mtime, mtime))
    return folder.parent


@pytest.fixture
def runs(tmp_path) -> Path:
    runs = tmp_path / "runs"
    make_run(runs, "quickstart", "old", 1_000, best="epoch003-acc0.9000.ckpt")
    make_run(runs, "quickstart", "new", 2_000, best="epoch007-acc0.9500.ckpt")
    make_run(runs, "cifar10_cpu", "newest", 3_000)
    return runs


def test_a_file_is_itself_and_a_run_folder_is_its_last_checkpoint(runs):
    new = runs / "quickstart" / "new"
    assert find_checkpoint(new / "checkpoints" / "last.ckpt") == new / "checkpoints" / "last.ckpt"
    assert find_checkpoint(new) == new / "checkpoints" / "last.ckpt"
    assert find_checkpoint(new / "checkpoints") == new / "checkpoints" / "last.ckpt"
    assert find_checkpoint("s3://bucket/last.ckpt") == "s3://bucket/last.ckpt"


def test_last_and_best_are_the_newest_run_of_the_config_or_of_all_runs(runs):
    assert find_checkpoint("last", config="quickstart", runs_dir=runs) == runs / "quickstart/new/checkpoints/last.ckpt"
    best = find_checkpoint("best", config="configs/quickstart.yaml", runs_dir=runs)
    assert best == runs / "quickstart/new/checkpoints/epoch007-acc0.9500.ckpt"
    assert find_checkpoint("last", runs_dir=runs) == runs / "cifar10_cpu/newest/checkpoints/last.ckpt"


def test_best_is_found_beside_last_after_the_run_moved(runs, tmp_path):
    moved = tmp_path / "elsewhere"
    (runs / "quickstart").rename(moved)
    best = find_checkpoint("best", config="elsewhere", runs_dir=tmp_path)
    assert best == moved / "new/checkpoints/epoch007-acc0.9500.ckpt"


def test_best_is_named_as_last_is(runs, monkeypatch):
    """`vit fit` records the best file's absolute path; from the runs' parent, best and last both read relative."""
    monkeypatch.chdir(runs.parent)
    last = find_checkpoint("last", config="quickstart", runs_dir="runs")
    best = find_checkpoint("best", config="quickstart", runs_dir="runs")
    assert last == Path("runs/quickstart/new/checkpoints/last.ckpt")
    assert best == Path("runs/quickstart/new/checkpoints/epoch007-acc0.9500.ckpt")


def test_best_of_a_run_that_recorded_none_says_to_use_last(runs):
    with pytest.raises(MissingCheckpointError, match=r"best: the run .*newest has no best checkpoint .* use last"):
        find_checkpoint("best", runs_dir=runs)


def test_mistakes_are_one_sentence_each(runs):
    (runs.parent / "empty").mkdir()
    with pytest.raises(MissingCheckpointError) as raised:
        find_checkpoint("last", config="vit_small", runs_dir=runs)
    assert str(raised.value) == (
        f"--ckpt_path last: no last.ckpt of config 'vit_small' under {runs}/: train one first with "
        "`vit fit --config vit_small`, or pass a .ckpt file or a run folder"
    )
    with pytest.raises(MissingCheckpointError, match=r"^checkpoint nope.ckpt not found: pass a .ckpt file, a run fo"):
        find_checkpoint("nope.ckpt")
    with pytest.raises(CheckpointFolderError, match="is a folder, not a checkpoint file, and holds no .ckpt file"):
        find_checkpoint(runs.parent / "empty")


@pytest.mark.parametrize(
    "argv",
    [
        ["explain", "--ckpt_path", "last", "pictures"],
        ["explain", "last", "pictures"],
        ["export", "--ckpt_path", "last", "--out", "exported"],
        ["predict", "--ckpt_path", "last", "--data.predict_dir", "pictures"],
        ["test", "--ckpt_path", "last"],
    ],
)
def test_last_without_runs_is_the_same_error_in_every_subcommand(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pictures").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "pictures" / "0.png")
    with pytest.raises(SystemExit) as raised:
        main([*argv, "--config", "quickstart", "--runs_dir", "nowhere"])
    err = capsys.readouterr().err
    assert raised.value.code == 2 and err.splitlines() == [
        "error: --ckpt_path last: no last.ckpt of config 'quickstart' under nowhere/: train one first with "
        "`vit fit --config quickstart`, or pass a .ckpt file or a run folder"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pictures"]


@pytest.mark.parametrize(
    "argv",
    [
        ["explain", "nope.ckpt", "pictures"],
        ["explain", "--ckpt_path", "nope.ckpt", "pictures"],
        ["export", "--ckpt_path", "nope.ckpt", "--out", "exported"],
        ["predict", "--ckpt_path", "nope.ckpt", "--data.predict_dir", "pictures"],
        ["validate", "--ckpt_path", "nope.ckpt"],
        ["fit", "--ckpt_path", "nope.ckpt"],
    ],
)
def test_a_missing_checkpoint_is_the_same_sentence_in_every_subcommand(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pictures").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "pictures" / "0.png")
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2 and capsys.readouterr().err.splitlines() == [
        "error: checkpoint nope.ckpt not found: pass a .ckpt file, a run folder, or last / best (of the newest run "
        "of --config, or of every run under runs/)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pictures"]
