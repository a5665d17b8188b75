"""``vit predict``: predictions.csv (one row per image, class names, top-5) from a model trained on the digits, written
below the checkpoint's run folder without touching the run's own files; rollout overlays on request."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit.callbacks.predictions import read_predictions
from vit.cli import cli_main

COMMON = ["--config", "quickstart", "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]
COMMON += ["--trainer.enable_model_summary", "false", "--data.num_workers", "0"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, dict[str, int]]:
    """The quickstart model trained 3 epochs on the digits (about 20 s); its last.ckpt, the runs folder, and a
    folder of 60 validation digits saved as PNG files (nested, named ``<i>.png``) with their true labels."""
    root = tmp_path_factory.mktemp("predict")
    torch.set_num_threads(1)
    cli = cli_main(["fit", *COMMON, "--runs_dir", str(root / "runs"), "--trainer.max_epochs", "3"])
    images = root / "images"
    labels = {}
    for i in range(60):
        image, label = cli.datamodule.val_dataset[i]  # uint8 (3, 16, 16): what the eval transform gave
        path = images / f"batch{i % 3}" / f"{i:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(path)
        labels[str(path)] = int(label)
    return Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt", root / "runs", labels


def test_predict_a_folder_writes_one_row_per_image_with_class_names(trained, capsys):
    last, runs, labels = trained
    run = last.parent.parent
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    cli = cli_main(
        ["predict", *COMMON, "--runs_dir", str(runs), "--ckpt_path", str(last)]
        + ["--data.predict_dir", str(Path(next(iter(labels))).parent.parent)]
    )
    folder = Path(cli.trainer.default_root_dir)
    csv = folder / "predictions.csv"
    assert folder.parent == run and folder.name.startswith("predict-")  # below the checkpoint's run
    assert f"predictions of 60 images: {csv}" in capsys.readouterr().out
    rows = read_predictions(csv)
    assert list(rows[0]) == ["path", "pred", "prob"] + [f"top{k}{s}" for k in range(1, 6) for s in ("", "_prob")]
    assert sorted(row["path"] for row in rows) == sorted(labels)  # one row per image, found recursively
    names = [str(d) for d in range(10)]
    for row in rows:
        probs = [float(row[f"top{k}_prob"]) for k in range(1, 6)]
        assert row["pred"] == row["top1"] and row["pred"] in names and float(row["prob"]) == probs[0]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-5
        assert len({row[f"top{k}"] for k in range(1, 6)}) == 5
    accuracy = np.mean([int(row["pred"]) == labels[row["path"]] for row in rows])
    assert accuracy >= 0.5  # chance is 0.1; measured 0.9 after 3 epochs
    # The run's own files are untouched: only the new predict folder was added.
    after = sorted(p.relative_to(run) for p in run.rglob("*") if folder not in p.parents and p != folder)
    assert after == before


def test_predict_prints_where_it_wrote_on_a_line_after_the_progress_bar(trained, capsys):
    last, runs, labels = trained
    args = ["predict", "--trainer.logger", "false", "--data.num_workers", "0", "--runs_dir", str(runs)]
    cli = cli_main([*args, "--ckpt_path", str(last), "--data.predict_dir", str(Path(next(iter(labels))).parent)])
    out = capsys.readouterr().out
    csv = Path(cli.trainer.default_root_dir) / "predictions.csv"
    bar, _, after = out.rpartition(f"predictions of 20 images: {csv}\n")
    assert "Predicting DataLoader 0: 100%" in bar and bar.endswith("\n"), out  # the bar ended, then the path
    assert "\r" not in after


def test_predict_without_a_folder_predicts_the_validation_split_and_never_overwrites(trained):
    last, runs, _ = trained
    first = cli_main(["predict", *COMMON, "--runs_dir", str(runs), "--ckpt_path", str(last)])
    second = cli_main(["predict", *COMMON, "--runs_dir", str(runs), "--ckpt_path", str(last)])
    rows = read_predictions(Path(first.trainer.default_root_dir) / "predictions.csv")
    assert len(rows) == len(first.datamodule.val_dataset) == 360
    assert first.trainer.default_root_dir != second.trainer.default_root_dir  # a second prediction, a second folder
    assert read_predictions(Path(second.trainer.default_root_dir) / "predictions.csv") == rows


def test_predict_writes_rollout_overlays_on_request(trained):
    last, runs, labels = trained
    folder = Path(next(iter(labels))).parent  # 20 images
    cli = cli_main(
        ["predict", *COMMON, "--runs_dir", str(runs), "--ckpt_path", str(last)]
        + ["--data.predict_dir", str(folder), "--predictions.overlays", "true"]
    )
    overlays = sorted((Path(cli.trainer.default_root_dir) / "rollout").glob("*.png"))
    assert len(overlays) == 20
    with Image.open(overlays[0]) as image:
        assert image.mode == "RGB" and image.width > 2 * image.height * 0.9  # image | heatmap side by side
        assert math.prod(image.size) > 0 and np.asarray(image).std() > 10


def test_predict_with_a_bad_checkpoint_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "notes.ckpt"
    bad.write_text("not a checkpoint\n")
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["predict", *COMMON, "--runs_dir", str(tmp_path / "runs"), "--ckpt_path", str(bad)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: {bad} is not a PyTorch checkpoint")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.csv"))


def test_a_digit_saved_at_8_and_at_64_px_gets_the_same_class(trained, tmp_path):
    """The eval transform antialiases when it downscales: scikit-learn's 8x8 digits, and the same digits upscaled to
    64x64 (bicubic), resized to the model's 16 px, get the same class (measured 0.98 with the full quickstart)."""
    from sklearn.datasets import load_digits

    last, runs, _ = trained
    digits = load_digits()
    pick = np.random.default_rng(0).choice(len(digits.images), 60, replace=False)
    preds = {}
    for size in (8, 64):
        folder = tmp_path / f"px{size}"
        folder.mkdir()
        for i in pick:
            image = Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8))
            image.resize((size, size), Image.BICUBIC).save(folder / f"{i:04d}.png")
        cli = cli_main(
            ["predict", *COMMON, "--runs_dir", str(runs), "--ckpt_path", str(last)]
            + ["--data.predict_dir", str(folder)]
        )
        rows = read_predictions(Path(cli.trainer.default_root_dir) / "predictions.csv")
        preds[size] = {Path(row["path"]).stem: int(row["pred"]) for row in rows}
    assert sorted(preds[8]) == sorted(preds[64]) and len(preds[8]) == 60
    agree = np.mean([preds[8][k] == preds[64][k] for k in preds[8]])
    accuracy = np.mean([preds[8][f"{i:04d}"] == digits.target[i] for i in pick])
    assert agree >= 0.85 and accuracy >= 0.5, (agree, accuracy)


