"""Bad data in an image folder: one ``error:`` line naming the file and the fix, exit 2, and no run folder left
behind (W&B's ``wandb/`` included); a run folder that holds a checkpoint, or that this process did not create, is
never removed."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit import runs
from vit.cli import cli_main

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--model.model_overrides", "{embed_dim: 16, depth: 1, num_heads: 2, window_size: 0, global_attn_indexes: []}"]


def image_folder(root: Path) -> Path:
    """``train/`` and ``val/`` with two classes of four 8x8 PNGs each."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in ("cat", "dog"):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(4):
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return root


def spoil(folder: Path, kind: str) -> Path:
    """A broken symbolic link or a corrupt PNG in ``folder``."""
    path = folder / "bad.png"
    if kind == "broken link":
        os.symlink(folder / "gone.png", path)
    else:
        path.write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    return path


@pytest.mark.parametrize("decode_once", ["true", "false"])
@pytest.mark.parametrize("kind", ["broken link", "corrupt"])
def test_bad_image_is_one_line_exit_2_and_leaves_no_run_folder(tmp_path, monkeypatch, capsys, kind, decode_once):
    monkeypatch.delenv("WANDB_DIR")  # W&B's files go to the run folder, as they do for a user
    data = image_folder(tmp_path / "data")
    bad = spoil(data / "train" / "cat", kind)
    runs_dir = tmp_path / "runs"
    args = ["fit", "--config", "quickstart", *TINY, "--data.dataset", "imagefolder", "--data.data_dir", str(data)]
    args += ["--data.decode_once", decode_once, "--trainer.max_epochs", "1", "--runs_dir", str(runs_dir)]
    with pytest.raises(SystemExit) as stop:
        cli_main(args)  # the quickstart's W&B logger (offline) starts its run before the data is read
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert stop.value.code == 2 and "Traceback" not in err and len(errors) == 1
    assert str(bad) in errors[0] and "--data.skip_corrupt true" in errors[0] and "Delete or replace" in errors[0]
    if kind == "broken link":
        assert "broken symbolic link" in errors[0]
    assert not runs_dir.exists() or not any(runs_dir.rglob("*")), sorted(runs_dir.rglob("*"))


def test_a_broken_link_is_skipped_with_skip_corrupt(tmp_path):
    from vit.data import ImageDataModule

    data = image_folder(tmp_path / "data")
    spoil(data / "train" / "cat", "broken link")
    dm = ImageDataModule(dataset="imagefolder", data_dir=str(data), img_size=8, skip_corrupt=True, num_workers=0)
    dm.setup("fit")
    assert len(dm.train_dataset) == 8  # the eight images, the link left out


def test_a_refused_run_keeps_a_folder_with_a_checkpoint_and_folders_it_did_not_create(tmp_path):
    mine = runs.claim_folder(tmp_path / "runs" / "cfg" / "run")
    (mine / "wandb").mkdir()
    kept = runs.claim_folder(tmp_path / "runs" / "cfg" / "run-with-checkpoint")
    (kept / "checkpoints").mkdir()
    (kept / "checkpoints" / "last.ckpt").write_bytes(b"x")
    other = tmp_path / "runs" / "cfg" / "someone-elses"
    (other / "wandb").mkdir(parents=True)
    runs.remove_unused_folders(refused_input=True)
    assert not mine.exists() and (kept / "checkpoints" / "last.ckpt").is_file() and (other / "wandb").is_dir()


def test_a_crash_leaves_a_folder_with_files_alone(tmp_path):
    mine = runs.claim_folder(tmp_path / "runs" / "cfg" / "run")
    (mine / "wandb").mkdir()
    runs.remove_unused_folders()  # not bad input (an interrupt, a bug): what the run wrote stays to look at
    assert (mine / "wandb").is_dir()
