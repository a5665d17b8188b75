"""Tests for vit.data: datasets on real on-disk formats, decoding, folder layouts and their errors, corrupt files, uint8
batches normalised on the device (transforms: test_transforms.py; built-in datasets and seeding: test_datamodule.py)."""

from __future__ import annotations

import io
import os
import pickle
import urllib.error
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torchvision.datasets.cifar
from data_samples import random_image, small_datamodule
from PIL import Image

from vit.data import (
    CIFAR10_CLASSES,
    CIFAR10_MEAN,
    CIFAR10_STD,
    DataError,
    load_rgb,
)

# ---------------------------------------------------------------------------------------------------- fixtures


def _jpeg_bytes(rng: np.random.Generator) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(random_image(rng, 32, 32)).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _write_images(folder: Path, rng: np.random.Generator) -> None:
    """One file of each kind PIL must convert to RGB: RGB PNG, grayscale, RGBA, palette with transparency, JPEG."""
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(random_image(rng)).save(folder / "rgb.png")
    Image.fromarray(random_image(rng)[..., 0]).save(folder / "gray.png")  # mode L
    Image.fromarray(np.dstack([random_image(rng), random_image(rng)[..., :1]])).save(folder / "rgba.png")  # mode RGBA
    palette = Image.fromarray(random_image(rng)).convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    palette.info["transparency"] = 0
    palette.save(folder / "palette.png", transparency=0)  # mode P with a transparent colour
    (folder / "photo.jpg").write_bytes(_jpeg_bytes(rng))


