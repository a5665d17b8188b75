"""This package's presets in timm's model registry, built by timm's own builder: ``timm.create_model``, timm's tools
and timm's own model tests take them as timm's ViTs, ``features_only=True`` included (timm's ``FeatureGetterNet`` over
:meth:`~vit.models.VisionTransformer.forward_intermediates`).

A preset ``vit_<rest>`` is registered as ``<prefix><rest>``, by default ``vit_pkg_<rest>``: three presets share their
names with timm's own models, which stay timm's. Registering is a call, :func:`register_timm_models`, never a side
effect of an import.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from . import vision_transformer
from .presets import list_models, model_config
from .pretrained_cfg import default_pretrained_cfg, preset_pretrained_cfg
from .vision_transformer import _DEFAULTS, VisionTransformer

DEFAULT_PREFIX = "vit_pkg_"
"""The start of every registered name; ``vit_`` keeps timm's filters for ViTs (its tests' ``vit_*``) choosing them."""

FEATURE_OPTIONS = ("out_indices", "output_fmt", "norm")
"""``features_only`` options: which blocks (timm's ViT default, 3: the last three), ``"NCHW"`` or ``"NLC"``, and
whether the final norm is applied to each."""


def timm_name(preset: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The name preset ``preset`` is registered under in timm's registry."""
    return prefix + preset.removeprefix("vit_")


def preset_cfg(preset: str, **overrides: Any) -> dict[str, Any]:
    """The ``pretrained_cfg`` of preset ``preset`` built with ``overrides`` (without building it)."""
    args = {**_DEFAULTS, **model_config(preset, **overrides)}
    keys = ("img_size", "in_chans", "num_classes", "dynamic_img_size", "conv_stem")
    return preset_pretrained_cfg(preset, default_pretrained_cfg(*(args[key] for key in keys)))


def build(preset: str, variant: str | None = None, features_only: bool = False, **kwargs: Any) -> torch.nn.Module:
    """Preset ``preset`` built by timm's ``build_model_with_cfg``, as timm builds its ViTs.

    Args:
        preset: The preset's name in :func:`~vit.models.list_models`.
        variant: The name timm knows it by (default: ``preset``).
        features_only: A timm ``FeatureGetterNet`` over the model's blocks (see :data:`FEATURE_OPTIONS`).
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
        pretrained=False,
        feature_cfg=dict(out_indices=features.pop("out_indices", 3), feature_cls=feature_cls, **features),
        features_only=features_only,
        **{**model_config(preset), **kwargs},
    )


def _construct(device: Any = None, dtype: torch.dtype | None = None, **kwargs: Any) -> VisionTransformer:
    """The model on ``device`` (every parameter and buffer made there) in ``dtype``, timm's factory arguments."""
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = VisionTransformer(**kwargs)
    return model if dtype is None else model.to(dtype=dtype)


def register_timm_models(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Register every preset in timm's registry (again: a no-op) under :func:`timm_name`; returns the names.

    The entrypoints belong to :mod:`vit.models.vision_transformer`, whose ``default_cfgs`` timm reads, as its own
    ViTs belong to its ``vision_transformer``: timm files models by that module name.

    Example:
        >>> register_timm_models()[:1], timm.create_model("vit_pkg_tiny_patch4_32", num_classes=100)
    """
    from timm.models import register_model

    names = []
    for preset in list_models():
        name = timm_name(preset, prefix)
        names.append(name)
        if getattr(vision_transformer, name, None) is not None:
            continue
        vision_transformer.default_cfgs[name] = preset_cfg(preset)
        entrypoint = _entrypoint(preset, name)
        setattr(vision_transformer, name, entrypoint)
        register_model(entrypoint)
    return names


def _entrypoint(preset: str, name: str):
    """timm's entrypoint of preset ``preset`` registered as ``name``."""

    def entrypoint(pretrained: bool = False, **kwargs: Any) -> torch.nn.Module:
        if pretrained:
            raise ValueError(
                f"{name} has no weights in timm's registry: create it with pretrained=False, then load weights with "
                "vit.models.load_pretrained (timm's checkpoints of the same architecture load as they are)"
            )
        kwargs.pop("cache_dir", None)  # where timm would download weights to: there are none
        return build(preset, name, features_only=kwargs.pop("features_only", False), **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = name
    entrypoint.__module__ = vision_transformer.__name__
    entrypoint.__doc__ = f"vit's preset {preset!r} (:func:`vit.models.create_model`), as timm's entrypoint {name!r}."
    return entrypoint
