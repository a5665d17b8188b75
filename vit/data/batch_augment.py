"""Batched augmentation of uint8 image tensors, in torch, on whatever device holds them.

The batched twin of the CIFAR-style albumentations presets of :mod:`vit.data.transforms`, for data decoded once
(:mod:`vit.data.decoded`): one call augments a whole ``(B, 3, H, W)`` batch, with no Python loop over images and no
host synchronisation, so it runs at memory speed on a GPU and at tens of thousands of images per second per CPU core.

- ``basic``: reflect-101 padding by ``img_size // 8`` and a random crop back to ``img_size`` (He et al., "Deep Residual
  Learning for Image Recognition", 2016), then a horizontal flip with probability 0.5; one gather does all three. Given
  the same offsets and flip, the result equals albumentations' ``PadIfNeeded(BORDER_REFLECT_101) + RandomCrop +
  HorizontalFlip`` pixel for pixel.
- ``strong`` adds, like the albumentations preset: with probability 0.8 one of colour jitter, a random affine map
  (scale, rotation, shear) or grayscale, then Cutout (DeVries & Taylor, 2017) with probability 0.5. These match the
  preset in their parameter ranges, not pixel for pixel (bilinear ``grid_sample`` instead of OpenCV's warp, hue shifted
  by a rotation in YIQ space).
- ``digits``: no flip (a mirrored 2 is not a digit), a random affine map with translation and a black border instead.

Every random draw comes from the ``generator`` passed in, in a fixed order and number whatever ops end up applied, so
a batch's augmentation is a function of that generator's seed. Mixup/CutMix are not here: they stay timm's, in the
Lightning module.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

from vit.data.transforms import Augment, Preset

_GRAY = (0.299, 0.587, 0.114)  # ITU-R BT.601 luma, as OpenCV's RGB2GRAY used by albumentations


@functools.lru_cache(maxsize=16)
def _constant(values: tuple, device: torch.device) -> torch.Tensor:
    # Cached per device: building it from a Python list every step would be a host-to-device copy per step.
    return torch.tensor(values, dtype=torch.float32, device=device)


_YIQ = ((0.299, 0.587, 0.114), (0.596, -0.274, -0.322), (0.211, -0.523, 0.312))
_YIQ_INV = tuple(tuple(float(v) for v in row) for row in np.linalg.inv(np.array(_YIQ)))  # no linalg call per step


def _uniform(n: int, low: float, high: float, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.rand(n, generator=generator, device=device) * (high - low) + low


def _reflect_101(index: torch.Tensor, size: int) -> torch.Tensor:
    # OpenCV's BORDER_REFLECT_101 (dcb|abcd|cba), valid for offsets shorter than the image
    index = index.abs()
    return torch.where(index >= size, 2 * (size - 1) - index, index)


def draw_crop_flip(
    batch: int, pad: int, generator: torch.Generator, device: torch.device, flip: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random crop offsets and flips for a batch: offsets uniform over ``0..2*pad``, flips with probability 0.5.

    Args:
        batch: Number of images.
        pad: Padding on each side before the crop.
        generator: Source of the draws (on ``device``).
        device: Where the draws are made.
        flip: Draw flips; ``False`` returns no flips (the draws are made all the same, keeping the stream aligned).

    Returns:
        ``(top, left, flips)``: int64 offsets into the padded image and a bool flip mask, each ``(batch,)``.
    """
    top = torch.randint(0, 2 * pad + 1, (batch,), generator=generator, device=device)
    left = torch.randint(0, 2 * pad + 1, (batch,), generator=generator, device=device)
    flips = torch.rand(batch, generator=generator, device=device) < 0.5
    return top, left, flips & flip


def crop_flip(
    images: torch.Tensor, top: torch.Tensor, left: torch.Tensor, flips: torch.Tensor, pad: int
) -> torch.Tensor:
    """Reflect-101 pad by ``pad``, crop ``H x W`` at ``(top, left)`` of the padded image, mirror where ``flips``.

    Args:
        images: (B, C, H, W) tensor of any dtype.
        top: (B,) row offsets in ``0..2*pad``.
        left: (B,) column offsets in ``0..2*pad``.
        flips: (B,) bool, mirror left-right after the crop.
        pad: Padding on each side, smaller than H and W.
    """
    B, C, H, W = images.shape
    rows = _reflect_101(torch.arange(H, device=images.device) + (top - pad)[:, None], H)  # (B, H)
    cols = torch.arange(W, device=images.device).expand(B, W)
    cols = torch.where(flips[:, None], cols.flip(-1), cols)
    cols = _reflect_101(cols + (left - pad)[:, None], W)  # (B, W)
    index = (rows[:, :, None] * W + cols[:, None, :]).view(B, 1, H * W).expand(B, C, H * W)
    return images.reshape(B, C, H * W).gather(2, index).view(B, C, H, W)


