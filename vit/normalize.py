"""Per-channel image statistics and the two maps between pixels and model inputs.

The one home of normalisation: :mod:`vit.data` normalises with it (on the accelerator, after the copy) and
:mod:`vit.explain` un-normalises with it for display. Needs only torch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

Stats = tuple[float, float, float]

CIFAR10_MEAN: Stats = (0.4914, 0.4822, 0.4465)
CIFAR10_STD: Stats = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN: Stats = (0.5071, 0.4865, 0.4409)
CIFAR100_STD: Stats = (0.2673, 0.2564, 0.2762)
IMAGENET_MEAN: Stats = (0.485, 0.456, 0.406)
IMAGENET_STD: Stats = (0.229, 0.224, 0.225)
# Mean and std of all 1,797 scikit-learn digits (values 0..16 scaled to [0, 1]), the same on the three channels.
DIGITS_MEAN: Stats = (0.3053, 0.3053, 0.3053)
DIGITS_STD: Stats = (0.3759, 0.3759, 0.3759)
# Synthetic images are uniform noise: map [0, 1] to [-1, 1].
UNIFORM_MEAN: Stats = (0.5, 0.5, 0.5)
UNIFORM_STD: Stats = (0.5, 0.5, 0.5)


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 pixels in [0, 255] to model inputs ``(x / 255 - mean) / std``, on the images' device.

    The same values as ``A.Normalize`` within float32 rounding; float input is returned unchanged, so calling it on
    an already normalised batch is harmless.

    Args:
        images: uint8 (C, H, W) or (B, C, H, W) tensor(s), channels first.
        mean: Per-channel mean in [0, 1].
        std: Per-channel standard deviation in [0, 1].
    """
    if images.is_floating_point():
        return images
    if images.dtype != torch.uint8:
        raise TypeError(f"normalize expects uint8 images in [0, 255], got {images.dtype}")
    scale, shift = _affine(tuple(mean), tuple(std), images.device)
    return torch.addcmul(shift, images.float(), scale)


@functools.lru_cache(maxsize=16)
def _affine(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # Cached per device: building them from Python lists each batch would be a blocking host-to-GPU copy per step.
    scale = torch.tensor([1.0 / (255.0 * s) for s in std]).view(-1, 1, 1)
    shift = torch.tensor([-m / s for m, s in zip(mean, std, strict=True)]).view(-1, 1, 1)
    return scale.to(device), shift.to(device)


def unnormalize(
    image: torch.Tensor, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD
) -> torch.Tensor:
    """Undo ``(x - mean) / std`` on a ``(C, H, W)`` or ``(B, C, H, W)`` tensor (defaults: ImageNet statistics).

    Returns:
        ``image · std + mean`` per channel, values nominally in ``[0, 1]`` (not clipped).
    """
    shape = (-1, 1, 1)
    mean_t = torch.as_tensor(mean, dtype=image.dtype, device=image.device).view(shape)
    std_t = torch.as_tensor(std, dtype=image.dtype, device=image.device).view(shape)
    return image * std_t + mean_t


def denormalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """Model inputs back to displayable [0, 1] pixels: :func:`unnormalize`, clipped.

    Args:
        images: Normalised image tensor(s), channels first.
        mean: The per-channel mean the images were normalised with.
        std: The per-channel standard deviation the images were normalised with.
    """
    return unnormalize(images, mean, std).clamp(0.0, 1.0)


def check_normalized(x: torch.Tensor) -> torch.Tensor:
    """``x`` if it holds float images; uint8 ones mean the data module's normalisation hook was bypassed.

    Raises:
        TypeError: Saying how to normalise.
    """
    if not x.is_floating_point():
        raise TypeError(
            f"the model got {x.dtype} images. ImageDataModule's loaders yield uint8 images that its "
            "on_after_batch_transfer hook normalises, and Lightning calls that hook only when the data module itself "
            "is given to the Trainer: use trainer.fit(model, datamodule=dm), call dm.normalize(images) in your own "
            "loop, or build the data module with normalize_on_device=False"
        )
    return x
