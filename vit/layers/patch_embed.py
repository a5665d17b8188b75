"""Patch embedding: cut an image into non-overlapping patches and project each to ``embed_dim``.

Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021), Sec. 3.1. The convolutional stem option follows
Xiao et al., "Early Convolutions Help Transformers See Better" (NeurIPS 2021).
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Literal

import torch
import torch.nn.functional as F
from timm.layers import ConvNormAct
from torch import nn

from .utils import to_2tuple


@torch.fx.wrap  # a leaf of torch.fx graphs: shapes are known only when they run, and the check runs then
def check_image_size(
    x: torch.Tensor, img_size: tuple[int, int] | None, patch_size: tuple[int, int], padded: bool
) -> torch.Tensor:
    """``x`` itself, once its size ``(H, W)`` is checked: ``img_size`` when it is fixed (not ``None``), and a multiple
    of ``patch_size`` unless the embedding pads (``padded``).

    Raises:
        ValueError: Naming the size and the model option that would accept it.
    """
    H, W = x.shape[-2:]
    if img_size is not None and tuple(img_size) != (H, W):
        raise ValueError(
            f"input image size {(H, W)} does not match the model's img_size {tuple(img_size)}: resize the input, "
            "or build the model with dynamic_img_size=True"
        )
    if not padded and (H % patch_size[0] or W % patch_size[1]):
        raise ValueError(
            f"input image size {(H, W)} is not divisible by the patch size {tuple(patch_size)}: resize the input, "
            "or build the model with dynamic_img_pad=True"
        )
    return x


class PatchEmbed(nn.Module):
    """Image to patch tokens through a convolution with kernel = stride = patch size.

    The parameter is an ``nn.Conv2d`` named ``proj`` (timm's layout), but the forward pass computes the same
    product as one matrix multiply over flattened patches, which is faster than a strided convolution on CPU
    and identical up to float rounding.

    Args:
        img_size: Input image size, an int or ``(height, width)``.
        patch_size: Patch size, an int or ``(height, width)``; must divide ``img_size``.
        in_chans: Number of input channels.
        embed_dim: Output token width.
        bias: Whether the projection has a bias.
        conv_stem: Replace the patchify convolution by Xiao et al.'s stem: ``log2(patch)`` 3x3 stride-2
            convolutions with BatchNorm and ReLU (channels doubling up to ``embed_dim``, timm's ``ConvNormAct``,
            as ``stem``), then ``proj`` as a 1x1 convolution. The tokens keep the same grid.
        dynamic_img_size: Accept any input size divisible by the patch (timm's ``strict_img_size=False``); the grid
            then follows the input.
        dynamic_img_pad: Pad the input at the bottom and right with zeros to a multiple of the patch first (timm).
        output_fmt: ``"NLC"``: tokens ``(B, rows * cols, embed_dim)``; ``"NHWC"``: ``(B, rows, cols, embed_dim)``,
            which keeps the grid of a dynamic size visible (timm's ``output_fmt``).

    Raises:
        ValueError: If the patch size does not divide the image size, or ``conv_stem`` is set with a patch size
            that is not a square power of two.
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        bias: bool = True,
        conv_stem: bool = False,
        dynamic_img_size: bool = False,
        dynamic_img_pad: bool = False,
        output_fmt: Literal["NLC", "NHWC"] = "NLC",
    ) -> None:
        super().__init__()
        if output_fmt not in ("NLC", "NHWC"):
            raise ValueError(f"output_fmt must be 'NLC' or 'NHWC', got {output_fmt!r}")
        self.dynamic_img_size = dynamic_img_size
        self.dynamic_img_pad = dynamic_img_pad
        self.output_fmt = output_fmt
        self.img_size = to_2tuple(img_size)
        self.patch_size = to_2tuple(patch_size)
        for side, size, patch in zip(("height", "width"), self.img_size, self.patch_size, strict=True):
            if patch <= 0 or size <= 0 or size % patch:
                raise ValueError(
                    f"image {side} {size} is not divisible by patch {side} {patch}: choose an img_size that is a "
                    f"multiple of patch_size (img_size={self.img_size}, patch_size={self.patch_size})"
                )
        self.grid_size = (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.in_chans = in_chans
        self.stem: nn.Module | None = None
        if conv_stem:
            patch = self.patch_size[0]
            if self.patch_size[1] != patch or patch < 2 or patch & (patch - 1):
                raise ValueError(
                    f"conv_stem needs a square power-of-two patch size (2, 4, 8, 16, ...), got {self.patch_size}"
                )
            depth = patch.bit_length() - 1  # one stride-2 convolution per halving
            if embed_dim < 2 ** (depth - 1):
                raise ValueError(
                    f"conv_stem with patch size {patch} halves the channels {depth - 1} times from embed_dim "
                    f"{embed_dim}: use embed_dim >= {2 ** (depth - 1)}"
                )
            channels = tuple(embed_dim // 2 ** (depth - 1 - i) for i in range(depth))
            self.stem = nn.Sequential(
                *(ConvNormAct(c_in, c_out, 3, stride=2) for c_in, c_out in pairwise((in_chans, *channels)))
            )
            self.proj = nn.Conv2d(channels[-1], embed_dim, kernel_size=1, bias=bias)
        else:
            self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)

    def dynamic_feat_size(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """The patch grid ``(rows, cols)`` of an input of ``img_size``, counting the padding of ``dynamic_img_pad``."""
        if self.dynamic_img_pad:
            return math.ceil(img_size[0] / self.patch_size[0]), math.ceil(img_size[1] / self.patch_size[1])
        return img_size[0] // self.patch_size[0], img_size[1] // self.patch_size[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``(B, C, H, W)`` images to tokens in row-major grid order: ``(B, rows * cols, embed_dim)``, or
        ``(B, rows, cols, embed_dim)`` with ``output_fmt="NHWC"``."""
        x = check_image_size(x, None if self.dynamic_img_size else self.img_size, self.patch_size, self.dynamic_img_pad)
        B, C, H, W = x.shape
        ph, pw = self.patch_size
        if self.dynamic_img_pad:
            x = F.pad(x, (0, (pw - W % pw) % pw, 0, (ph - H % ph) % ph))  # zeros at the bottom and right
            H, W = x.shape[-2:]
        gh, gw = H // ph, W // pw
        x = self.embed_patches(x)  # (B, gh, gw, embed_dim)
        return x if self.output_fmt == "NHWC" else x.reshape(B, gh * gw, -1)

    def embed_patches(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``(B, C, H, W)``, whole patches, to tokens ``(B, rows, cols, embed_dim)``."""
        if self.stem is not None:
            return self.proj(self.stem(x)).permute(0, 2, 3, 1)  # (B, gh, gw, embed_dim)
        return F.linear(patchify(x, self.patch_size), self.proj.weight.flatten(1), self.proj.bias)


def patchify(x: torch.Tensor, patch_size: tuple[int, int]) -> torch.Tensor:
    """Images ``(B, C, H, W)`` to one row per patch, ``(B, rows, cols, C * ph * pw)``, flattened in the order of a
    convolution kernel ``(C, ph, pw)``."""
    B, C, H, W = x.shape
    ph, pw = patch_size
    gh, gw = H // ph, W // pw
    # (B, C, gh, ph, gw, pw) -> (B, gh, gw, C, ph, pw)
    return x.reshape(B, C, gh, ph, gw, pw).permute(0, 2, 4, 1, 3, 5).reshape(B, gh, gw, C * ph * pw)
