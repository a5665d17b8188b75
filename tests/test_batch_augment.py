"""Batched augmentation (vit/data/batch_augment.py) against the per-image albumentations preset it replaces: the same
pixels for the same crop offsets and flip, the same distribution of offsets and flips, and the strong ops in range."""

from __future__ import annotations

import albumentations as A
import cv2
import numpy as np
import pytest
import torch

from vit.data import BatchAugment, build_transforms, crop_flip, draw_crop_flip
from vit.data.batch_augment import affine_grid

N_DRAWS = 20_000


def _albumentations_crop_flip(image: np.ndarray, pad: int, top: int, left: int, flip: bool) -> np.ndarray:
    """The preset's ops with the random draws fixed: reflect-101 pad, crop at (top, left), flip."""
    h, w = image.shape[:2]
    ops = [
        A.PadIfNeeded(h + 2 * pad, w + 2 * pad, border_mode=cv2.BORDER_REFLECT_101),
        A.Crop(x_min=left, y_min=top, x_max=left + w, y_max=top + h),
    ]
    if flip:
        ops.append(A.HorizontalFlip(p=1.0))
    return A.Compose(ops)(image=image)["image"]


@pytest.mark.parametrize(("size", "pad"), [(32, 4), (16, 2), (9, 3)])
def test_crop_flip_equals_albumentations_pixel_for_pixel(size: int, pad: int) -> None:
    rng = np.random.default_rng(size)
    images = rng.integers(0, 256, (2, size, size, 3), dtype=np.uint8)
    batch = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    for top in range(2 * pad + 1):
        for left in range(2 * pad + 1):
            for flip in (False, True):
                expected = [_albumentations_crop_flip(image, pad, top, left, flip) for image in images]
                t = torch.tensor([top, left]), torch.tensor([left, top]), torch.tensor([flip, not flip])
                got = crop_flip(batch, *t, pad).permute(0, 2, 3, 1).numpy()
                np.testing.assert_array_equal(got[0], expected[0])
                other = _albumentations_crop_flip(images[1], pad, left, top, not flip)
                np.testing.assert_array_equal(got[1], other)


