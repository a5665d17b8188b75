"""A trained model from disk: a checkpoint of ``vit fit`` or an export folder of ``vit export``, with its description.

:func:`load` is ``vit.load``; :class:`Loaded` is what :class:`vit.Predictor`, ``vit explain`` and ``vit export``
share. An export folder is timm's Hugging Face Hub layout: ``config.json`` (its ``vit`` entry holds
:func:`~vit.checkpoints.metadata.inference_metadata`) beside ``model.safetensors``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointFolderError, IncompatibleCheckpointError, InputError, UsageError
from ..models.vision_transformer import VisionTransformer
from .files import folder_message, read_checkpoint
from .metadata import METADATA_KEY, TEMPERATURE_KEY, pretrained_cfg, read_metadata
from .state import has_ema, module_weights

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass
class Loaded:
    """A model read from disk with its description (:func:`~vit.checkpoints.metadata.inference_metadata`)."""

    model: VisionTransformer
    meta: dict[str, Any]
    ema: bool  # the weights are the EMA's
    has_ema: bool


def build(meta: Mapping[str, Any]) -> VisionTransformer:
    """A fresh :class:`~vit.VisionTransformer` from ``meta["model_args"]``, its ``pretrained_cfg`` set.

    Raises:
        IncompatibleCheckpointError: If the arguments do not build a model with this version of ``vit``.
    """
    try:
        with torch.random.fork_rng(devices=[]):  # its initialisation is overwritten: leave the caller's stream alone
            model = VisionTransformer(**meta["model_args"])
    except (TypeError, ValueError) as err:
        saved = (meta.get("versions") or {}).get("vit", "?")
        raise IncompatibleCheckpointError(f"cannot rebuild the model (saved by vit {saved}): {err}") from None
    model.pretrained_cfg = {**model.pretrained_cfg, **pretrained_cfg(meta)}  # timm's keys the model knows stay
    return model


def load_checkpoint(path: str | Path, ema: bool | None = None) -> Loaded:
    """A Lightning checkpoint of ``vit fit`` as a model in eval mode with its description.

    Args:
        path: The ``.ckpt`` file.
        ema: ``True`` for the EMA weights (an error without them), ``False`` for the trained weights, ``None`` for
            the EMA weights when the run kept them (what validation and ``vit predict`` use).

    Raises:
        CheckpointError: If the file is missing, not a checkpoint, or not one of ``vit fit`` that describes its model.
        UsageError: If ``ema`` asks for absent EMA weights.
    """
    checkpoint = read_checkpoint(path)
    state = checkpoint.get("state_dict") if isinstance(checkpoint, Mapping) else None
    if not isinstance(state, Mapping):
        raise IncompatibleCheckpointError(f"{path} is not a checkpoint of `vit fit` (it has no state_dict)")
    kept_ema = has_ema(state)
    if ema and not kept_ema:
        raise UsageError(f"{path} has no EMA weights (the run was trained without model.ema_decay); drop --ema")
    use_ema = kept_ema if ema is None else ema
    meta = read_metadata(checkpoint)
    if meta is None:
        raise IncompatibleCheckpointError(
            f"{path} does not describe its model (no '{METADATA_KEY}' entry: it was not written by `vit fit` for a "
            "vit.VisionTransformer); load it with vit.ImageClassifier.load_from_checkpoint (a timm: model's run also "
            "serves as model.teacher), or pass its weights with --model PRESET where a command offers it"
        )
    model = build(meta)
    missing, unexpected = model.load_state_dict(module_weights(state, use_ema), strict=False)
    if missing or unexpected:
        raise IncompatibleCheckpointError(
            f"{path}: its weights do not fit the model it describes ({len(missing)} missing, {len(unexpected)} "
            f"unexpected keys, e.g. {(list(missing) + list(unexpected))[:3]})"
        )
    return Loaded(model.eval(), meta, use_ema, kept_ema)


def read_export_config(folder: str | Path) -> dict[str, Any]:
    """``config.json`` of an export folder.

    Raises:
        InputError: If the folder has no readable ``config.json`` written by ``vit export``.
    """
    file = Path(folder) / CONFIG_FILE
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError(f"{folder} is not an export folder of `vit export`: cannot read {file} ({err})") from None
    if not isinstance(config, dict) or not isinstance(config.get("vit"), Mapping):
        raise InputError(f"{file} was not written by `vit export` (it has no 'vit' entry)")
    return config


def load_export(folder: str | Path) -> Loaded:
    """An export folder of ``vit export`` (``config.json`` + ``model.safetensors``) as a model in eval mode.

    Raises:
        InputError: If ``folder`` is not an export folder.
        IncompatibleCheckpointError: If its weights do not fit its ``config.json``.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config = read_export_config(folder)
    meta = dict(config["vit"])
    model = build(meta)
    try:
        weights = load_file(str(Path(folder) / WEIGHTS_FILE))
    except (OSError, SafetensorError) as err:
        raise InputError(f"cannot read the weights of {folder}: {err}") from None
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        raise IncompatibleCheckpointError(
            f"{folder}/{WEIGHTS_FILE} does not fit its config.json: {str(err).splitlines()[0]}"
        ) from None
    return Loaded(model.eval(), meta, bool(meta.get("ema", False)), bool(meta.get("ema", False)))


