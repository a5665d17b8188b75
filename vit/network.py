"""The network an :class:`~vit.ImageClassifier` trains: a preset of :func:`vit.create_model`, a timm model by name
(``timm:NAME``, e.g. a small CNN to serve as a distillation teacher), or a module given from Python."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoints.files import read_checkpoint
from .checkpoints.state import has_ema, module_weights
from .errors import ConfigError, IncompatibleCheckpointError
from .models import create_model

TIMM_PREFIX = "timm:"
"""``model.model`` names starting so are built by ``timm.create_model`` (untrained), not from our presets."""


def timm_name(model: Any) -> str | None:
    """``NAME`` of a ``timm:NAME`` model name, else ``None`` (a preset, a ``class_path`` network, a module)."""
    return model.removeprefix(TIMM_PREFIX) if isinstance(model, str) and model.startswith(TIMM_PREFIX) else None


def build_network(
    model: str | nn.Module, num_classes: int | None, img_size: int | None, overrides: dict[str, Any]
) -> nn.Module:
    """The network of ``model``: a preset name with ``overrides``, ``timm:NAME`` (``overrides`` are its keyword
    arguments; ``img_size`` is not passed, as timm's CNNs take any size: a timm ViT gets its size in ``overrides``), or
    a module (its head reset to ``num_classes``); a network with a patch embedding must be built for ``img_size``.

    Raises:
        ConfigError: For an unknown preset, timm model or override, or sizes that disagree.
    """
    if (name := timm_name(model)) is not None:
        model, overrides = _timm_network(name, num_classes, overrides), {}
    if isinstance(model, str):
        if num_classes is not None:
            overrides = {**overrides, "num_classes": num_classes}
        if img_size is not None:
            overrides = {**overrides, "img_size": img_size}
        try:
            return create_model(model, **overrides)
        except ValueError as err:  # unknown preset, unknown override, inconsistent sizes
            raise ConfigError(f"model.model / model.model_overrides: {err}") from err
    if overrides:
        raise ConfigError("model.model_overrides applies to a preset name; set the network's own init_args instead")
    own_size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if img_size is not None and own_size is not None and tuple(own_size) != (img_size, img_size):
        raise ConfigError(
            f"the model was built for img_size {tuple(own_size)} but data.img_size is {img_size}; "
            f"set the model's img_size to {img_size} (model.model_overrides.img_size for a timm: model), or "
            "data.img_size to match the model"
        )
    if num_classes is not None and getattr(model, "num_classes", None) != num_classes:
        model.reset_classifier(num_classes)
    return model


def _timm_network(name: str, num_classes: int | None, overrides: dict[str, Any]) -> nn.Module:
    import timm

    if not timm.is_model(name):
        raise ConfigError(
            f"model.model 'timm:{name}': timm has no model {name!r} (timm.list_models('resnet*') lists some)"
        )
    kwargs = {**overrides, **({"num_classes": num_classes} if num_classes is not None else {})}
    try:
        return timm.create_model(name, pretrained=False, **kwargs)
    except TypeError as err:
        raise ConfigError(f"model.model_overrides for timm:{name}: {err}") from None


def load_network(path: str | Path) -> nn.Module:
    """The trained network of a ``vit fit`` checkpoint whose ``model.model`` was ``timm:NAME`` (the EMA weights when
    the run kept them), in eval mode.

    Raises:
        IncompatibleCheckpointError: If the checkpoint was not written for a ``timm:`` model.
    """
    checkpoint = read_checkpoint(path)
    hparams = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    name = timm_name(hparams.get("model")) if isinstance(hparams, dict) else None
    if name is None or not isinstance(checkpoint.get("state_dict"), dict):
        raise IncompatibleCheckpointError(f"{path} is not a checkpoint of `vit fit` for a timm: model")
    with torch.random.fork_rng(devices=[]):  # its initialisation is overwritten: leave the caller's stream alone
        network = _timm_network(name, hparams.get("num_classes"), dict(hparams.get("model_overrides") or {}))
    state = checkpoint["state_dict"]
    network.load_state_dict(module_weights(state, has_ema(state)))
    return network.eval()
