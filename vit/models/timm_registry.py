"""This package's presets in timm's model registry, built by timm's own builder: ``timm.create_model``, timm's tools
and timm's own model tests take them as timm's ViTs, ``features_only=True`` included (timm's ``FeatureGetterNet`` over
:meth:`~vit.models.VisionTransformer.forward_intermediates`).

A preset ``vit_<rest>`` is registered as ``<prefix><rest>``, by default ``vit_pkg_<rest>``: three presets share their
names with timm's own models, which stay timm's. Registering is a call, :func:`register_timm_models`, never a side
effect of an import.
"""

from __future__ import annotations

from typing import Any

import torch

from . import vision_transformer
from .presets import build, list_models, preset_cfg

DEFAULT_PREFIX = "vit_pkg_"
"""The start of every registered name; ``vit_`` keeps timm's filters for ViTs (its tests' ``vit_*``) choosing them."""


def timm_name(preset: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The name preset ``preset`` is registered under in timm's registry."""
    return prefix + preset.removeprefix("vit_")


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


def _weights_file(cfg: Any, overlay: Any) -> str | None:
    """The local weights that timm's ``create_model`` names for a model: ``pretrained_cfg_overlay``'s ``file``, or the
    ``file`` of its ``pretrained_cfg`` (a ``local-dir:`` folder's, or one given)."""
    for source in (overlay, cfg):
        found = source.get("file") if isinstance(source, dict) else getattr(source, "file", None)
        if found:
            return str(found)
    return None


def _entrypoint(preset: str, name: str):
    """timm's entrypoint of preset ``preset`` registered as ``name``."""

    def entrypoint(pretrained: bool = False, **kwargs: Any) -> torch.nn.Module:
        if pretrained and not _weights_file(kwargs.get("pretrained_cfg"), kwargs.get("pretrained_cfg_overlay")):
            raise ValueError(
                f"{name} has no weights in timm's registry: open a `vit export` folder with "
                f'timm.create_model("local-dir:DIR", pretrained=True), give a weights file with '
                "pretrained_cfg_overlay=dict(file=PATH), or load weights with vit.load_pretrained"
            )
        kwargs.pop("cache_dir", None)  # where timm would download weights to: there are none
        return build(preset, name, features_only=kwargs.pop("features_only", False), pretrained=pretrained, **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = name
    entrypoint.__module__ = vision_transformer.__name__
    entrypoint.__doc__ = f"vit's preset {preset!r} (:func:`vit.models.create_model`), as timm's entrypoint {name!r}."
    return entrypoint
