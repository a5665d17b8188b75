"""Decoded once (vit/data/decoded.py): the on-disk cache (named by its listing, rebuilt when corrupt, written
atomically), the decoded pixels against the per-image pipeline, CIFAR-size folders, ``predict_dir`` with an
anti-aliased eval resize, and the default number of loader workers."""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from PIL import Image

from vit.data import (
    CIFAR10_CLASSES,
    DATASETS,
    DataError,
    DecodedLoader,
    DecodedSplit,
    ImageDataModule,
    build_transforms,
    default_num_workers,
)
from vit.data import decoded as decoded_module
from vit.data.decoded import CACHE_FOLDER, load_cache

CIFAR10_MINI = Path(__file__).resolve().parents[2] / "shared/data/cifar10-mini"


def _folder(root: Path, size: int = 32, per_class: int = 4, classes: tuple[str, ...] = ("cat", "dog")) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in classes:
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{i}.png")
    return root


def _dm(root: Path, **kwargs: object) -> ImageDataModule:
    defaults: dict[str, object] = {"img_size": 32, "batch_size": 4, "num_workers": 0, "pin_memory": False}
    return ImageDataModule("imagefolder", data_dir=str(root), **{**defaults, **kwargs})  # type: ignore[arg-type]


def _cache_files(root: Path) -> list[Path]:
    return sorted((root / CACHE_FOLDER).glob("*.pt"))


# ------------------------------------------------------------------------------------------------------ cache
def test_split_is_decoded_once_and_read_back_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _folder(tmp_path / "data")
    dm = _dm(root)
    dm.setup("fit")
    files = _cache_files(root)
    assert [f.name.split("-")[:2] for f in files] == [["train", "32px"], ["val", "32px"]]
    first = dm.train_dataset
    assert isinstance(first, DecodedSplit) and first.images.shape == (8, 3, 32, 32)
    # the decoded pixels are the files' pixels, in the listing's order (cat 0-3, then dog 0-3)
    expected = np.asarray(Image.open(root / "train/dog/1.png")).transpose(2, 0, 1)
    assert np.array_equal(first.images[5].numpy(), expected) and first.labels.tolist() == [0] * 4 + [1] * 4

    def no_decoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("decoded again although a valid cache exists")

    monkeypatch.setattr(decoded_module, "decode_files", no_decoding)
    again = _dm(root)
    again.setup("fit")
    assert torch.equal(again.train_dataset.images, first.images)


def test_prepare_data_decodes_into_the_cache_the_other_processes_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_trainer
) -> None:
    # Lightning calls prepare_data on one process per node and setup on every process after it: under DDP only the
    # first decodes. Fitting needs both splits; testing needs the train split too, for a folder's own statistics.
    root = _folder(tmp_path / "data")
    trainer = cpu_trainer()
    trainer.state.fn = "test"
    first = _dm(root)
    first.trainer = trainer
    first.prepare_data()
    assert [f.name.split("-")[0] for f in _cache_files(root)] == ["train", "val"]
    assert isinstance(first.val_dataset, DecodedSplit)

    def no_decoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("another process decoded the files again")

    monkeypatch.setattr(decoded_module, "decode_files", no_decoding)
    other = _dm(root)
    other.setup("fit")
    assert other.train_dataset.images.shape == (8, 3, 32, 32) and other.mean == first.mean


def test_a_changed_folder_gets_a_new_cache(tmp_path: Path) -> None:
    root = _folder(tmp_path / "data")
    _dm(root).setup("fit")
    before = {f.name for f in _cache_files(root)}
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(root / "train/cat/new.png")
    dm = _dm(root)
    dm.setup("fit")
    after = {f.name for f in _cache_files(root)}
    assert len(dm.train_dataset) == 9
    assert len(after - before) == 1 and next(iter(after - before)).startswith("train-")  # val's listing is unchanged
    assert len(_dm(root, img_size=16).setup("fit") or _cache_files(root)) == 5  # another size, other files