BARE = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false", "--data.num_workers", "0"]


def test_predict_from_an_empty_folder_with_the_checkpoint_alone(trained, tmp_path, monkeypatch):
    """No --config and no training data: class names, statistics, image size and eval transform come from the
    checkpoint, and the probabilities are those of vit.Predictor on the same files."""
    import vit

    last, _, labels = trained
    folder = tmp_path / "alone"
    folder.mkdir()
    (folder / "model.ckpt").write_bytes(last.read_bytes())
    images = Path(next(iter(labels))).parent  # 20 PNGs of 16 px
    monkeypatch.chdir(folder)
    monkeypatch.setattr("sys.argv", ["vit"])
    cli = cli_main(["predict", *BARE, "--ckpt_path", "model.ckpt", "--data.predict_dir", str(images)])
    rows = read_predictions(Path(cli.trainer.default_root_dir) / "predictions.csv")
    assert len(rows) == 20 and {row["pred"] for row in rows} <= {str(d) for d in range(10)}
    results = vit.Predictor("model.ckpt")([row["path"] for row in rows])
    for row, result in zip(rows, results, strict=True):
        assert row["pred"] == result.label and float(row["prob"]) == pytest.approx(result.prob, abs=2e-6)
    accuracy = np.mean([int(row["pred"]) == labels[row["path"]] for row in rows])
    assert accuracy >= 0.5  # chance is 0.1


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--config", "cifar10_cpu"], "data.img_size is 32 (in "),
        (
            ["--data.img_size", "32"],
            "data.img_size is 32 (on the command line) but the checkpoint was trained at img_size 16",
        ),
        (
            ["--data.dataset", "cifar100", "--data.img_size", "16"],
            "'cifar100' has 100 classes but the checkpoint's model has 10",
        ),
    ],
)
def test_settings_that_contradict_the_checkpoint_are_one_line(trained, extra, message, tmp_path, capsys):
    last, _, labels = trained
    images = Path(next(iter(labels))).parent
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["predict", *BARE, "--runs_dir", str(tmp_path), "--ckpt_path", str(last), *extra]
                 + ["--data.predict_dir", str(images)])  # fmt: skip
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err
    assert not any(tmp_path.rglob("*.csv"))


def test_a_corrupt_jpeg_stops_predict_with_one_line_and_leaves_no_folder(trained, tmp_path, capsys):
    """A JPEG that is only a header among good images, read by a loader worker: one error line naming the file (not
    the worker's traceback), on its own line after the progress bar, and no predict folder left below the run."""
    last, runs, labels = trained
    run = last.parent.parent
    before = sorted(p.name for p in run.iterdir())
    folder = tmp_path / "photos"
    folder.mkdir()
    for path in sorted(labels)[:4]:
        (folder / Path(path).name).write_bytes(Path(path).read_bytes())
    bad = folder / "001b.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0" + bytes(100))
    args = ["predict", "--trainer.logger", "false", "--runs_dir", str(runs), "--ckpt_path", str(last)]
    args += ["--data.predict_dir", str(folder), "--data.num_workers", "1", "--data.batch_size", "2"]
    with pytest.raises(SystemExit) as exit_info:
        cli_main(args)
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert f"cannot read image {bad}" in err and "--data.skip_corrupt true" in err and "Traceback" not in err
    assert out.endswith("\n")  # the progress bar ended its line before the error
    assert sorted(p.name for p in run.iterdir()) == before


