"""The description a checkpoint carries of its model: the schema of :data:`METADATA_KEY`.

Every checkpoint written by ``vit fit`` carries what inference needs (:func:`inference_metadata`: class names, mean
and std, image size, the eval transform's rule, every :class:`~vit.VisionTransformer` argument, library versions),
written by :class:`vit.callbacks.CheckpointMetadata`; ``vit export`` writes the same into ``config.json``'s ``vit``
entry. It is timm's ``pretrained_cfg`` (:func:`pretrained_cfg`) plus what rebuilds the network.
"""

from __future__ import annotations

import inspect
import platform
from collections.abc import Mapping, Sequence
from importlib import metadata as importlib_metadata
from typing import Any

import torch
from torch import nn

from ..models.presets import model_config
from ..models.vision_transformer import VisionTransformer

METADATA_KEY = "vit_inference"
"""The checkpoint entry (and ``config.json``'s ``vit`` entry) holding :func:`inference_metadata`."""
METADATA_FORMAT = 1
TEMPERATURE_KEY = "temperature"
"""The entry ``vit calibrate`` adds to :func:`inference_metadata`: the temperature ``T`` that divides the logits,
``softmax(z / T)`` (Guo et al. 2017); absent, the model is uncalibrated. Read by :func:`vit.load`,
:class:`vit.Predictor`, ``vit test`` and ``vit predict``; ``vit export`` copies it into ``config.json``'s ``vit``."""

FORMAT_1_ARGS = frozenset((
    "img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias",
    "qk_norm", "class_token", "reg_tokens", "global_pool", "latent_len", "pos_embed", "no_embed_class", "conv_stem",
    "init_values", "fc_norm", "drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate",
    "drop_path_rate", "window_size", "window_type", "window_dilation", "global_attn_indexes", "shift_windows",
    "linear_attention", "linear_feature_map", "fused_attn",
))  # fmt: skip
"""The :class:`~vit.VisionTransformer` arguments of the first release writing :data:`METADATA_FORMAT` 1: always in
``model_args``. An argument added since is written only when it differs from its default, so a checkpoint that
does not use it still loads in a release that does not know it (which passes every key to the constructor)."""

EVAL_RULES: dict[str, tuple[str, float]] = {"cifar": ("bilinear", 1.0), "digits": ("bilinear", 1.0)}
"""Eval transform rule -> timm's ``(interpolation, crop_pct)``: CIFAR-size images are resized to the input size
(area averaging when shrinking); ``imagenet`` resizes the shorter side to ``size / 0.875`` (bicubic), centre-crops."""