@pytest.mark.parametrize("damage", ["truncate", "flip_pixel", "garbage"])
def test_a_corrupt_cache_is_rebuilt_never_trusted(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = _folder(tmp_path / "data")
    dm = _dm(root)
    dm.setup("fit")
    good = dm.train_dataset.images.clone()
    path = next(f for f in _cache_files(root) if f.name.startswith("train-"))
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        path.write_text("not a cache")
    else:  # a valid file whose pixels no longer match their checksum
        state = torch.load(path, weights_only=True)
        state["images"][0, 0, 0, 0] ^= 1
        torch.save(state, path)
    assert load_cache(path) is None and "ignoring the decoded-image cache" in caplog.text
    rebuilt = _dm(root)
    rebuilt.setup("fit")
    assert torch.equal(rebuilt.train_dataset.images, good)
    assert load_cache(path) is not None  # rewritten whole


def test_cache_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _folder(tmp_path / "data")

    def crash(obj: object, f: object) -> None:
        f.write(b"half a file")  # type: ignore[attr-defined]
        raise KeyboardInterrupt

    monkeypatch.setattr(decoded_module.torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        _dm(root).setup("fit")
    assert list((root / CACHE_FOLDER).iterdir()) == []  # no cache and no temporary file left behind


def test_read_only_data_stays_untouched_and_cache_dir_is_used(tmp_path: Path) -> None:
    root = _folder(tmp_path / "data")
    root.chmod(0o555)
    try:
        dm = _dm(root)
        dm.setup("fit")
        assert not (root / CACHE_FOLDER).exists() and len(dm.train_dataset) == 8
        elsewhere = tmp_path / "cache"
        _dm(root, cache_dir=str(elsewhere)).setup("fit")
        assert len(list((elsewhere / CACHE_FOLDER).glob("*.pt"))) == 2
    finally:
        root.chmod(0o755)


# --------------------------------------------------------------------------------------- what gets decoded
def test_cifar_size_folder_gets_the_cifar_preset_and_its_own_statistics(tmp_path: Path) -> None:
    root = _folder(tmp_path / "data")
    dm = _dm(root)
    assert dm.preset == "cifar" and dm.decoded
    dm.setup("fit")
    pixels = dm.train_dataset.images.double() / 255
    expected_mean = pixels.mean((0, 2, 3))
    expected_std = pixels.transpose(0, 1).reshape(3, -1).std(1, unbiased=False)
    np.testing.assert_allclose(dm.mean, expected_mean.numpy(), atol=1e-4)
    np.testing.assert_allclose(dm.std, expected_std.numpy(), atol=1e-4)
    per_image = _dm(root, decode_once=False)  # the per-image path gets the same statistics and preset
    assert per_image.preset == "cifar" and (per_image.mean, per_image.std) == (dm.mean, dm.std)
    given = _dm(root, mean=(0.5, 0.4, 0.3), std=(0.2, 0.2, 0.2))
    assert given.mean == (0.5, 0.4, 0.3) and given.std == (0.2, 0.2, 0.2)
    big = _dm(_folder(tmp_path / "big", size=80), img_size=64)
    assert big.preset == "imagenet" and not big.decoded and big.mean == (0.485, 0.456, 0.406)


def test_decoded_eval_batches_equal_the_per_image_eval_pipeline(tmp_path: Path) -> None:
    root = _folder(tmp_path / "data", size=40)  # 40 px files resized to 24: the same resize both ways
    a = _dm(root, img_size=24, batch_size=16, mean=(0.5,) * 3, std=(0.25,) * 3)
    b = _dm(root, img_size=24, batch_size=16, mean=(0.5,) * 3, std=(0.25,) * 3, decode_once=False)
    (xa, ya), (xb, yb) = next(iter(a.val_dataloader())), next(iter(b.val_dataloader()))
    assert isinstance(a.val_dataloader(), DecodedLoader) and not isinstance(b.val_dataloader(), DecodedLoader)
    assert xa.dtype == xb.dtype == torch.uint8 and torch.equal(xa, xb) and torch.equal(ya, yb)


def test_every_dataset_kind_is_one_spec_entry() -> None:
    assert sorted(DATASETS) == sorted(
        ["cifar10", "cifar100", "digits", "imagefolder", "imagenet", "streaming", "synthetic"]
    )
    assert DATASETS["streaming"].streaming and DATASETS["streaming"].decodable  # shards of small images too
    assert DATASETS["cifar10"].preset == "cifar" and DATASETS["imagefolder"].preset is None
    assert DATASETS["cifar100"].num_classes == 100 and not DATASETS["synthetic"].decodable


def test_cifar10_mini_decoded_once(tmp_path: Path) -> None:
    if not CIFAR10_MINI.is_dir():
        pytest.skip(f"{CIFAR10_MINI} is absent (it lives in the shared workspace, not in a clone)")
    dm = _dm(CIFAR10_MINI, cache_dir=str(tmp_path), batch_size=100)
    assert dm.class_names == CIFAR10_CLASSES and dm.preset == "cifar"
    dm.setup("fit")
    assert dm.train_dataset.images.shape == (1000, 3, 32, 32) and len(dm.val_dataset) == 300
    assert all(abs(m - c) < 0.05 for m, c in zip(dm.mean, (0.4914, 0.4822, 0.4465), strict=True))  # CIFAR-like
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (100, 3, 32, 32) and x.dtype == torch.uint8 and len(set(y.tolist())) > 5


# -------------------------------------------------------------------------------------------------- predict
def _digit_files(root: Path) -> tuple[Path, Path]:
    from sklearn.datasets import load_digits

    digit = np.round(load_digits().images[3] * 255 / 16).astype(np.uint8)
    root.mkdir(parents=True)
    (root / "nested").mkdir()
    Image.fromarray(digit).save(root / "small.png")
    Image.fromarray(digit).resize((64, 64), Image.Resampling.BICUBIC).save(root / "nested/large.png")
    return root / "small.png", root / "nested/large.png"


def test_predict_dir_lists_images_recursively_through_the_eval_transform(tmp_path: Path) -> None:
    small, large = _digit_files(tmp_path / "photos")
    (tmp_path / "photos/notes.txt").write_text("not an image")
    dm = ImageDataModule("digits", img_size=16, batch_size=8, num_workers=0, predict_dir=str(tmp_path / "photos"))
    assert dm.predict_paths == [str(large), str(small)]  # sorted paths
    (x, y), *rest = list(dm.predict_dataloader())
    assert not rest and x.shape == (2, 3, 16, 16) and x.dtype == torch.uint8 and y.tolist() == [-1, -1]
    transform = build_transforms("digits", 16, False, normalize=False)
    assert torch.equal(x[1], transform(image=np.asarray(Image.open(small).convert("RGB")))["image"])
    # The 64 x 64 copy and the 8 x 8 original give nearly the same model input: the downscale anti-aliases.
    difference = (x[0].float() - x[1].float()).abs().mean() / 255
    import albumentations as A

    unfiltered = A.Resize(16, 16)(image=np.asarray(Image.open(large).convert("RGB")))["image"].transpose(2, 0, 1)
    unfiltered_difference = (torch.from_numpy(unfiltered).float() - x[1].float()).abs().mean() / 255
    assert difference < 0.03 and difference < unfiltered_difference, (difference, unfiltered_difference)


def test_eval_downscale_anti_aliases() -> None:
    # A one-pixel checkerboard shrunk 4x is flat gray when averaged; sampling without a filter gives black or white.
    board = ((np.indices((64, 64)).sum(0) % 2) * 255).astype(np.uint8)
    image = np.repeat(board[:, :, None], 3, axis=2)
    for preset in ("cifar", "digits", "imagenet"):
        out = build_transforms(preset, 16, False, normalize=False)(image=image)["image"]
        assert out.shape == (3, 16, 16) and (out.int() - 127).abs().max() <= 3, preset  # 64 -> 18 px: ripple


@pytest.mark.parametrize("content", [b"this is text, saved as an image", b"", b"\x89PNG\r\n\x1a\n" + b"\x00" * 20])
def test_a_file_that_is_not_an_image_is_named(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos/x.png").write_bytes(content)
    dm = ImageDataModule("digits", img_size=16, num_workers=0, predict_dir=str(tmp_path / "photos"))
    with pytest.raises(DataError, match=r"cannot read image .*photos/x\.png") as err:
        list(dm.predict_dataloader())
    assert "BytesIO" not in str(err.value)


def test_predict_dir_skips_unreadable_files_keeping_paths_aligned(tmp_path: Path) -> None:
    small, large = _digit_files(tmp_path / "photos")
    (tmp_path / "photos/bad.png").write_text("text")
    dm = ImageDataModule("digits", img_size=16, num_workers=0, predict_dir=str(tmp_path / "photos"), skip_corrupt=True)
    with pytest.warns(UserWarning, match=r"skipping unreadable image .*bad\.png"):
        assert dm.predict_paths == [str(large), str(small)]
    (x, y), *rest = list(dm.predict_dataloader())
    assert not rest and len(x) == 2


def test_predict_dir_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"does not exist"):
        _ = ImageDataModule("digits", predict_dir=str(tmp_path / "nowhere")).predict_paths
    with pytest.raises(DataError, match=r"no image files"):
        _ = ImageDataModule("digits", predict_dir=str(tmp_path)).predict_paths


# -------------------------------------------------------------------------------------------------- workers
@pytest.mark.parametrize(("cpus", "expected"), [(1, 1), (2, 1), (4, 3), (16, 8), (64, 8)])
def test_worker_default_fits_the_machine(monkeypatch: pytest.MonkeyPatch, cpus: int, expected: int) -> None:
    import lightning.fabric.utilities.data as fabric_data

    monkeypatch.setattr(fabric_data, "_num_cpus_available", lambda: cpus)
    assert default_num_workers() == expected
    assert ImageDataModule("synthetic").num_workers == expected


def test_no_worker_warning_on_this_machine(cpu_trainer) -> None:
    dm = ImageDataModule("synthetic", img_size=8, batch_size=4, synthetic_size=8, pin_memory=False)
    trainer = cpu_trainer(max_steps=1, limit_val_batches=1)

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(3 * 8 * 8, 10)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(self.fc(batch[0].flatten(1)), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Tiny(), datamodule=dm)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "worker" in m.lower()], messages


def test_a_split_too_large_at_img_size_is_stored_small_and_enlarged_per_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CIFAR fine-tuned at 224 px would be 7.5 GB decoded at 224: it is stored at 32 px and enlarged on the device.
    monkeypatch.setattr(decoded_module, "MAX_DECODED_BYTES", 1000)
    root = _folder(tmp_path / "data", size=32)
    dm = _dm(root, img_size=48, batch_size=8)
    dm.setup("fit")
    assert dm.train_dataset.images.shape == (8, 3, 32, 32)
    x, _ = next(iter(dm.val_dataloader()))
    reference, _ = next(iter(_dm(root, img_size=48, batch_size=8, decode_once=False).val_dataloader()))
    assert x.shape == reference.shape == (8, 3, 48, 48)
    assert (x.int() - reference.int()).abs().max() <= 1  # OpenCV's fixed-point bilinear vs torch's float one
    train, _ = next(iter(dm.train_dataloader()))
    assert train.shape == (8, 3, 48, 48) and train.dtype == torch.uint8