def png_claiming(path: Path, width: int, height: int) -> None:
    """A PNG of a few bytes whose header claims ``width`` x ``height`` pixels (its data is never decoded)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(16))) + chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)


@pytest.mark.parametrize(
    "size, limit",
    [((12000, 12000), None), ((20000, 20000), None), ((17, 16), "256")],
    ids=["above-default", "above-pil-error", "above-option"],
)
def test_an_image_above_the_pixel_limit_is_refused_in_one_line(size, limit, trained, tmp_path, capsys):
    """Refused from its header, before decoding: one line naming the file, its size and the option, never PIL's
    DecompressionBombWarning or its "attack" error; nothing written."""
    import warnings

    last, runs, labels = trained
    run = last.parent.parent
    before = sorted(p.name for p in run.iterdir())
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "a.png").write_bytes(Path(sorted(labels)[0]).read_bytes())  # 16 x 16: 256 pixels
    big = folder / "b.png"
    png_claiming(big, *size)
    args = ["predict", *BARE, "--runs_dir", str(runs), "--ckpt_path", str(last), "--data.predict_dir", str(folder)]
    args += ["--data.max_image_pixels", limit] if limit else []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(SystemExit) as exit_info:
            cli_main(args)
    assert not [w for w in caught if "DecompressionBomb" in type(w.message).__name__ + str(w.message)]
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    shown = "256 pixels (0.000256 megapixels)" if limit else "50,000,000 pixels (50 megapixels)"
    assert err.startswith(f"error: cannot read image {big}: {size[0]}x{size[1]} pixels (")
    assert f"is above the limit of {shown}: raise the limit with --data.max_image_pixels" in err
    assert "attack" not in err and "Traceback" not in err
    assert sorted(p.name for p in run.iterdir()) == before


def test_the_pixel_limit_can_be_raised(trained, tmp_path):
    last, runs, labels = trained
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "a.png").write_bytes(Path(sorted(labels)[0]).read_bytes())
    args = ["predict", *BARE, "--runs_dir", str(runs), "--ckpt_path", str(last), "--data.predict_dir", str(folder)]
    with pytest.raises(SystemExit):
        cli_main([*args, "--data.max_image_pixels", "255"])
    cli = cli_main([*args, "--data.max_image_pixels", "256"])
    assert len(read_predictions(Path(cli.trainer.default_root_dir) / "predictions.csv")) == 1
    import vit

    with pytest.raises(vit.errors.InputError, match="16x16 pixels .* above the limit of 255 pixels"):
        vit.Predictor(last, max_image_pixels=255)([folder / "a.png"])
    assert vit.Predictor(last, max_image_pixels=256)([folder / "a.png"])[0].label


@pytest.mark.parametrize("skip_corrupt", [False, True])
def test_a_corrupt_image_with_the_checkpoint_alone(trained, tmp_path, monkeypatch, capsys, skip_corrupt):
    """A truncated file among good ones: without --data.skip_corrupt one error line naming the file and the flag, and
    nothing written; with it, the good images predicted (as vit.Predictor predicts them) and the bad one reported."""
    import vit

    last, _, labels = trained
    good = sorted(labels)[:6]
    folder = tmp_path / "mixed"
    folder.mkdir()
    for path in good:
        (folder / Path(path).name).write_bytes(Path(path).read_bytes())
    bad = folder / "002b.png"  # sorted between the good ones: the loader meets it mid-batch
    bad.write_bytes(Path(good[0]).read_bytes()[:40])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["vit"])
    args = ["predict", *BARE, "--runs_dir", str(tmp_path / "runs"), "--ckpt_path", str(last)]
    args += ["--data.predict_dir", str(folder), "--data.batch_size", "4"]
    if not skip_corrupt:
        with pytest.raises(SystemExit) as exit_info:
            cli_main(args)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
        assert str(bad) in err and "--data.skip_corrupt true" in err
        assert not any(tmp_path.rglob("*.csv"))
        return
    with pytest.warns(UserWarning, match=f"skipping unreadable image {bad}"):
        cli = cli_main([*args, "--data.skip_corrupt", "true"])
    rows = read_predictions(Path(cli.trainer.default_root_dir) / "predictions.csv")
    assert [row["path"] for row in rows] == sorted(str(folder / Path(p).name) for p in good)
    results = vit.Predictor(str(last))([row["path"] for row in rows])
    for row, result in zip(rows, results, strict=True):
        assert row["pred"] == result.label and float(row["prob"]) == pytest.approx(result.prob, abs=2e-6)
