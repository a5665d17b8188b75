"""Small data for the vit.data tests: random images, a small data module, and where the CIFAR-10 JPEGs of the tests
are."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vit.data import (
    ImageDataModule,
)

CIFAR10_MINI = Path(__file__).resolve().parents[2] / "shared/data/cifar10-mini"


def random_image(rng: np.random.Generator, h: int = 12, w: int = 10) -> np.ndarray:
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def small_datamodule(dataset: str, **kwargs: object) -> ImageDataModule:
    defaults: dict[str, object] = {"img_size": 16, "batch_size": 4, "num_workers": 0, "pin_memory": False}
    return ImageDataModule(dataset, **{**defaults, **kwargs})  # type: ignore[arg-type]
