"""Albumentations 2.x pipelines for uint8 HWC images, ending in a normalised float32 CHW tensor.

Two families of presets:

- CIFAR-style (``"cifar"``, ``"digits"``): resize to ``img_size``, then pad-and-random-crop plus horizontal flip
  (He et al., "Deep Residual Learning for Image Recognition", 2016). Digits are never flipped; they get a small
  random affine instead. ``augment="strong"`` adds a colour/affine ``OneOf`` and Cutout-style ``CoarseDropout``
  (DeVries & Taylor, 2017).
- ImageNet-style (``"imagenet"``): Inception random-resized crop, flip and colour jitter for training
  (Szegedy et al., 2015); resize the shorter side to ``img_size / 0.875`` and centre-crop for evaluation.

Every preset ends in ``A.Normalize`` with the dataset's statistics and ``ToTensorV2``; with ``normalize=False`` it
ends in ``ToTensorV2`` alone and yields uint8 tensors, to be normalised on the accelerator by ``normalize`` (as
``ImageDataModule`` does, and timm's prefetching loader: no float work in the loader workers, a quarter of the bytes
to copy to the device).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Literal

import albumentations as A
import cv2
import numpy as np
from albumentations.pytorch import ToTensorV2

from vit.normalize import IMAGENET_MEAN, IMAGENET_STD

Preset = Literal["cifar", "digits", "imagenet"]
Augment = Literal["none", "basic", "strong"]

EVAL_CROP_FRACTION = 0.875  # ImageNet eval: resize the shorter side to img_size / 0.875, centre-crop img_size


def _cifar_train(img_size: int, strong: bool, fill: tuple[int, ...]) -> list[A.BasicTransform | A.BaseCompose]:
    pad = max(1, img_size // 8)  # 4 pixels at 32x32, scaled with the image
    ops: list[A.BasicTransform | A.BaseCompose] = [
        A.Resize(img_size, img_size, area_for_downscale="image"),
        A.PadIfNeeded(img_size + 2 * pad, img_size + 2 * pad, border_mode=cv2.BORDER_REFLECT_101),
        A.RandomCrop(img_size, img_size),
        A.HorizontalFlip(p=0.5),
    ]
    if strong:
        ops += [
            A.OneOf(
                [
                    A.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, p=1.0),
                    A.Affine(
                        scale=(0.9, 1.1), rotate=(-15, 15), shear=(-10, 10), border_mode=cv2.BORDER_REFLECT_101, p=1.0
                    ),
                    A.ToGray(p=1.0),
                ],
                p=0.8,
            ),
            A.CoarseDropout(
                num_holes_range=(1, 1), hole_height_range=(0.25, 0.5), hole_width_range=(0.25, 0.5), fill=fill
            ),
        ]
    return ops


def _digits_train(img_size: int, strong: bool, fill: tuple[int, ...]) -> list[A.BasicTransform | A.BaseCompose]:
    # No flip: a mirrored 2 or 7 is not a digit. The background is 0, so the affine fills with 0.
    rotate, shear = (15, 10) if strong else (10, 0)
    ops: list[A.BasicTransform | A.BaseCompose] = [
        A.Resize(img_size, img_size, area_for_downscale="image"),
        A.Affine(
            scale=(0.9, 1.1),
            translate_percent=(-0.1, 0.1),
            rotate=(-rotate, rotate),
            shear=(-shear, shear),
            border_mode=cv2.BORDER_CONSTANT,
            fill=0,
            p=1.0,
        ),
    ]
    if strong:
        ops.append(
            A.CoarseDropout(
                num_holes_range=(1, 2), hole_height_range=(0.1, 0.25), hole_width_range=(0.1, 0.25), fill=fill
            )
        )
    return ops


def _imagenet_train(img_size: int, strong: bool, fill: tuple[int, ...]) -> list[A.BasicTransform | A.BaseCompose]:
    # RandomResizedCrop resizes whatever region it cuts, so images smaller than img_size are scaled up, not refused.
    ops: list[A.BasicTransform | A.BaseCompose] = [
        A.RandomResizedCrop(size=(img_size, img_size), scale=(0.08, 1.0), interpolation=cv2.INTER_CUBIC),
        A.HorizontalFlip(p=0.5),
        A.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.0, p=0.8),
    ]
    if strong:
        ops += [
            A.OneOf([A.ToGray(p=1.0), A.GaussianBlur(sigma_limit=(0.1, 2.0), p=1.0)], p=0.2),
            A.CoarseDropout(
                num_holes_range=(1, 1), hole_height_range=(0.1, 0.4), hole_width_range=(0.1, 0.4), fill=fill, p=0.25
            ),
        ]
    return ops


def _cifar_eval(img_size: int) -> list[A.BasicTransform | A.BaseCompose]:
    # Area averaging when shrinking (anti-aliased: a 64x64 copy of a digit gives the input of its 8x8 original),
    # bilinear when enlarging; vit.data.decoded resizes with the same op.
    return [A.Resize(img_size, img_size, area_for_downscale="image")]


def _imagenet_eval(img_size: int) -> list[A.BasicTransform | A.BaseCompose]:
    # SmallestMaxSize scales up as well as down, so CenterCrop always has enough pixels.
    resize = math.floor(img_size / EVAL_CROP_FRACTION)
    # Area averaging when shrinking (anti-aliased), bicubic when enlarging.
    return [
        A.SmallestMaxSize(max_size=resize, interpolation=cv2.INTER_CUBIC, area_for_downscale="image"),
        A.CenterCrop(img_size, img_size),
    ]


_TRAIN_OPS: dict[str, Callable[[int, bool, tuple[int, ...]], list[A.BasicTransform | A.BaseCompose]]] = {
    "cifar": _cifar_train,
    "digits": _digits_train,
    "imagenet": _imagenet_train,
}
_EVAL_OPS: dict[str, Callable[[int], list[A.BasicTransform | A.BaseCompose]]] = {
    "cifar": _cifar_eval,
    "digits": _cifar_eval,
    "imagenet": _imagenet_eval,
}


def build_transforms(
    preset: Preset,
    img_size: int,
    train: bool,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    augment: Augment = "basic",
    seed: int | None = None,
    normalize: bool = True,
) -> A.Compose:
    """Build a train or eval pipeline: uint8 HWC numpy image in, normalised float32 CHW tensor out (uint8 CHW with
    ``normalize=False``).

    Call it as ``transform(image=array)["image"]``.

    Args:
        preset: ``"cifar"`` (pad-and-crop, flip), ``"digits"`` (small affine, no flip) or ``"imagenet"``
            (random-resized crop, flip, colour jitter; shorter-side resize + centre crop for eval).
        img_size: Output height and width in pixels.
        train: Build the random training pipeline; otherwise the deterministic eval pipeline.
        mean: Per-channel mean in [0, 1] used by ``A.Normalize``.
        std: Per-channel standard deviation in [0, 1] used by ``A.Normalize``.
        augment: ``"none"`` gives the eval pipeline even when ``train`` is true, ``"basic"`` the standard recipe,
            ``"strong"`` adds colour/affine ops and ``CoarseDropout``.
        seed: Seed of the pipeline's random stream (see ``seed_transform``); ``None`` draws fresh entropy.
        normalize: End in ``A.Normalize`` (float32 out). ``False`` leaves the uint8 CHW tensor for ``normalize``
            to finish on the device; ``mean`` then still sets the fill of ``CoarseDropout``.
    """
    if img_size < 1:
        raise ValueError(f"img_size must be positive, got {img_size}")
    if train and augment != "none":
        fill = tuple(int(round(255 * m)) for m in mean)  # dropped pixels become ~0 after normalisation
        ops = _TRAIN_OPS[preset](img_size, augment == "strong", fill)
    else:
        ops = _EVAL_OPS[preset](img_size)
    if normalize:
        ops.append(A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=255.0))
    ops.append(ToTensorV2())
    transform = A.Compose(ops)
    if seed is not None:
        seed_transform(transform, seed)
    return transform


def seed_transform(transform: A.BaseCompose, seed: int) -> None:
    """Reseed a pipeline so that all of its ops draw from one shared random stream.

    albumentations 2.0 ``A.Compose(seed=s)`` gives every child op its own generator seeded with the same ``s``,
    so the ops' random decisions are correlated (a flip with p=0.5 and a grayscale with p=0.5 then fire together
    half the time instead of a quarter). One shared stream keeps them independent and still reproducible.

    Args:
        transform: The pipeline to reseed, e.g. the output of ``build_transforms``.
        seed: Any non-negative integer.
    """
    transform.set_random_state(np.random.default_rng(seed), random.Random(seed))
