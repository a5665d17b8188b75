"""Named model presets (timm's hyper-parameters for the 224 px models), ``create_model``, and ``build``: timm's
builder over a preset (``features_only``, timm's ``device`` and ``dtype``), shared by timm's registry."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from .pretrained_cfg import default_pretrained_cfg, preset_pretrained_cfg
from .vision_transformer import _DEFAULTS, VisionTransformer

# Sizes (Dosovitskiy et al.; Touvron et al. for tiny and small): width, depth and heads.
TINY = dict(embed_dim=192, depth=12, num_heads=3)
SMALL = dict(embed_dim=384, depth=12, num_heads=6)
BASE = dict(embed_dim=768, depth=12, num_heads=12)
# Inputs: ImageNet-sized (224 x 224 input, 16 x 16 patches, a 14 x 14 grid) and CIFAR-sized (32 x 32 input,
# 4 x 4 patches, an 8 x 8 grid of 64 patch tokens, 10 classes).
IMAGENET = dict(patch_size=16)
CIFAR = dict(img_size=32, patch_size=4, num_classes=10)
# Variants, each a difference from the plain model of a size and input.
# Attention-pooling (MAP) head: a learned latent query reads the patch tokens (timm's global_pool="map", as SigLIP).
MAP_HEAD = dict(class_token=False, global_pool="map")
# Local attention, ViTDet-style: a global block closes each group of three.
GLOBAL_EVERY_THIRD = dict(global_attn_indexes=(2, 5, 8, 11))
SLIDING = dict(window_type="sliding", **GLOBAL_EVERY_THIRD)


def _preset(size: dict[str, Any], inputs: dict[str, Any], **variant: Any) -> dict[str, Any]:
    """A preset's constructor arguments: its input's, then its size's, then what its variant changes."""
    return {**inputs, **size, **variant}


_PRESETS: dict[str, dict[str, Any]] = {
    # ImageNet-sized, identical to timm's models of the same names.
    "vit_tiny_patch16_224": _preset(TINY, IMAGENET),
    "vit_small_patch16_224": _preset(SMALL, IMAGENET),
    "vit_base_patch16_224": _preset(BASE, IMAGENET),
    "vit_small_map_patch16_224": _preset(SMALL, IMAGENET, **MAP_HEAD),
    "vit_tiny_patch4_32": _preset(TINY, CIFAR),
    "vit_small_patch4_32": _preset(SMALL, CIFAR),
    # Local-window variants.
    "vit_small_window_patch16_224": _preset(SMALL, IMAGENET, window_size=7, **GLOBAL_EVERY_THIRD),
    # 8 x 8 grid in 4 x 4 windows; in each group of three blocks the first window block is unshifted, the
    # second shifted by 2 (Swin), the third global, so information crosses windows twice before each global mix.
    "vit_tiny_window_patch4_32": _preset(TINY, CIFAR, window_size=4, shift_windows=True, **GLOBAL_EVERY_THIRD),
    # Sliding-window (neighbourhood) variants: each patch attends to the k x k patches around it (NAT).
    "vit_small_sliding_patch16_224": _preset(SMALL, IMAGENET, window_size=7, **SLIDING),
    # 8 x 8 grid, 5 x 5 neighbourhoods: 25 patches per query, close to the 16 of a 4 x 4 block window, but no edge.
    "vit_tiny_sliding_patch4_32": _preset(TINY, CIFAR, window_size=5, **SLIDING),
    # The CIFAR model with the MAP head instead of the class token.
    "vit_tiny_map_patch4_32": _preset(TINY, CIFAR, **MAP_HEAD),
    # Linear-attention variant (Katharopoulos et al.): softmax only in the blocks that close each group of three, as
    # the window presets; the other blocks cost O(N) in the number of tokens.
    "vit_tiny_linear_patch4_32": _preset(TINY, CIFAR, linear_attention=True, **GLOBAL_EVERY_THIRD),
}


def list_models() -> list[str]:
    """Names accepted by :func:`create_model`, sorted."""
    return sorted(_PRESETS)


def model_config(name: str, **overrides: Any) -> dict[str, Any]:
    """The constructor arguments of preset ``name`` with ``overrides`` applied.

    Raises:
        ValueError: If ``name`` is not a known preset (the message lists them).
    """
    if name not in _PRESETS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(list_models())}")
    return {**_PRESETS[name], **overrides}