def _albumentations_offsets(size: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Crop offsets and flips the preset itself draws, read back from an image whose pixels are their coordinates."""
    pad = size // 8
    transform = build_transforms("cifar", size, True, augment="basic", seed=0, normalize=False)
    rows, cols = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    image = np.stack([rows, cols, np.zeros_like(rows)], -1).astype(np.uint8)
    seqs = {t: [_reflect(t - pad + i, size) for i in range(size)] for t in range(2 * pad + 1)}
    tops, lefts, flips = [], [], []
    for _ in range(n):
        out = transform(image=image)["image"].numpy()
        tops.append(next(t for t, seq in seqs.items() if out[0, :, 0].tolist() == seq))
        col = out[1, 0].tolist()
        flip = col not in seqs.values()
        lefts.append(next(t for t, seq in seqs.items() if (col[::-1] if flip else col) == seq))
        flips.append(flip)
    return np.array(tops), np.array(lefts), np.array(flips)


def _reflect(i: int, n: int) -> int:
    i = abs(i)
    return 2 * (n - 1) - i if i >= n else i


def test_crop_offsets_and_flips_have_the_presets_distribution() -> None:
    size, pad = 32, 4
    top, left, flips = (t.numpy() for t in draw_crop_flip(N_DRAWS, pad, torch.Generator().manual_seed(0), "cpu"))
    a_top, a_left, a_flips = _albumentations_offsets(size, 2_000)
    support = set(range(2 * pad + 1))
    assert set(top.tolist()) == set(left.tolist()) == set(a_top.tolist()) == set(a_left.tolist()) == support
    expected = N_DRAWS / len(support)
    for offsets in (top, left):  # uniform: each of the 9 offsets within 5 binomial standard deviations
        counts = np.bincount(offsets, minlength=len(support))
        assert np.abs(counts - expected).max() < 5 * np.sqrt(expected)
    assert abs(flips.mean() - 0.5) < 5 * np.sqrt(0.25 / N_DRAWS)
    assert abs(a_flips.mean() - 0.5) < 5 * np.sqrt(0.25 / len(a_flips))
    assert np.corrcoef(top, left)[0, 1] < 0.05  # independent draws


def test_batch_augment_is_a_function_of_the_generator_seed() -> None:
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    for augment in ("basic", "strong"):
        aug = BatchAugment("cifar", 32, augment, fill=(125, 123, 114))
        a = aug(images, torch.Generator().manual_seed(5))
        b = aug(images, torch.Generator().manual_seed(5))
        c = aug(images, torch.Generator().manual_seed(6))
        assert a.dtype == torch.uint8 and a.shape == images.shape
        assert torch.equal(a, b) and not torch.equal(a, c)
    assert BatchAugment("cifar", 32, "none")(images, torch.Generator()) is images


def test_basic_output_is_a_crop_of_the_padded_image() -> None:
    # Every output is one of the 81 crops x 2 flips of its own image: nothing else happens in `basic`.
    images = torch.randint(0, 256, (16, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    out = BatchAugment("cifar", 16, "basic")(images, torch.Generator().manual_seed(0))
    for image, result in zip(images, out, strict=True):
        candidates = [
            crop_flip(image[None], torch.tensor([t]), torch.tensor([l]), torch.tensor([f]), 2)[0]
            for t in range(5)
            for l in range(5)  # noqa: E741
            for f in (False, True)
        ]
        assert any(torch.equal(result, c) for c in candidates)


def test_strong_cutout_and_gray_happen_at_their_rates() -> None:
    # A flat image: the crop, flip and affine map leave it flat, so what changes is colour, gray, or a Cutout hole.
    n = 2000
    images = torch.tensor([200, 40, 90], dtype=torch.uint8).view(1, 3, 1, 1).expand(n, 3, 32, 32).contiguous()
    out = BatchAugment("cifar", 32, "strong", fill=(0.0, 0.0, 0.0))(images, torch.Generator().manual_seed(0))
    holes = (out == 0).all(1).flatten(1).any(1).float()
    assert abs(holes.mean().item() - 0.5) < 0.05  # CoarseDropout p=0.5
    gray = (out[:, 0] == out[:, 1]) & (out[:, 1] == out[:, 2]) & (out[:, 0] > 0)
    gray_images = gray.flatten(1).float().mean(1) > 0.5
    assert abs(gray_images.float().mean().item() - 0.8 / 3) < 0.05  # OneOf(p=0.8) picks gray a third of the time
    area = (out == 0).all(1).flatten(1).float().sum(1)
    hole_area = area[area > 0] / (32 * 32)
    assert hole_area.min() >= 0.0625 - 1e-6 and hole_area.max() <= 0.25 + 1e-6  # 8..16 px squared of 32 x 32


def test_digits_are_never_mirrored_and_keep_a_black_border() -> None:
    # A digit-like image: one bright column left of centre. Mirroring would move it right of centre.
    images = torch.zeros(500, 3, 16, 16, dtype=torch.uint8)
    images[:, :, 4:12, 4] = 255
    out = BatchAugment("digits", 16, "basic")(images, torch.Generator().manual_seed(0)).float()
    cols = torch.arange(16).float()
    centre_of_mass = (out.sum((1, 2)) * cols).sum(1) / out.sum((1, 2, 3))
    assert (centre_of_mass < 7.5).all()
    assert out[:, :, 0, :].max() == 0  # the top row stays background: zero fill, no reflection


def test_affine_grid_equals_torchs() -> None:
    theta = torch.randn(5, 2, 3, generator=torch.Generator().manual_seed(0))
    expected = torch.nn.functional.affine_grid(theta, [5, 3, 6, 10], align_corners=False)
    torch.testing.assert_close(affine_grid(theta, (6, 10)), expected)


def test_bad_input_is_refused() -> None:
    aug = BatchAugment("cifar", 32)
    with pytest.raises(TypeError, match="uint8"):
        aug(torch.zeros(2, 3, 32, 32), torch.Generator())
    with pytest.raises(ValueError, match="imagenet"):
        BatchAugment("imagenet", 224)


def test_colour_jitter_with_zero_strength_is_the_identity_and_gray_stays_gray() -> None:
    from vit.data.batch_augment import _color_jitter

    x = torch.rand(8, 3, 5, 5, generator=torch.Generator().manual_seed(0)) * 255
    torch.testing.assert_close(_color_jitter(x, torch.Generator().manual_seed(0), 0.0, 0.0), x, atol=1e-3, rtol=0)
    gray = x[:, :1].expand(8, 3, 5, 5)  # a hue rotation and a saturation change leave gray pixels gray
    out = _color_jitter(gray, torch.Generator().manual_seed(1), 0.4, 0.1)
    assert (out.max(1).values - out.min(1).values).max() < 1e-2
