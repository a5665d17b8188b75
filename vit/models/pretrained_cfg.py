"""timm's description of a model, carried by every :class:`~vit.models.VisionTransformer`: ``pretrained_cfg`` (the
input it expects, read by ``timm.data.resolve_data_config`` and every timm tool) and ``feature_info`` (what each block
gives a dense-prediction head, read by timm's ``features_only`` wrappers).

A fresh model describes its input by its size, as this package trains it: CIFAR-sized inputs (up to 64 px) with
CIFAR-10's statistics, resized as a whole (bilinear, no crop); larger inputs with ImageNet's, the shorter side resized
to ``size / 0.875`` (bicubic) and centre-cropped. A preset that timm also has takes timm's description of that model
instead (:func:`preset_pretrained_cfg`). A model read from a checkpoint describes what it was trained with.
"""

from __future__ import annotations

from typing import Any

from ..layers.utils import to_2tuple
from ..normalize import CIFAR10_MEAN, CIFAR10_STD, IMAGENET_MEAN, IMAGENET_STD

CIFAR_SIZED = 64
"""The largest image side described as CIFAR-sized."""

# What a timm model's description says of its preprocessing, taken for a preset of the same name and input size.
_PREPROCESSING = ("interpolation", "crop_pct", "crop_mode", "mean", "std")


def default_pretrained_cfg(
    img_size: int | tuple[int, int],
    in_chans: int,
    num_classes: int,
    dynamic_img_size: bool = False,
    conv_stem: bool = False,
    architecture: str | None = None,
) -> dict[str, Any]:
    """timm's ``pretrained_cfg`` of a :class:`~vit.models.VisionTransformer` built with these arguments (see the module
    docstring); ``architecture``: the preset's name, when it was built from one."""
    height, width = to_2tuple(img_size)
    small = max(height, width) <= CIFAR_SIZED
    mean, std = (CIFAR10_MEAN, CIFAR10_STD) if small else (IMAGENET_MEAN, IMAGENET_STD)
    return {
        "architecture": architecture,
        "input_size": (in_chans, height, width),
        "fixed_input_size": not dynamic_img_size,
        "interpolation": "bilinear" if small else "bicubic",
        "crop_pct": 1.0 if small else 0.875,
        "crop_mode": "center",
        "mean": tuple(mean),
        "std": tuple(std),
        "num_classes": num_classes,
        "pool_size": None,
        "first_conv": "patch_embed.stem.0.conv" if conv_stem else "patch_embed.proj",
        "classifier": "head",
    }


def preset_pretrained_cfg(name: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` of a model built from preset ``name``: its architecture named, and the preprocessing of timm's model of
    that name when timm has one with the same input size."""
    from timm.models import get_pretrained_cfg, is_model

    twin = get_pretrained_cfg(name) if is_model(name) else None
    if twin is not None and tuple(twin.input_size) == tuple(cfg["input_size"]):
        cfg = {**cfg, **{key: getattr(twin, key) for key in _PREPROCESSING}}
    return {**cfg, "architecture": name}


def block_feature_info(depth: int, embed_dim: int, patch_size: tuple[int, int]) -> list[dict[str, Any]]:
    """One ``feature_info`` entry per block, as timm's ViT: the block's module name, its width, and its stride in
    pixels (the patch side, or the ``(height, width)`` pair of a patch that is not square)."""
    reduction = patch_size[0] if patch_size[0] == patch_size[1] else tuple(patch_size)
    return [dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=reduction) for i in range(depth)]