def create_model(name: str, features_only: bool = False, **overrides: Any) -> nn.Module:
    """Build preset ``name``; keyword ``overrides`` replace or add :class:`VisionTransformer` arguments.

    Args:
        name: A preset of :func:`list_models`.
        features_only: Return timm's ``FeatureGetterNet`` over the model's blocks, as ``timm.create_model(...,
            features_only=True)`` does for its ViTs: called on images, it returns the outputs of the blocks chosen by
            ``out_indices`` (default 3: the last three; or a list of indexes), ``(B, C, rows, cols)`` each, or
            ``(B, rows * cols, C)`` with ``output_fmt="NLC"``; ``norm=True`` applies the final norm to each. The
            blocks after the last one chosen are dropped.
        **overrides: :class:`VisionTransformer` arguments (and the ``features_only`` options above).

    Example:
        >>> model = create_model("vit_tiny_patch4_32", num_classes=100, drop_path_rate=0.1)
        >>> backbone = create_model("vit_tiny_window_patch4_32", features_only=True, out_indices=(2, 5, 8, 11))

    Raises:
        ValueError: If ``name`` is unknown or an override is not a :class:`VisionTransformer` argument.
    """
    if features_only or any(key in overrides for key in FEATURE_OPTIONS):
        try:
            return build(name, features_only=features_only, **overrides)
        except TypeError as err:
            raise ValueError(f"bad override for model {name!r}: {err}") from err
    config = model_config(name, **overrides)
    try:
        model = VisionTransformer(**config)
    except TypeError as err:
        raise ValueError(f"bad override for model {name!r}: {err}") from err
    model.pretrained_cfg = preset_pretrained_cfg(name, model.pretrained_cfg)
    return model


FEATURE_OPTIONS = ("out_indices", "output_fmt", "norm")
"""``features_only`` options: which blocks (timm's ViT default, 3: the last three), ``"NCHW"`` or ``"NLC"``, and
whether the final norm is applied to each."""


def feature_getter(model: VisionTransformer, **options: Any) -> nn.Module:
    """timm's ``FeatureGetterNet`` over an existing ``model`` (a loaded one, say), as :func:`build` returns with
    ``features_only=True``: the outputs of the blocks chosen by :data:`FEATURE_OPTIONS`, timm's feature
    ``pretrained_cfg``.

    Raises:
        TypeError: On an option that is not one of :data:`FEATURE_OPTIONS`.
    """
    from timm.models._builder import pretrained_cfg_for_features
    from timm.models._features import FeatureGetterNet

    unknown = set(options) - set(FEATURE_OPTIONS)
    if unknown:
        raise TypeError(
            f"unknown features_only option {', '.join(sorted(unknown))}; options: {', '.join(FEATURE_OPTIONS)}"
        )
    cfg = model.pretrained_cfg
    wrapper = FeatureGetterNet(model, out_indices=options.pop("out_indices", 3), **options)
    wrapper.pretrained_cfg = pretrained_cfg_for_features(cfg)
    return wrapper


def preset_cfg(preset: str, **overrides: Any) -> dict[str, Any]:
    """The ``pretrained_cfg`` of preset ``preset`` built with ``overrides`` (without building it)."""
    args = {**_DEFAULTS, **model_config(preset, **overrides)}
    keys = ("img_size", "in_chans", "num_classes", "dynamic_img_size", "conv_stem")
    return preset_pretrained_cfg(preset, default_pretrained_cfg(*(args[key] for key in keys)))


def build(
    preset: str, variant: str | None = None, features_only: bool = False, pretrained: bool = False, **kwargs: Any
) -> torch.nn.Module:
    """Preset ``preset`` built by timm's ``build_model_with_cfg``, as timm builds its ViTs.

    Args:
        preset: The preset's name in :func:`~vit.models.list_models`.
        variant: The name timm knows it by (default: ``preset``).
        features_only: A timm ``FeatureGetterNet`` over the model's blocks (see :data:`FEATURE_OPTIONS`).
        pretrained: Load the weights file that ``pretrained_cfg`` names (timm's ``load_pretrained``: a ``local-dir:``
            export folder, or ``pretrained_cfg_overlay=dict(file=...)``).
        **kwargs: :class:`~vit.models.VisionTransformer` arguments, timm's ``device`` and ``dtype``, the
            ``features_only`` options, and what timm's ``create_model`` passes (``pretrained_cfg``, ...).

    Raises:
        TypeError: On an argument that neither the model nor the feature wrapper takes.
        ValueError: On a ``features_only`` option without ``features_only``.
    """
    from timm.models import build_model_with_cfg

    features = {key: kwargs.pop(key) for key in FEATURE_OPTIONS if key in kwargs}
    if features and not features_only:
        raise ValueError(f"{', '.join(features)} choose the features of features_only=True: pass it too")
    feature_cls = kwargs.pop("feature_cls", "getter")
    if kwargs.get("pretrained_cfg") is None:  # the model as built: a fresh model has no other weights to describe
        overrides = {k: v for k, v in kwargs.items() if k in _DEFAULTS}
        kwargs["pretrained_cfg"] = {**preset_cfg(preset, **overrides), "architecture": variant or preset}
    return build_model_with_cfg(
        _construct,
        variant or preset,
        pretrained=pretrained,
        feature_cfg=dict(out_indices=features.pop("out_indices", 3), feature_cls=feature_cls, **features),
        features_only=features_only,
        **{**model_config(preset), **kwargs},
    )


def _construct(device: Any = None, dtype: torch.dtype | None = None, **kwargs: Any) -> VisionTransformer:
    """The model on ``device`` (every parameter and buffer made there) in ``dtype``, timm's factory arguments."""
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = VisionTransformer(**kwargs)
    return model if dtype is None else model.to(dtype=dtype)
