"""Ways of removing a patch for the faithfulness curves: fill it, impute it, or drop its token.

- ``"mean"``: the patch takes the dataset mean (zero after normalisation): simple, and out of distribution.
- ``"blur"``: the patch takes the image blurred with a Gaussian of half a patch.
- ``"road"``: noisy linear imputation (Rong, Leemann, Borisov, Kasneci & Kasneci, "A Consistent and Efficient
  Evaluation Strategy for Attribution Methods", ICML 2022): every removed pixel becomes the weighted mean of its eight
  neighbours (1/6 for the four direct ones, 1/12 for the diagonals), solved for all removed pixels at once, plus
  Gaussian noise of 0.01; the shape of the removed region leaks less than with a constant fill. Solved here by
  conjugate gradients on the whole batch (the system is the masked graph Laplacian, symmetric positive definite while
  a pixel of the image is kept); with nothing kept, the image takes the mean.
- ``"drop"``: the removed patches leave the token sequence (a ViT's own removal: what PatchDropout trains on). Needs a
  model whose every block attends globally or linearly (:meth:`~vit.VisionTransformer.attention_kinds`; window and
  sliding blocks need the whole grid) and that drops tokens through ``model.patch_drop``. With no patch kept, a model
  with a class or register token sees those alone; one without any prefix token has nothing to read, and its
  prediction counts as uniform (``1 / classes``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Removal = Literal["mean", "blur", "road", "drop"]
REMOVALS: tuple[str, ...] = ("mean", "blur", "road", "drop")
ROAD_NOISE = 0.01
"""Standard deviation of the noise ROAD adds to the imputed pixels (its authors' default)."""


def _neighbours(x: torch.Tensor) -> torch.Tensor:
    """The weighted sum of every pixel's in-image neighbours (ROAD's weights: 1/6 direct, 1/12 diagonal), per
    channel: eight shifted copies of the zero-padded image (faster than a depthwise convolution on the CPU)."""
    H, W = x.shape[-2:]
    padded = F.pad(x, (1, 1, 1, 1))
    direct = (
        padded[..., :H, 1 : W + 1]
        + padded[..., 2:, 1 : W + 1]
        + padded[..., 1 : H + 1, :W]
        + padded[..., 1 : H + 1, 2:]
    )
    diagonal = padded[..., :H, :W] + padded[..., :H, 2:] + padded[..., 2:, :W] + padded[..., 2:, 2:]
    return direct / 6 + diagonal / 12


def road_impute(
    images: torch.Tensor,
    removed: torch.Tensor,
    noise: float = ROAD_NOISE,
    generator: torch.Generator | None = None,
    tolerance: float = 1e-6,
    max_iterations: int = 5000,
) -> torch.Tensor:
    """ROAD's noisy linear imputation of the ``removed`` pixels of each image.

    Each removed pixel ``i`` satisfies ``d_i x_i = sum_j w_ij x_j`` over its in-image neighbours ``j`` (``w``: 1/6
    direct, 1/12 diagonal; ``d_i``: the sum of its neighbours' weights), kept pixels fixed; the system is solved by
    conjugate gradients for every image and channel at once, then ``noise`` times a standard normal draw is added to
    the imputed pixels.

    Args:
        images: ``(B, C, H, W)``.
        removed: ``(B, H, W)`` or ``(B, 1, H, W)`` boolean, true where a pixel is removed.
        noise: Standard deviation of the added noise (0: the plain linear imputation).
        generator: Random generator of the noise (on the images' device).
        tolerance: Stop when every system's residual norm is below this times its right-hand side's.
        max_iterations: Upper bound on the iterations.

    Returns:
        The images with the removed pixels imputed; an image with every pixel removed takes 0 (the dataset mean).
    """
    images = images.float()
    mask = removed.reshape(images.shape[0], 1, *images.shape[-2:]).to(images.device, images.dtype)
    degree = _neighbours(torch.ones_like(images[:, :1]))  # (B or 1, 1, H, W): in-image neighbour weights

    def system(v: torch.Tensor) -> torch.Tensor:  # A v, for v zero outside the removed pixels
        return mask * (degree * v - _neighbours(v))

    b = mask * _neighbours(images * (1 - mask))
    x = torch.zeros_like(images)
    r = b.clone()
    p = r.clone()
    rs = (r * r).sum(dim=(2, 3), keepdim=True)
    limit = tolerance**2 * rs.clamp_min(1e-30)
    for _ in range(max_iterations):
        if bool((rs <= limit).all()):
            break
        Ap = system(p)
        alpha = rs / (p * Ap).sum(dim=(2, 3), keepdim=True).clamp_min(1e-30)
        x = x + alpha * p
        r = r - alpha * Ap
        rs_next = (r * r).sum(dim=(2, 3), keepdim=True)
        p = r + (rs_next / rs.clamp_min(1e-30)) * p
        rs = rs_next
    if noise:
        x = x + noise * torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    everything = mask.flatten(1).all(dim=1)[:, None, None, None]  # nothing kept to impute from: the mean
    filled = torch.where(mask.bool(), x, images)
    return torch.where(everything, torch.zeros_like(images), filled)


def check_removals(model: nn.Module, removals: Sequence[str]) -> None:
    """Raise ``ValueError`` on an unknown or repeated removal, none at all, or ``"drop"`` for a model that cannot drop
    tokens (:func:`drop_reason`)."""
    unknown = [r for r in removals if r not in REMOVALS]
    if unknown or not removals or len(set(removals)) != len(removals):
        raise ValueError(f"removals must be distinct names of {', '.join(REMOVALS)}, got {list(removals)}")
    if "drop" in removals and drop_reason(model) is not None:
        raise ValueError(f"token drop does not apply to this model: {drop_reason(model)}")


def drop_reason(model: nn.Module) -> str | None:
    """Why ``model`` cannot drop patch tokens (``"drop"``), or ``None`` when it can."""
    if not isinstance(getattr(model, "patch_drop", None), nn.Module):
        return f"{type(model).__name__} has no patch_drop module to drop tokens through"
    kinds = model.attention_kinds() if callable(getattr(model, "attention_kinds", None)) else None
    if kinds is None:
        return f"{type(model).__name__} does not say which attention its blocks use (attention_kinds)"
    local = sorted({i for i, kind in enumerate(kinds) if kind not in ("global", "linear")})
    if local:
        return f"blocks {', '.join(map(str, local))} use {kinds[local[0]]} attention, which needs the whole patch grid"
    return None


class _KeepPatches(nn.Module):
    """Stands in for ``model.patch_drop``: keeps the prefix tokens and the patches in ``keep`` ``(B, K)``, in order."""

    def __init__(self, keep: torch.Tensor, num_prefix_tokens: int) -> None:
        super().__init__()
        self.keep, self.prefix = keep, num_prefix_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = x[:, self.prefix :]
        index = self.keep.to(x.device)[:, :, None].expand(-1, -1, x.shape[-1])
        return torch.cat([x[:, : self.prefix], patches.gather(1, index)], dim=1)


@contextlib.contextmanager
def keeping(model: nn.Module, keep: torch.Tensor) -> Iterator[None]:
    """Within the block, ``model`` sees only the patch tokens ``keep`` ``(B, K)`` of each image (and its prefix
    tokens); its own ``patch_drop`` is given back afterwards.

    Raises:
        ValueError: If the model cannot drop tokens (:func:`drop_reason`).
    """
    reason = drop_reason(model)
    if reason is not None:
        raise ValueError(f"token drop does not apply to this model: {reason}")
    own = model.patch_drop
    model.patch_drop = _KeepPatches(keep, int(model.num_prefix_tokens))
    try:
        yield
    finally:
        model.patch_drop = own


def kept_probabilities(
    model: nn.Module, images: torch.Tensor, keep: torch.Tensor, target: torch.Tensor
) -> torch.Tensor:
    """The softmax probability of ``target`` when each image keeps only the patches ``keep`` ``(B, K)``; with
    ``K = 0`` and no prefix token, ``1 / classes``."""
    if keep.shape[1] == 0 and not int(model.num_prefix_tokens):
        return torch.full((len(images),), 1.0 / model.num_classes, device=images.device)
    with keeping(model, keep):
        logits = model.forward(images)
    return logits.float().softmax(dim=-1).gather(1, target[:, None])[:, 0]