def _affine_grid(
    batch: int,
    size: tuple[int, int],
    generator: torch.Generator,
    device: torch.device,
    *,
    scale: float,
    rotate: float,
    shear: float,
    translate: float,
) -> torch.Tensor:
    # One random affine map per image, drawn in a fixed order: scale, rotation, shear x/y, translation x/y.
    s = _uniform(batch, 1 - scale, 1 + scale, generator, device)
    angle = torch.deg2rad(_uniform(batch, -rotate, rotate, generator, device))
    shx = torch.tan(torch.deg2rad(_uniform(batch, -shear, shear, generator, device)))
    shy = torch.tan(torch.deg2rad(_uniform(batch, -shear, shear, generator, device)))
    t = _uniform(2 * batch, -2 * translate, 2 * translate, generator, device).view(2, batch)  # grid units: 2 = width
    cos, sin = torch.cos(angle), torch.sin(angle)
    # forward map A = R @ Sh @ S; grid_sample wants output -> input, the inverse
    a = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)  # (B, 2, 2)
    sh = torch.stack([torch.stack([torch.ones_like(shx), shx], -1), torch.stack([shy, torch.ones_like(shy)], -1)], -2)
    forward = a @ sh * s[:, None, None]
    det = forward[:, 0, 0] * forward[:, 1, 1] - forward[:, 0, 1] * forward[:, 1, 0]
    inverse = torch.stack(
        [
            torch.stack([forward[:, 1, 1], -forward[:, 0, 1]], -1),
            torch.stack([-forward[:, 1, 0], forward[:, 0, 0]], -1),
        ],
        -2,
    ) / det.view(-1, 1, 1)
    theta = torch.cat([inverse, -(inverse @ t.T[:, :, None])], dim=2)  # (B, 2, 3)
    return affine_grid(theta, size)


