"""Shifted patch tokenization (SPT): each patch token also sees the four half-patch-shifted copies of its image.

Lee, Lee & Song, "Vision Transformer for Small-Size Datasets" (2021), Sec. 3.1. A plain patch embedding gives every
token the pixels of its own patch only; with few training images a ViT then learns slowly how neighbouring patches
relate. SPT widens each token's receptive field before any attention: the image is moved by half a patch in the four
diagonal directions (zeros where it moves in), the four copies are concatenated with the image along the channels
(``5 C`` channels), cut into patches, each flattened patch normalised by a LayerNorm and projected to ``embed_dim``.
A token then sees a ``2p × 2p`` neighbourhood of its patch, in five views of ``p × p`` pixels each. The cost is the
projection's, five times wider (about 3 % of a ViT's FLOPs at ImageNet size); the authors report about +1 to +3
points on CIFAR and Tiny-ImageNet from scratch.

**With the convolutional stem** (``conv_stem``, Xiao et al. 2021) the two combine: the five views are the stem's
input (its first 3x3 stride-2 convolution takes ``5 C`` channels) and the stem's BatchNorms take the place of the
patch LayerNorm, which has no flattened patch to normalise there. A stem's tokens already see beyond their patch (two
3x3 stride-2 convolutions cover 7x7 pixels for a 4x4 patch, SPT 8x8), so the two overlap: measure SPT against the stem,
not only with it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .patch_embed import PatchEmbed, patchify

NUM_VIEWS = 5
"""The image and its four diagonally shifted copies."""


def shifted_copies(x: torch.Tensor, shift: tuple[int, int]) -> torch.Tensor:
    """Images ``(B, C, H, W)`` and their four diagonal shifts, ``(B, 5 C, H, W)``, as the official code orders them:
    the image, then the copies whose pixel ``(i, j)`` is ``x[i - s, j - s]``, ``x[i - s, j + s]``, ``x[i + s, j - s]``,
    ``x[i + s, j + s]`` (zero outside the image), ``s = shift`` per axis ``(rows, columns)``."""
    sh, sw = shift
    padded = F.pad(x, (sw, sw, sh, sh))  # (B, C, H + 2 sh, W + 2 sw)
    copies = (
        padded[:, :, : -2 * sh, : -2 * sw],
        padded[:, :, : -2 * sh, 2 * sw :],
        padded[:, :, 2 * sh :, : -2 * sw],
        padded[:, :, 2 * sh :, 2 * sw :],
    )
    return torch.cat([x, *copies], dim=1)


class ShiftedPatchEmbed(PatchEmbed):
    """Patch embedding of the image and its four half-patch-shifted copies (module docstring).

    Takes :class:`PatchEmbed`'s arguments and keeps its interface (``proj``, ``grid_size``, ``in_chans`` the image's
    channels); ``proj`` reads ``5 · in_chans`` channels, and without a convolutional stem ``patch_norm``, a LayerNorm
    over each flattened patch of the five views (``5 · in_chans · ph · pw`` features), comes before it.

    Raises:
        ValueError: As :class:`PatchEmbed`, or for a patch side of 1 (half a patch is no shift).
    """

    def __init__(self, img_size: int | tuple[int, int] = 224, patch_size: int | tuple[int, int] = 16,
                 in_chans: int = 3, embed_dim: int = 768, **kwargs) -> None:  # fmt: skip
        super().__init__(img_size, patch_size, NUM_VIEWS * in_chans, embed_dim, **kwargs)
        self.in_chans = in_chans  # the image's channels, what callers feed
        ph, pw = self.patch_size
        if min(ph, pw) < 2:
            raise ValueError(
                f"shifted_patches shifts by half a patch: the patch size {self.patch_size} needs sides >= 2"
            )
        self.shift = (ph // 2, pw // 2)
        width = NUM_VIEWS * in_chans * ph * pw
        self.patch_norm: nn.Module = nn.LayerNorm(width) if self.stem is None else nn.Identity()

    def embed_patches(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``(B, C, H, W)``, whole patches, to tokens ``(B, rows, cols, embed_dim)``."""
        x = shifted_copies(x, self.shift)  # (B, 5C, H, W)
        if self.stem is not None:
            return super().embed_patches(x)
        x = self.patch_norm(patchify(x, self.patch_size))  # (B, rows, cols, 5C * ph * pw)
        return F.linear(x, self.proj.weight.flatten(1), self.proj.bias)