def load_any(path: str | Path, ema: bool | None = None) -> Loaded:
    """:func:`load_export` for a folder, :func:`load_checkpoint` for a file."""
    path = Path(path)
    if path.is_dir() and not (path / CONFIG_FILE).is_file() and any(path.rglob("*.ckpt")):
        raise CheckpointFolderError(folder_message(path))  # a run's folder: the checkpoint inside was meant
    if path.is_dir():
        if ema:
            raise UsageError(f"{path} is an export folder: it holds one set of weights, no EMA to choose")
        return load_export(path)
    return load_checkpoint(path, ema)


def apply_temperature(model: VisionTransformer, meta: Mapping[str, Any]) -> VisionTransformer:
    """Divide ``model``'s head by the temperature of ``meta`` (:data:`~vit.checkpoints.metadata.TEMPERATURE_KEY`,
    written by ``vit calibrate``), in place: its logits become ``z / T``, their softmax the calibrated probabilities,
    and ``model.pretrained_cfg["temperature"]`` says so. Without a temperature the model is returned as it is.

    Raises:
        IncompatibleCheckpointError: If the model's head is not a linear layer to divide.
    """
    temperature = meta.get(TEMPERATURE_KEY)
    if temperature is None:
        return model
    heads = [model.head] + ([model.head_dist] if getattr(model, "head_dist", None) is not None else [])
    for head in heads:  # a distilled model averages two heads' logits: dividing both divides the mean
        if not isinstance(head, torch.nn.Linear):
            raise IncompatibleCheckpointError(
                f"a temperature divides a linear head; this model's is {type(head).__name__}"
            )
        with torch.no_grad():
            head.weight.div_(float(temperature))
            if head.bias is not None:
                head.bias.div_(float(temperature))
    model.pretrained_cfg = {**model.pretrained_cfg, TEMPERATURE_KEY: float(temperature)}
    return model


def load(
    path: str | Path, ema: bool | None = None, calibrated: bool = True, features_only: bool = False, **features: Any
) -> torch.nn.Module:
    """The :class:`~vit.VisionTransformer` of a checkpoint (``vit fit``) or an export folder (``vit export``), in eval
    mode, with its preprocessing in ``model.pretrained_cfg`` (timm's keys: ``input_size``, ``mean``, ``std``,
    ``interpolation``, ``crop_pct``, ``label_names``).

    Args:
        path: A ``.ckpt`` file or an export folder.
        ema: For a checkpoint: the EMA weights (``True``), the trained ones (``False``), or the EMA's when present
            (``None``, what validation used).
        calibrated: With a temperature fitted by ``vit calibrate``, the head divided by it (:func:`apply_temperature`),
            so ``model(x).softmax(-1)`` are calibrated probabilities; ``False``: the weights as trained.
        features_only: timm's ``FeatureGetterNet`` over the loaded model's blocks instead of the classifier, as
            :func:`~vit.models.create_model` and ``timm.create_model(..., features_only=True)`` return.
        **features: With ``features_only``: ``out_indices`` (default 3: the last three blocks), ``output_fmt``
            (``"NCHW"`` or ``"NLC"``), ``norm``.

    Raises:
        VitError: If ``path`` is neither, or its weights do not fit the model it describes.
    """
    if features and not features_only:
        raise UsageError(f"{', '.join(features)} choose the features of features_only=True: pass it too")
    loaded = load_any(path, ema)
    model = apply_temperature(loaded.model, loaded.meta) if calibrated else loaded.model
    if not features_only:
        return model
    from vit.models.presets import feature_getter

    return feature_getter(model, **features)
