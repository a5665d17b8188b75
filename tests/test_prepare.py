"""``vit data prepare``: shard layout, metadata, a bad image skipped and counted, reruns, foreign and half-written
destinations."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from litdata import StreamingDataset
from PIL import Image

from vit.data.jpeg import decode
from vit.data.prepare import main
from vit.data.shard_writer import META, prepare_shards
from vit.errors import UsageError

CLASSES = ["china", "flower"]  # conftest.PHOTO_CLASSES: the classes photo_tree writes


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory, photo_tree) -> tuple[Path, Path, dict]:
    root = tmp_path_factory.mktemp("tree")
    counts = photo_tree(root)
    (root / "train" / "china" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    dest = tmp_path_factory.mktemp("shards") / "dest"
    meta = prepare_shards(dataset="imagefolder", data_dir=str(root), out=str(dest), short_side=64)
    return root, dest, {"meta": meta, "counts": counts}


def test_layout_and_metadata(prepared: tuple[Path, Path, dict]) -> None:
    root, dest, info = prepared
    meta, counts = info["meta"], info["counts"]
    assert sorted(os.listdir(dest)) == sorted([META, "train", "val"])
    assert (dest / "train" / "index.json").is_file() and (dest / "val" / "index.json").is_file()
    assert json.loads((dest / META).read_text()) == meta
    assert meta["classes"] == CLASSES and meta["dataset"] == "imagefolder" and meta["short_side"] == 64
    assert meta["source_images"] == {"train": counts["train"] + 1, "val": counts["val"]}  # the broken file counted
    assert meta["images"] == counts
    assert len(meta["skipped"]) == 1 and meta["skipped"][0].startswith(str(root / "train" / "china" / "broken.jpg"))


def test_samples_hold_shrunk_jpegs_labels_and_paths(prepared: tuple[Path, Path, dict]) -> None:
    root, dest, _ = prepared
    train = StreamingDataset(str(dest / "train"))
    seen = set()
    for i in range(len(train)):
        item = train[i]
        path = os.fsdecode(bytes(item["path"]))
        image = decode(bytes(item["image"]))
        assert CLASSES[int(item["label"])] == Path(path).parent.name
        with Image.open(path) as source:
            original = np.asarray(source.convert("RGB"))
        if original.shape[:2] == (300, 400):  # shrunk to a shorter side of 64: above 64 px, a 4:2:0 photograph
            assert image.shape == (64, 85, 3) and simplejpeg.decode_jpeg_header(bytes(item["image"]))[3] == "420"
        else:  # small images keep their size, and their pixels within JPEG tolerance
            assert image.shape == original.shape
            assert np.abs(image.astype(int) - original).mean() < 4.0
        seen.add((path, int(item["id"])))
    assert len({p for p, _ in seen}) == len(train) and len({i for _, i in seen}) == len(train)


def test_train_shards_mix_the_classes_and_eval_shards_keep_their_order(prepared: tuple[Path, Path, dict]) -> None:
    # LitData reads a chunk's samples together: train shards in folder order would stream one class at a time.
    _, dest, _ = prepared
    train, val = StreamingDataset(str(dest / "train")), StreamingDataset(str(dest / "val"))
    labels = [int(train[i]["label"]) for i in range(len(train))]
    assert sorted(labels) != labels and sorted(labels) == [0] * 4 + [1] * 4  # the broken image of class 0 left out
    ids = [int(train[i]["id"]) for i in range(len(train))]
    assert sorted(ids) != ids
    assert [int(val[i]["id"]) for i in range(len(val))] == list(range(len(val)))
    assert [int(val[i]["label"]) for i in range(len(val))] == [0, 0, 1, 1]


def test_channel_statistics_are_the_train_images(prepared: tuple[Path, Path, dict]) -> None:
    _, dest, info = prepared
    train = StreamingDataset(str(dest / "train"))
    pixels = np.concatenate([decode(bytes(train[i]["image"])).reshape(-1, 3) / 255.0 for i in range(len(train))])
    np.testing.assert_allclose(info["meta"]["mean"], pixels.mean(0), atol=1e-6)
    np.testing.assert_allclose(info["meta"]["std"], pixels.std(0), atol=1e-6)


def test_small_images_without_a_jpeg_of_their_own_keep_full_chroma(tmp_path: Path) -> None:
    """The digits (pixels, no files) are encoded 4:4:4: decoded once at their size, 4:2:0 would halve their colour."""
    meta = prepare_shards(dataset="digits", data_dir=None, out=str(tmp_path / "digits"))
    train = StreamingDataset(str(tmp_path / "digits" / "train"))
    assert len(train) == meta["images"]["train"] and meta["images"] == {"train": 1437, "val": 360}
    headers = [simplejpeg.decode_jpeg_header(bytes(train[i]["image"])) for i in range(0, len(train), 97)]
    assert {h[3] for h in headers} == {"444"} and max(max(h[:2]) for h in headers) <= 64


def test_rerun_does_nothing(prepared: tuple[Path, Path, dict], capsys: pytest.CaptureFixture[str]) -> None:
    root, dest, info = prepared
    before = {p: p.stat().st_mtime_ns for p in dest.rglob("*")}
    assert main(["--data.dataset", "imagefolder", "--data.data_dir", str(root), "--out", str(dest),
                 "--short_side", "64"]) == 0  # fmt: skip
    assert "already prepared" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in dest.rglob("*")} == before


def test_other_short_side_on_a_finished_dest_is_refused(prepared: tuple[Path, Path, dict]) -> None:
    root, dest, _ = prepared
    with pytest.raises(UsageError, match="already holds imagefolder prepared with --short_side 64"):
        prepare_shards(dataset="imagefolder", data_dir=str(root), out=str(dest), short_side=128)


def test_foreign_dest_is_refused_untouched(tmp_path: Path) -> None:
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match=r"--out .*mine holds other files \(notes.txt\)"):
        main(["--data.dataset", "digits", "--out", str(dest)])
    assert os.listdir(dest) == ["notes.txt"] and (dest / "notes.txt").read_text() == "keep me"


def test_half_written_dest_is_started_over(tmp_path: Path, photo_tree) -> None:
    root = tmp_path / "tree"
    counts = photo_tree(root, per_class=2, big=False)
    dest = tmp_path / "dest"
    (dest / "train").mkdir(parents=True)
    (dest / "train" / "chunk-0-0.bin").write_bytes(b"half")  # an interrupted run: shards but no metadata
    meta = prepare_shards(dataset="imagefolder", data_dir=str(root), out=str(dest))
    assert meta["images"] == counts and meta["skipped"] == []
    assert len(StreamingDataset(str(dest / "train"))) == counts["train"]


def test_bad_arguments_are_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--data.dataset", "digits", "--out", "x", "--short_sid", "9"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown option --short_sid (did you mean --short_side?)" in err
    with pytest.raises(UsageError, match="must be >= 1"):
        main(["--data.dataset", "digits", "--out", "x", "--workers", "0"])
    with pytest.raises(UsageError, match="no train/ folder"):
        main(["--data.dataset", "imagefolder", "--data.data_dir", "/", "--out", "x"])