def affine_grid(theta: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``F.affine_grid(theta, (B, C, *size), align_corners=False)`` written out: 4x faster on a CPU core.

    Args:
        theta: (B, 2, 3) maps from output to input coordinates in [-1, 1].
        size: Output height and width.
    """
    H, W = size
    device = theta.device
    ys = ((torch.arange(H, device=device) * 2 + 1) / H - 1).view(1, H, 1)
    xs = ((torch.arange(W, device=device) * 2 + 1) / W - 1).view(1, 1, W)
    gx = theta[:, 0, 0, None, None] * xs + theta[:, 0, 1, None, None] * ys + theta[:, 0, 2, None, None]
    gy = theta[:, 1, 0, None, None] * xs + theta[:, 1, 1, None, None] * ys + theta[:, 1, 2, None, None]
    return torch.stack([gx, gy], -1)  # (B, H, W, 2)


def _color_jitter(x: torch.Tensor, generator: torch.Generator, strength: float, hue: float) -> torch.Tensor:
    # Brightness, contrast, saturation factors in [1 - strength, 1 + strength] and a hue shift in [-hue, hue] turns,
    # applied in that order as one affine colour map per image (one clamp at the end, not one per op).
    B, C, H, W = x.shape
    b, c, s = (_uniform(B, 1 - strength, 1 + strength, generator, x.device) for _ in range(3))
    h = _uniform(B, -hue, hue, generator, x.device) * (2 * math.pi)
    luma = _constant(_GRAY, x.device)
    mean = (x.mean((2, 3)) @ luma) * b  # (B,) mean gray level after the brightness change
    eye = torch.eye(3, device=x.device)
    saturation = s.view(B, 1, 1) * eye + (1 - s).view(B, 1, 1) * luma.view(1, 1, 3)  # blend with the gray image
    to_yiq = _constant(_YIQ, x.device)
    cos, sin = torch.cos(h), torch.sin(h)
    rotation = torch.zeros(B, 3, 3, device=x.device)
    rotation[:, 0, 0] = 1
    rotation[:, 1, 1], rotation[:, 1, 2], rotation[:, 2, 1], rotation[:, 2, 2] = cos, -sin, sin, cos
    colour = _constant(_YIQ_INV, x.device) @ rotation @ to_yiq @ saturation  # (B, 3, 3)
    offset = colour.sum(2) * ((1 - c) * mean).view(B, 1)  # the contrast blend's constant, through the colour map
    y = torch.baddbmm(offset.view(B, 3, 1), colour * (b * c).view(B, 1, 1), x.reshape(B, C, H * W))
    return y.view(B, C, H, W).clamp_(0, 255)


def _cutout(
    x: torch.Tensor, generator: torch.Generator, holes: int, size: tuple[float, float], fill: torch.Tensor, p: float
) -> torch.Tensor:
    B, _, H, W = x.shape
    ys = torch.arange(H, device=x.device).view(1, H, 1)
    xs = torch.arange(W, device=x.device).view(1, 1, W)
    on = torch.rand(B, generator=generator, device=x.device) < p
    mask = torch.zeros(B, H, W, dtype=torch.bool, device=x.device)
    for _ in range(holes):
        hh = (_uniform(B, *size, generator, x.device) * H).long().clamp(min=1)
        hw = (_uniform(B, *size, generator, x.device) * W).long().clamp(min=1)
        y0 = (torch.rand(B, generator=generator, device=x.device) * (H - hh + 1)).long()
        x0 = (torch.rand(B, generator=generator, device=x.device) * (W - hw + 1)).long()
        hole = (ys >= y0.view(B, 1, 1)) & (ys < (y0 + hh).view(B, 1, 1))
        hole = hole & (xs >= x0.view(B, 1, 1)) & (xs < (x0 + hw).view(B, 1, 1))
        mask |= hole
    return torch.where((mask & on.view(B, 1, 1))[:, None], fill.view(1, -1, 1, 1), x)


class BatchAugment:
    """The CIFAR-style (or digits) training augmentation for a whole uint8 batch at once.

    Call it as ``aug(images, generator)``: ``images`` is a uint8 ``(B, 3, H, W)`` tensor on any device, ``generator``
    a ``torch.Generator`` on that device; the result is a new uint8 tensor of the same shape.

    Args:
        preset: ``"cifar"`` (pad-and-crop, flip) or ``"digits"`` (random affine with translation, black border).
        img_size: Height and width of the images (sets the padding, ``img_size // 8``, as the albumentations preset).
        augment: ``"none"`` (identity), ``"basic"`` or ``"strong"``.
        fill: Cutout's fill per channel, in [0, 255] (the dataset mean, so holes become ~0 after normalisation).
    """

    def __init__(
        self, preset: Preset, img_size: int, augment: Augment = "basic", fill: tuple[float, ...] = (0.0, 0.0, 0.0)
    ) -> None:
        if preset not in ("cifar", "digits"):
            raise ValueError(f"BatchAugment covers the cifar and digits presets, not {preset!r}")
        self.preset, self.img_size, self.augment = preset, img_size, augment
        self.pad = max(1, img_size // 8)  # 4 pixels at 32x32, as vit.data.transforms
        self.fill = tuple(float(f) for f in fill)

    def __repr__(self) -> str:
        return f"BatchAugment(preset={self.preset!r}, img_size={self.img_size}, augment={self.augment!r})"

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise TypeError(f"BatchAugment expects uint8 (B, C, H, W) images, got {images.dtype} {tuple(images.shape)}")
        if self.augment == "none":
            return images
        if self.preset == "digits":
            return self._digits(images, generator)
        B = images.shape[0]
        top, left, flips = draw_crop_flip(B, self.pad, generator, images.device)
        out = crop_flip(images, top, left, flips, self.pad)
        if self.augment == "strong":
            out = self._strong(out, generator)
        return out

    def _strong(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        B, _, H, W = images.shape
        device = images.device
        x = images.float()
        # A.OneOf([ColorJitter, Affine, ToGray], p=0.8): every branch computed, one kept per image (no host sync)
        apply = torch.rand(B, generator=generator, device=device) < 0.8
        which = torch.randint(0, 3, (B,), generator=generator, device=device)
        jitter = _color_jitter(x, generator, 0.4, 0.1)
        grid = _affine_grid(B, (H, W), generator, device, scale=0.1, rotate=15.0, shear=10.0, translate=0.0)
        warped = F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
        gray = (x * _constant(_GRAY, device).view(1, 3, 1, 1)).sum(1, keepdim=True).expand_as(x)
        choice = torch.stack([jitter, warped, gray])[which, torch.arange(B, device=device)]
        x = torch.where(apply.view(B, 1, 1, 1), choice, x)
        fill = _constant(self.fill, device)
        x = _cutout(x, generator, holes=1, size=(0.25, 0.5), fill=fill, p=0.5)
        return x.round_().clamp_(0, 255).to(torch.uint8)

    def _digits(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        B, _, H, W = images.shape
        strong = self.augment == "strong"
        rotate, shear = (15.0, 10.0) if strong else (10.0, 0.0)
        grid = _affine_grid(B, (H, W), generator, images.device, scale=0.1, rotate=rotate, shear=shear, translate=0.1)
        x = F.grid_sample(images.float(), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        # the dropout draws are made for basic too, so both levels share the affine stream
        dropped = _cutout(x, generator, holes=2, size=(0.1, 0.25), fill=_constant(self.fill, x.device), p=0.5)
        x = dropped if strong else x
        return x.round_().clamp_(0, 255).to(torch.uint8)
