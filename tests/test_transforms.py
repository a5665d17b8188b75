"""vit.data's transforms: shapes, dtypes and ranges, exact normalisation, the ImageNet eval resize and crop, seeded
augmentation, the uint8 pipeline against the float one."""

from __future__ import annotations

import albumentations as A
import numpy as np
import pytest
import torch
from data_samples import random_image

from vit.data import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    DIGITS_MEAN,
    DIGITS_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    build_transforms,
    denormalize,
    normalize,
    seed_transform,
)


# -------------------------------------------------------------------------------------------------- transforms
@pytest.mark.parametrize("preset", ["cifar", "digits", "imagenet"])
@pytest.mark.parametrize("augment", ["none", "basic", "strong"])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("source_hw", [(13, 20), (70, 50)])  # smaller and larger than img_size
def test_transform_shape_dtype_and_normalised_range(
    preset: str, augment: str, train: bool, source_hw: tuple[int, int]
) -> None:
    transform = build_transforms(preset, 24, train, CIFAR10_MEAN, CIFAR10_STD, augment=augment, seed=0)  # type: ignore[arg-type]
    image = random_image(np.random.default_rng(1), *source_hw)
    out = transform(image=image)["image"]
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert out.shape == (3, 24, 24)
    mean, std = torch.tensor(CIFAR10_MEAN).view(3, 1, 1), torch.tensor(CIFAR10_STD).view(3, 1, 1)
    low, high = (0 - mean) / std, (1 - mean) / std  # what [0, 255] maps to
    assert bool(((out >= low - 1e-4) & (out <= high + 1e-4)).all())


@pytest.mark.parametrize("preset", ["cifar", "digits", "imagenet"])
def test_eval_transform_is_deterministic_and_normalises_exactly(preset: str) -> None:
    transform = build_transforms(preset, 16, train=False, mean=IMAGENET_MEAN, std=IMAGENET_STD)  # type: ignore[arg-type]
    image = random_image(np.random.default_rng(2), 40, 30)
    assert torch.equal(transform(image=image)["image"], transform(image=image)["image"])
    flat = np.full((40, 30, 3), 128, dtype=np.uint8)  # resizing and cropping keep a constant image constant
    out = transform(image=flat)["image"]
    expected = (128 / 255 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    torch.testing.assert_close(out, expected.view(3, 1, 1).expand(3, 16, 16), atol=1e-5, rtol=0)


def test_imagenet_eval_resizes_shorter_side_then_centre_crops() -> None:
    # Columns hold their own index: after a shorter-side resize of 200 -> 256 (x1.28) and a 224 centre crop,
    # the middle column of the output shows the middle column of the input.
    image = np.repeat(np.tile(np.arange(200, dtype=np.uint8), (200, 1))[..., None], 3, axis=2)
    out = build_transforms("imagenet", 224, train=False, mean=(0, 0, 0), std=(1, 1, 1))(image=image)["image"]
    assert out.shape == (3, 224, 224)
    assert abs(float(out[0, 112, 112]) * 255 - 100) < 1.5
    assert abs(float(out[0, 112, 0]) * 255 - 16 / 1.28) < 1.5  # (256 - 224) / 2 = 16 output pixels cut each side


def test_seeded_train_transform_repeats_and_seeds_differ() -> None:
    image = random_image(np.random.default_rng(3), 32, 32)

    def draws(seed: int) -> list[torch.Tensor]:
        transform = build_transforms("cifar", 32, True, CIFAR10_MEAN, CIFAR10_STD, augment="strong", seed=seed)
        return [transform(image=image)["image"] for _ in range(4)]

    first, again, other = draws(7), draws(7), draws(8)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))
    assert not torch.equal(first[0], first[1])  # one pipeline keeps drawing new augmentations


def test_seed_transform_keeps_ops_independent() -> None:
    # albumentations 2.0 Compose(seed=s) seeds every op with the same s, so two p=0.5 ops fire together ~50 % of
    # the time; seed_transform's shared stream must give ~25 %.
    image = np.zeros((2, 2, 3), dtype=np.uint8)
    image[0, 0] = (255, 0, 0)
    transform = A.Compose([A.HorizontalFlip(p=0.5), A.ToGray(p=0.5)])
    seed_transform(transform, 0)
    both = 0
    for _ in range(400):
        out = transform(image=image)["image"]
        flipped, gray = out[0, 1].any(), out[0, 1, 0] == out[0, 1, 1] == out[0, 1, 2]
        both += bool(flipped and gray)
    assert 0.17 < both / 400 < 0.33


def test_digits_train_never_flips() -> None:
    transform = build_transforms("digits", 16, True, DIGITS_MEAN, DIGITS_STD, augment="strong")
    assert not any(isinstance(op, A.HorizontalFlip) for op in transform.transforms)
    assert any(isinstance(op, A.Affine) for op in transform.transforms)


def test_denormalize_inverts_normalisation() -> None:
    image = random_image(np.random.default_rng(4), 16, 16)
    out = build_transforms("cifar", 16, False, CIFAR10_MEAN, CIFAR10_STD)(image=image)["image"]
    back = denormalize(out[None], CIFAR10_MEAN, CIFAR10_STD)[0]
    torch.testing.assert_close(back, torch.from_numpy(image).permute(2, 0, 1).float() / 255, atol=1e-5, rtol=0)


@pytest.mark.parametrize("preset", ["cifar", "digits", "imagenet"])
@pytest.mark.parametrize("augment", ["none", "basic", "strong"])
def test_uint8_pipeline_then_normalize_equals_the_float_pipeline(preset: str, augment: str) -> None:
    # normalize=False drops only A.Normalize: the same seed draws the same augmentations, and normalize() on the
    # uint8 output gives A.Normalize's values.
    image = random_image(np.random.default_rng(5), 40, 30)
    full = build_transforms(preset, 24, True, CIFAR10_MEAN, CIFAR10_STD, augment, seed=3)  # type: ignore[arg-type]
    raw = build_transforms(preset, 24, True, CIFAR10_MEAN, CIFAR10_STD, augment, seed=3, normalize=False)  # type: ignore[arg-type]
    for _ in range(3):
        expected, out = full(image=image)["image"], raw(image=image)["image"]
        assert out.dtype == torch.uint8 and out.shape == (3, 24, 24)
        torch.testing.assert_close(normalize(out, CIFAR10_MEAN, CIFAR10_STD), expected, atol=1e-6, rtol=0)


def test_normalize_values_passthrough_and_bad_dtype() -> None:
    images = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 3, 1, 1).expand(2, 3, 2, 2)
    out = normalize(images, (0.5, 0.2, 0.0), (0.5, 0.4, 2.0))
    expected = torch.tensor([(0 - 0.5) / 0.5, (0.2 - 0.2) / 0.4, (1.0 - 0.0) / 2.0]).view(1, 3, 1, 1)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected.expand(2, 3, 2, 2), atol=1e-6, rtol=0)
    assert normalize(out, (0.5,) * 3, (0.5,) * 3) is out  # already normalised: unchanged
    with pytest.raises(TypeError, match="uint8 images in \\[0, 255\\], got torch.int16"):
        normalize(images.to(torch.int16), (0.5,) * 3, (0.5,) * 3)
