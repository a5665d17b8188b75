"""vit.data's built-in datasets and its data module: digits and synthetic images, class counts before setup, seeds
that repeat the first batch (with workers too) and differ per worker, loader settings, the constructor as
jsonargparse reads it, and the CIFAR-10 JPEGs on disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from data_samples import CIFAR10_MINI, random_image, small_datamodule
from torch.utils.data import DataLoader

from vit.data import (
    CIFAR10_CLASSES,
    CIFAR10_MEAN,
    CIFAR10_STD,
    DIGITS_MEAN,
    DIGITS_STD,
    ArrayDataset,
    DataError,
    ImageDataModule,
    SyntheticDataset,
    build_transforms,
    denormalize,
    seed_worker,
)


# ----------------------------------------------------------------------------------------- digits, synthetic
def test_digits_split_sizes_labels_and_pixels() -> None:
    dm = small_datamodule("digits", img_size=16, batch_size=32)
    assert dm.num_classes == 10 and dm.class_names == [str(d) for d in range(10)]
    dm.setup("fit")
    assert len(dm.train_dataset) == 1437 and len(dm.val_dataset) == 360
    counts = np.bincount(dm.val_dataset.labels, minlength=10)
    assert counts.sum() == 360 and counts.min() >= 35 and counts.max() <= 37  # stratified
    assert dm.train_dataset.images.shape == (1437, 3, 16, 16)  # decoded once, at img_size
    raw = small_datamodule("digits", img_size=16, decode_once=False)
    raw.setup("fit")
    images = raw.train_dataset.images
    assert images.shape == (1437, 8, 8, 3) and images.dtype == np.uint8 and images.max() == 255
    all_pixels = np.concatenate([images, raw.val_dataset.images]) / 255
    assert abs(all_pixels.mean() - DIGITS_MEAN[0]) < 1e-3 and abs(all_pixels.std() - DIGITS_STD[0]) < 1e-3
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (32, 3, 16, 16) and y.dtype == torch.int64


def test_synthetic_is_deterministic_per_index() -> None:
    a, b = SyntheticDataset(8, 5, 16, seed=3), SyntheticDataset(8, 5, 16, seed=3)
    image, label = a[6]
    assert image.shape == (16, 16, 3) and image.dtype == np.uint8 and 0 <= label < 5
    assert np.array_equal(image, b[6][0]) and label == b[6][1]
    assert not np.array_equal(image, SyntheticDataset(8, 5, 16, seed=4)[6][0])
    assert not np.array_equal(image, SyntheticDataset(8, 5, 16, seed=3, offset=8)[6][0])
    with pytest.raises(IndexError):
        a[8]


def test_synthetic_any_size_and_class_count() -> None:
    dm = small_datamodule("synthetic", img_size=96, synthetic_num_classes=7, synthetic_size=24, batch_size=8)
    assert dm.num_classes == 7 and len(dm.class_names) == 7 and dm.preset == "imagenet"
    dm.setup("fit")
    assert len(dm.train_dataset) == 24 and len(dm.val_dataset) == 6
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 3, 96, 96) and int(y.max()) < 7
    assert sum(len(y) for _, y in dm.predict_dataloader()) == 6


@pytest.mark.parametrize(
    ("dataset", "expected"), [("cifar10", 10), ("cifar100", 100), ("digits", 10), ("synthetic", 13)]
)
def test_num_classes_is_known_before_setup(dataset: str, expected: int) -> None:
    dm = small_datamodule(dataset, data_dir="/nonexistent", synthetic_num_classes=13)
    assert dm.num_classes == expected and dm.train_dataset is None


# ------------------------------------------------------------------------------------------------- seeding
def _first_batch(seed: int, num_workers: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    dm = small_datamodule(
        "synthetic", seed=seed, augment="strong", synthetic_size=32, batch_size=8, num_workers=num_workers
    )
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


def test_same_seed_gives_the_same_first_batch() -> None:
    x1, y1 = _first_batch(0)
    x2, y2 = _first_batch(0)
    x3, y3 = _first_batch(1)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, x3)


def test_same_seed_repeats_with_workers() -> None:
    x1, y1 = _first_batch(0, num_workers=1)
    x2, y2 = _first_batch(0, num_workers=1)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_workers_draw_different_augmentations() -> None:
    # Four copies of one image, one per batch, alternating between two workers: without seed_worker both workers
    # would start from the same albumentations state and batch 0 would equal batch 1.
    image = random_image(np.random.default_rng(8), 32, 32)
    transform = build_transforms("cifar", 32, True, CIFAR10_MEAN, CIFAR10_STD, augment="strong", seed=0)
    dataset = ArrayDataset(np.stack([image] * 4), [0] * 4, ["only"], transform)

    def run() -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(0)  # worker seeds are drawn from it
        loader = DataLoader(dataset, batch_size=1, num_workers=2, worker_init_fn=seed_worker, generator=generator)
        return [x for x, _ in loader]

    first, second = run(), run()
    assert not torch.equal(first[0], first[1])
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_train_loader_settings() -> None:
    dm = small_datamodule("synthetic", synthetic_size=10, batch_size=4, num_workers=1)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.drop_last and loader.persistent_workers and loader.worker_init_fn is seed_worker
    assert len(loader) == 2  # 10 images, batches of 4, the last 2 dropped
    with pytest.raises(DataError, match=r"fewer than batch_size=64"):
        small_datamodule("synthetic", synthetic_size=10, batch_size=64).train_dataloader()


def test_constructor_is_parsed_by_jsonargparse() -> None:
    from jsonargparse import ArgumentError, ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(ImageDataModule, "data")
    cfg = parser.parse_args(["--data.dataset", "synthetic", "--data.img_size", "48", "--data.augment", "strong"])
    assert cfg.data.dataset == "synthetic" and cfg.data.img_size == 48 and cfg.data.augment == "strong"
    assert "Skip image files that cannot be read" in parser.format_help()
    with pytest.raises(ArgumentError, match="mnist"):
        parser.parse_args(["--data.dataset", "mnist"])


# ---------------------------------------------------------------------------------------- real photographs
def test_cifar10_mini_real_jpegs(tmp_path: Path) -> None:
    if not CIFAR10_MINI.is_dir():
        pytest.skip(f"{CIFAR10_MINI} is absent (it lives in the shared workspace, not in a clone)")
    dm = small_datamodule(
        "imagefolder", data_dir=str(CIFAR10_MINI), img_size=32, batch_size=16, augment="strong", cache_dir=str(tmp_path)
    )
    assert dm.num_classes == 10 and dm.class_names == CIFAR10_CLASSES
    dm.setup("fit")
    assert len(dm.train_dataset) == 1000 and len(dm.val_dataset) == 300
    assert np.bincount(dm.val_dataset.labels).tolist() == [30] * 10
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.uint8
    image = denormalize(dm.normalize(dm.val_dataset[0][0]), dm.mean, dm.std)
    assert float(image.min()) >= 0.0 and float(image.max()) <= 1.0 and float(image.std()) > 0.05