@pytest.fixture
def folder_root(tmp_path: Path) -> Path:
    """train/{cat,dog} with 5 images each and a notes file to ignore; val/{cat,dog} with 5 images each."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in ("cat", "dog"):
            _write_images(tmp_path / split / name, rng)
    (tmp_path / "train/cat/notes.txt").write_text("not an image, and without an image extension")
    return tmp_path


def _cifar_pickle(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)  # the official files are Python 2 pickles of str-keyed dicts


def _cifar_rows(first: int, n: int) -> np.ndarray:
    """Image i is flat colour (i, 2i, 3i), stored as the CIFAR row layout: 1024 R, then 1024 G, then 1024 B."""
    values = np.arange(first, first + n)
    return np.concatenate([np.repeat(values[:, None] * k % 256, 1024, axis=1) for k in (1, 2, 3)], axis=1).astype(
        np.uint8
    )


@pytest.fixture
def skip_cifar_md5(monkeypatch: pytest.MonkeyPatch) -> None:
    # torchvision compares every CIFAR file with the md5 of the official release; our tiny files in the same
    # pickle format cannot match, so in tests only the check is reduced to "the file exists". Missing files
    # still fail it, which the missing-dataset tests rely on.
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))


@pytest.fixture
def cifar10_root(tmp_path: Path, skip_cifar_md5: None) -> Path:
    base = tmp_path / "cifar-10-batches-py"
    for b in range(5):  # 4 images per training batch: 20 in all
        labels = [(4 * b + i) % 10 for i in range(4)]
        _cifar_pickle(
            base / f"data_batch_{b + 1}",
            {"batch_label": f"training batch {b + 1} of 5", "labels": labels, "data": _cifar_rows(4 * b, 4),
             "filenames": [f"img_{4 * b + i}.png" for i in range(4)]},
        )  # fmt: skip
    _cifar_pickle(
        base / "test_batch",
        {"batch_label": "testing batch 1 of 1", "labels": [9, 8, 7], "data": _cifar_rows(100, 3),
         "filenames": ["t0.png", "t1.png", "t2.png"]},
    )  # fmt: skip
    _cifar_pickle(base / "batches.meta", {"num_cases_per_batch": 4, "label_names": CIFAR10_CLASSES, "num_vis": 3072})
    return tmp_path


@pytest.fixture
def cifar100_root(tmp_path: Path, skip_cifar_md5: None) -> Path:
    base = tmp_path / "cifar-100-python"
    fine = [0, 42, 99, 7, 7, 63]
    _cifar_pickle(
        base / "train",
        {"filenames": [f"{i}.png" for i in range(6)], "batch_label": "training batch 1 of 1", "fine_labels": fine,
         "coarse_labels": [f // 5 for f in fine], "data": _cifar_rows(0, 6)},
    )  # fmt: skip
    _cifar_pickle(
        base / "test",
        {"filenames": ["a.png", "b.png"], "batch_label": "testing batch 1 of 1", "fine_labels": [5, 98],
         "coarse_labels": [1, 19], "data": _cifar_rows(50, 2)},
    )  # fmt: skip
    names = {"fine_label_names": [f"fine_{i}" for i in range(100)], "coarse_label_names": [f"c{i}" for i in range(20)]}
    _cifar_pickle(base / "meta", names)
    return tmp_path


# ----------------------------------------------------------------------------------------- datasets on disk
@pytest.mark.parametrize("decode_once", [True, False])
def test_cifar10_reads_real_pickle_format(cifar10_root: Path, decode_once: bool) -> None:
    dm = small_datamodule("cifar10", data_dir=str(cifar10_root), decode_once=decode_once)
    assert dm.num_classes == 10 and dm.class_names == CIFAR10_CLASSES
    assert dm.mean == CIFAR10_MEAN and dm.std == CIFAR10_STD
    dm.setup("fit")
    assert len(dm.train_dataset) == 20 and len(dm.val_dataset) == 3
    assert dm.train_dataset.labels.tolist() == [i % 10 for i in range(20)]
    assert dm.val_dataset.labels.tolist() == [9, 8, 7]
    if decode_once:  # decoded at img_size 16 (flat colours stay flat), channels first
        assert dm.train_dataset.images.shape == (20, 3, 16, 16)
        assert dm.train_dataset.images[5, :, 9, 3].tolist() == [5, 10, 15]
    else:
        assert dm.train_dataset.images.shape == (20, 32, 32, 3)
        assert dm.train_dataset.images[5, 17, 3].tolist() == [5, 10, 15]  # rows are CHW, stored here as HWC
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (3, 3, 16, 16) and y.tolist() == [9, 8, 7]


def test_cifar100_reads_real_pickle_format(cifar100_root: Path) -> None:
    dm = small_datamodule("cifar100", data_dir=str(cifar100_root), batch_size=2)
    assert dm.num_classes == 100
    assert dm.class_names[42] == "fine_42" and len(dm.class_names) == 100  # read from meta before setup
    dm.setup("fit")
    assert dm.train_dataset.labels.tolist() == [0, 42, 99, 7, 7, 63]
    assert dm.val_dataset.labels.tolist() == [5, 98]
    assert dm.val_dataset.images[1, :, 0, 0].tolist() == [51, 102, 153]
    assert sum(len(y) for _, y in dm.train_dataloader()) == 6


def test_cifar_missing_names_the_expected_files(tmp_path: Path) -> None:
    dm = small_datamodule("cifar10", data_dir=str(tmp_path))
    with pytest.raises(DataError, match=r"cifar-10-batches-py/\{data_batch_1.*--data\.download true"):
        dm.setup("fit")
    with pytest.raises(DataError, match=r"cifar-100-python/\{train,test,meta\}"):
        small_datamodule("cifar100", data_dir=str(tmp_path)).setup("validate")


def test_cifar_download_failure_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torchvision.datasets.cifar, "download_and_extract_archive", offline)
    dm = small_datamodule("cifar10", data_dir=str(tmp_path), download=True)
    with pytest.raises(DataError, match=r"downloading cifar10 .* failed .*no network.*cifar-10-batches-py"):
        dm.prepare_data()


def test_imagefolder_counts_classes_before_setup_and_loads_every_mode(folder_root: Path) -> None:
    dm = small_datamodule("imagefolder", data_dir=str(folder_root), batch_size=2)
    assert dm.num_classes == 2 and dm.class_names == ["cat", "dog"]
    assert dm.train_dataset is None
    with pytest.warns(UserWarning, match=r"ignored 1 file\(s\) without an image extension.*notes\.txt"):
        dm.setup("fit")
    assert len(dm.train_dataset) == 10 and len(dm.val_dataset) == 10
    assert dm.train_dataset.labels.tolist() == [0] * 5 + [1] * 5
    xs, ys = zip(*(dm.val_dataset[i] for i in range(len(dm.val_dataset))), strict=True)
    assert all(x.shape == (3, 16, 16) and x.dtype == torch.uint8 for x in xs)  # normalised on the device
    assert list(ys) == [0] * 5 + [1] * 5


def test_load_rgb_converts_gray_rgba_and_palette(folder_root: Path) -> None:
    gray = load_rgb(folder_root / "train/cat/gray.png")
    assert gray.shape == (12, 10, 3) and gray.dtype == np.uint8
    assert (gray[..., 0] == gray[..., 1]).all() and (gray[..., 1] == gray[..., 2]).all()
    rgba_source = np.asarray(Image.open(folder_root / "train/cat/rgba.png"))
    assert np.array_equal(load_rgb(folder_root / "train/cat/rgba.png"), rgba_source[..., :3])
    assert load_rgb(folder_root / "train/cat/palette.png").shape == (12, 10, 3)


@pytest.mark.parametrize("kind", ["rgb", "gray", "cmyk", "progressive", "subsampled_444", "exif_rotated"])
def test_load_rgb_decodes_jpeg_exactly_as_pil(tmp_path: Path, kind: str) -> None:
    # RGB and grayscale JPEGs go through OpenCV's libjpeg-turbo, the rest through PIL: PIL's pixels either way.
    image = Image.fromarray(random_image(np.random.default_rng(8), 37, 53))
    options: dict = {"quality": 90}
    if kind == "gray":
        image = image.convert("L")
    elif kind == "cmyk":
        image = image.convert("CMYK")
    elif kind == "progressive":
        options["progressive"] = True
    elif kind == "subsampled_444":
        options["subsampling"] = 0
    elif kind == "exif_rotated":  # orientation 6 (rotate 90° to view): ignored, as PIL and timm's loaders do
        exif = Image.Exif()
        exif[0x0112] = 6
        options["exif"] = exif
    image.save(tmp_path / "a.jpg", **options)
    out = load_rgb(tmp_path / "a.jpg")
    assert out.shape == (37, 53, 3) and out.dtype == np.uint8 and out.flags.c_contiguous
    with Image.open(tmp_path / "a.jpg") as reference:
        np.testing.assert_array_equal(out, np.asarray(reference.convert("RGB")))


def test_load_rgb_truncated_jpeg_raises_oserror(tmp_path: Path) -> None:
    data = _jpeg_bytes(np.random.default_rng(7))
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    with pytest.raises(OSError, match=r"^cannot read image .*cut\.jpg: the JPEG data is truncated or corrupt$"):
        load_rgb(tmp_path / "cut.jpg")


def test_imagefolder_accepts_test_split_instead_of_val(folder_root: Path) -> None:
    (folder_root / "val").rename(folder_root / "test")
    dm = small_datamodule("imagefolder", data_dir=str(folder_root))
    dm.setup("validate")
    assert len(dm.val_dataset) == 10 and dm.train_dataset is None


@pytest.mark.parametrize(
    ("dataset", "make", "message"),
    [
        ("imagefolder", None, r"--data\.data_dir is required for dataset imagefolder"),
        ("imagenet", "missing", r"does not exist.*train/<wnid>/\*\.JPEG"),
        ("imagefolder", "no_train", r"no train/ folder .*train/<class>/<image>"),
        ("imagefolder", "no_val", r"no val/ or test/ folder"),
        ("imagenet", "no_val", r"no val/ folder"),
        ("imagenet", "flat_val", r"sort them into val/<wnid>/"),
        ("imagefolder", "extra_val_class", r"class folders that .*train lacks: \['bird'\]"),
    ],
)
def test_folder_layout_errors_say_what_was_expected(
    folder_root: Path, dataset: str, make: str | None, message: str
) -> None:
    if make == "missing":
        folder_root = folder_root / "nowhere"
    elif make == "no_train":
        (folder_root / "train").rename(folder_root / "training")
    elif make == "no_val":
        (folder_root / "val").rename(folder_root / "validation")
    elif make == "flat_val":
        for image in (folder_root / "val/cat").iterdir():
            image.rename(folder_root / "val" / image.name)
        for folder in ("cat", "dog"):
            for image in (folder_root / "val" / folder).iterdir():
                image.unlink()
            (folder_root / "val" / folder).rmdir()
    elif make == "extra_val_class":
        _write_images(folder_root / "val/bird", np.random.default_rng(5))
    data_dir = None if make is None else str(folder_root)
    with pytest.raises(DataError, match=message):
        small_datamodule(dataset, data_dir=data_dir)


def test_class_missing_from_val_is_reported(folder_root: Path) -> None:
    _write_images(folder_root / "train/fish", np.random.default_rng(6))
    with pytest.warns(UserWarning, match=r"not in .*val: \['fish'\]"):
        dm = small_datamodule("imagefolder", data_dir=str(folder_root))
    assert dm.num_classes == 3


def _add_unreadable(folder: Path, kind: str) -> str:
    if kind == "truncated":
        data = _jpeg_bytes(np.random.default_rng(7))
        (folder / "broken.jpg").write_bytes(data[: len(data) // 2])
        return "broken.jpg"
    (folder / "fake.png").write_text("this is text, not a PNG")
    return "fake.png"


@pytest.mark.parametrize("decode_once", [True, False])
@pytest.mark.parametrize("kind", ["truncated", "not_an_image"])
def test_unreadable_file_error_names_the_file(folder_root: Path, kind: str, decode_once: bool) -> None:
    name = _add_unreadable(folder_root / "val/dog", kind)
    dm = small_datamodule("imagefolder", data_dir=str(folder_root), decode_once=decode_once)
    with pytest.raises(DataError, match=rf"cannot read image .*val/dog/{name}: .*--data\.skip_corrupt true") as err:
        dm.setup("validate")  # decoded once: here
        list(dm.val_dataloader())  # per image: here
    assert "BytesIO" not in str(err.value)


def test_skip_corrupt_drops_files_and_counts_them(folder_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    _add_unreadable(folder_root / "val/dog", "truncated")
    _add_unreadable(folder_root / "val/cat", "not_an_image")
    dm = small_datamodule("imagefolder", data_dir=str(folder_root), skip_corrupt=True, batch_size=4, decode_once=False)
    dm.setup("validate")
    assert len(dm.val_dataset) == 12
    with pytest.warns(UserWarning, match=r"skipped 2 unreadable image file\(s\) out of 12"):
        labels = torch.cat([y for _, y in dm.val_dataloader()])
    assert labels.tolist() == [0] * 5 + [1] * 5 and dm.val_dataset.num_skipped == 2
    assert "broken.jpg" in caplog.text and "fake.png" in caplog.text


def test_skip_corrupt_leaves_files_out_of_the_decoded_split(
    folder_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _add_unreadable(folder_root / "val/dog", "truncated")
    _add_unreadable(folder_root / "val/cat", "not_an_image")
    dm = small_datamodule("imagefolder", data_dir=str(folder_root), skip_corrupt=True, cache_dir=str(folder_root / "c"))
    dm.setup("validate")
    assert len(dm.val_dataset) == 10 and dm.val_dataset.labels.tolist() == [0] * 5 + [1] * 5
    assert "broken.jpg" in caplog.text and "fake.png" in caplog.text


class _TinyClassifier(pl.LightningModule):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3 * 8 * 8, num_classes)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.fc(x.flatten(1)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_skip_corrupt_under_a_lightning_trainer(folder_root: Path, cpu_trainer) -> None:
    _add_unreadable(folder_root / "train/dog", "truncated")
    dm = small_datamodule(
        "imagefolder", data_dir=str(folder_root), skip_corrupt=True, img_size=8, batch_size=11, decode_once=False
    )
    trainer = cpu_trainer(max_epochs=2)
    with pytest.warns(UserWarning, match=r"skipped 1 unreadable image file\(s\) out of 11 in this pass \(2 in total"):
        trainer.fit(_TinyClassifier(dm.num_classes), datamodule=dm)
    assert trainer.global_step == 2 and dm.train_dataset.num_skipped == 2


@pytest.mark.parametrize("stage", ["fit", "validate", "predict"])
def test_uint8_batches_are_normalised_on_the_device_through_the_trainer(stage: str, cpu_trainer) -> None:
    # What reaches the module with normalize_on_device=True equals the batches normalised in the workers.
    seen: dict[bool, list[torch.Tensor]] = {True: [], False: []}

    class Record(_TinyClassifier):
        def __init__(self, on_device: bool) -> None:
            super().__init__(10)
            self.on_device = on_device

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            seen[self.on_device].append(batch[0])
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
            seen[self.on_device].append(batch[0])

        def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
            seen[self.on_device].append(batch[0])

    for on_device in (True, False):
        dm = small_datamodule("digits", img_size=8, batch_size=16, normalize_on_device=on_device)
        trainer = cpu_trainer(max_steps=2, limit_val_batches=2, limit_predict_batches=2)
        getattr(trainer, stage)(Record(on_device), datamodule=dm)
    assert len(seen[True]) == len(seen[False]) >= 2
    for on_device, in_workers in zip(seen[True], seen[False], strict=True):
        assert on_device.dtype == in_workers.dtype == torch.float32
        torch.testing.assert_close(on_device, in_workers, atol=1e-6, rtol=0)
    raw, labels = next(iter(dm.val_dataloader()))
    assert raw.dtype == torch.float32  # the last dm normalises in its workers
    batch = small_datamodule("digits", img_size=8, batch_size=16).on_after_batch_transfer([raw.clone(), labels], 0)
    assert isinstance(batch, list) and torch.equal(batch[0], raw)  # float batches pass through unchanged