def model_args(model: nn.Module, hparams: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every :class:`~vit.VisionTransformer` argument that rebuilds ``model`` (JSON-ready: lists, no classes).

    The arguments come from the :class:`~vit.ImageClassifier` hyper-parameters (a preset name with its overrides, or
    a ``class_path`` config); every argument not set there takes its default from ``VisionTransformer.__init__``'s
    signature, so arguments added to the model later are carried without a change here; those not in
    :data:`FORMAT_1_ARGS` only when not at their default (older releases can then read the checkpoint). Class count,
    image size and pooling are read from the model itself.

    Raises:
        ValueError: If ``model`` is not a :class:`~vit.VisionTransformer` or its arguments cannot be recovered.
    """
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"only a vit.VisionTransformer can be described, not {type(model).__name__}")
    given: dict[str, Any] = {}
    hparams = dict(hparams or {})
    spec = hparams.get("model")
    if isinstance(spec, str):
        given = model_config(spec, **(hparams.get("model_overrides") or {}))
    elif isinstance(spec, Mapping):  # a class_path config written by the CLI
        given = dict(spec.get("init_args") or {})
    defaults = {
        name: p.default
        for name, p in inspect.signature(VisionTransformer.__init__).parameters.items()
        if name not in ("self", "norm_layer") and p.default is not inspect.Parameter.empty
    }
    args = {**defaults, **{k: v for k, v in given.items() if k in defaults}}
    args["num_classes"] = int(model.num_classes)
    args["img_size"] = list(model.patch_embed.img_size)
    args["global_pool"] = model.global_pool  # reset_classifier may have changed it
    args = {k: v for k, v in args.items() if k in FORMAT_1_ARGS or k not in defaults or v != defaults[k]}
    args = _jsonable(args)
    # The copy's random initialisation must not move the caller's random stream (a resumed run replays it exactly).
    with torch.random.fork_rng(devices=[]):
        rebuilt = VisionTransformer(**args).state_dict()
    own = model.state_dict()
    if {k: tuple(v.shape) for k, v in rebuilt.items()} != {k: tuple(v.shape) for k, v in own.items()}:
        raise ValueError("the model's constructor arguments could not be recovered (its weights differ in shape)")
    return args


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def library_versions() -> dict[str, str]:
    """Versions of Python and of the libraries that define the weights' meaning."""
    versions = {"python": platform.python_version()}
    for name in ("vit", "torch", "timm", "lightning"):
        try:
            versions[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            continue
    return versions


def inference_metadata(
    model: nn.Module,
    hparams: Mapping[str, Any] | None = None,
    class_names: Sequence[str] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    eval_transform: str | None = None,
    args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What inference needs, as plain JSON-ready values (stored under :data:`METADATA_KEY`).

    Args:
        model: The network (a :class:`~vit.VisionTransformer`).
        hparams: The :class:`~vit.ImageClassifier` hyper-parameters (to recover the model's arguments).
        class_names: Class names by label (``None``: indices are the names).
        mean: Per-channel mean in [0, 1] of the normalisation (default ImageNet's).
        std: Per-channel std in [0, 1] (default ImageNet's).
        eval_transform: The eval transform's rule, a :func:`vit.data.build_transforms` preset (``cifar``,
            ``digits``, ``imagenet``); default ``cifar`` up to 64 px, else ``imagenet``.
        args: :func:`model_args` of ``model`` when already known (it builds a second model to check them).
    """
    from ..normalize import IMAGENET_MEAN, IMAGENET_STD

    args = dict(args) if args is not None else model_args(model, hparams)
    height, width = args["img_size"]
    rule = eval_transform or ("cifar" if max(height, width) <= 64 else "imagenet")
    interpolation, crop_pct = EVAL_RULES.get(rule, ("bicubic", 0.875))
    names = [str(n) for n in class_names] if class_names is not None else None
    if names is not None and len(names) != args["num_classes"]:
        names = None  # a head replaced since: indices are the honest names
    spec = (hparams or {}).get("model")
    return {
        "format": METADATA_FORMAT,
        "architecture": "vit.VisionTransformer",
        "model_name": spec if isinstance(spec, str) else None,
        "model_args": args,
        "num_classes": args["num_classes"],
        "class_names": names,
        "img_size": [height, width],
        "in_chans": args["in_chans"],
        "mean": [float(m) for m in (mean if mean is not None else IMAGENET_MEAN)],
        "std": [float(s) for s in (std if std is not None else IMAGENET_STD)],
        "eval_transform": rule,
        "interpolation": interpolation,
        "crop_pct": crop_pct,
        "versions": library_versions(),
    }


def read_metadata(checkpoint: Mapping[str, Any]) -> dict[str, Any] | None:
    """The :func:`inference_metadata` a checkpoint carries, or ``None`` (not a checkpoint of ``vit fit``, or one of a
    network that is not a :class:`~vit.VisionTransformer`)."""
    meta = checkpoint.get(METADATA_KEY)
    return dict(meta) if isinstance(meta, Mapping) and "model_args" in meta else None


def pretrained_cfg(meta: Mapping[str, Any]) -> dict[str, Any]:
    """timm's ``pretrained_cfg`` of a model described by ``meta`` (:func:`inference_metadata`)."""
    height, width = meta["img_size"]
    names = meta.get("class_names") or [str(i) for i in range(meta["num_classes"])]
    return {
        "input_size": (int(meta["in_chans"]), int(height), int(width)),
        "fixed_input_size": True,
        "interpolation": meta["interpolation"],
        "crop_pct": float(meta["crop_pct"]),
        "crop_mode": "center",
        "mean": tuple(meta["mean"]),
        "std": tuple(meta["std"]),
        "num_classes": int(meta["num_classes"]),
        "label_names": list(names),
        "eval_transform": meta["eval_transform"],
    }
