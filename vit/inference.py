"""A trained model on its own: :func:`load` and :class:`Predictor` need nothing but a checkpoint or an export folder.

Every checkpoint written by ``vit fit`` carries what inference needs under :data:`METADATA_KEY` (class names, mean
and std, image size, the eval transform's rule, every :class:`~vit.VisionTransformer` argument, library versions;
see :func:`inference_metadata`), and ``vit export`` writes the same into ``config.json`` beside ``model.safetensors``
(timm's Hugging Face Hub layout, :mod:`vit.export`).

Example:
    >>> import vit  # doctest: +SKIP
    >>> model = vit.load("runs/cifar10_cpu/<run>/checkpoints/last.ckpt")  # or an export folder
    >>> model.pretrained_cfg["input_size"], model.pretrained_cfg["label_names"][:3]
    ((3, 32, 32), ['airplane', 'automobile', 'bird'])
    >>> predict = vit.Predictor("exported/")  # file paths, PIL images or uint8 (H, W, 3) arrays
    >>> result = predict(["cat.jpg", "ship.png"])
    >>> result[0].label, round(result[0].prob, 3)
    ('cat', 0.912)
    >>> result[0].top5  # [(class name, probability), ...], most likely first
    [('cat', 0.912), ('dog', 0.041), ('frog', 0.017), ('deer', 0.011), ('bird', 0.007)]
"""

from __future__ import annotations

import inspect
import json
import platform
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .errors import UsageError
from .models import VisionTransformer, model_config
from .models.checkpoint_errors import read_checkpoint

METADATA_KEY = "vit_inference"
"""The checkpoint entry (and ``config.json``'s ``vit`` entry) holding :func:`inference_metadata`."""
METADATA_FORMAT = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"

EVAL_RULES: dict[str, tuple[str, float]] = {"cifar": ("bilinear", 1.0), "digits": ("bilinear", 1.0)}
"""Eval transform rule -> timm's ``(interpolation, crop_pct)``: CIFAR-size images are resized to the input size
(area averaging when shrinking); ``imagenet`` resizes the shorter side to ``size / 0.875`` (bicubic), centre-crops."""


# ------------------------------------------------------------------------------------------ what a model needs
def model_args(model: nn.Module, hparams: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every :class:`~vit.VisionTransformer` argument that rebuilds ``model`` (JSON-ready: lists, no classes).

    The arguments come from the model's own record when it keeps one (an ``init_kwargs`` attribute), else from the
    :class:`~vit.ImageClassifier` hyper-parameters (a preset name with its overrides, or a ``class_path`` config);
    every argument not set there takes its default from ``VisionTransformer.__init__``'s signature, so arguments added
    to the model later are carried without a change here. Class count and image size are read from the model itself.

    Raises:
        ValueError: If ``model`` is not a :class:`~vit.VisionTransformer` or its arguments cannot be recovered.
    """
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"only a vit.VisionTransformer can be described, not {type(model).__name__}")
    given: dict[str, Any] = {}
    own = getattr(model, "init_kwargs", None)
    hparams = dict(hparams or {})
    spec = hparams.get("model")
    if isinstance(own, Mapping):
        given = dict(own)
    elif isinstance(spec, str):
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
    args = _jsonable(args)
    # The copy's random initialisation must not move the caller's random stream (a resumed run replays it exactly);
    # a model built on the meta device cannot initialise.
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
    model_name: str | None = None,
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
        model_name: The preset name the model was built from, when it was.
        args: :func:`model_args` of ``model`` when already known (it builds a second model to check them).
    """
    from .normalize import IMAGENET_MEAN, IMAGENET_STD

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
        "model_name": model_name or (spec if isinstance(spec, str) else None),
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


# ------------------------------------------------------------------------------------------------------ loading
@dataclass
class Loaded:
    """A model read from disk with its description: what :func:`load` and ``vit export`` share."""

    model: VisionTransformer
    meta: dict[str, Any]
    ema: bool  # the weights are the EMA's
    has_ema: bool


def read_metadata(checkpoint: Mapping[str, Any]) -> dict[str, Any] | None:
    """The :func:`inference_metadata` a checkpoint carries, or ``None`` (a checkpoint written before it did)."""
    meta = checkpoint.get(METADATA_KEY)
    return dict(meta) if isinstance(meta, Mapping) and "model_args" in meta else None


def _weights(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    weights = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    return {k.replace("_orig_mod.", ""): v for k, v in weights.items()}


def build(meta: Mapping[str, Any]) -> VisionTransformer:
    """A fresh :class:`~vit.VisionTransformer` from ``meta["model_args"]``, its ``pretrained_cfg`` set.

    Raises:
        UsageError: If the arguments do not build a model with this version of ``vit``.
    """
    try:
        with torch.random.fork_rng(devices=[]):  # its initialisation is overwritten: leave the caller's stream alone
            model = VisionTransformer(**meta["model_args"])
    except (TypeError, ValueError) as err:
        saved = (meta.get("versions") or {}).get("vit", "?")
        raise UsageError(f"cannot rebuild the model (saved by vit {saved}): {err}") from None
    model.pretrained_cfg = pretrained_cfg(meta)
    return model


def load_checkpoint(path: str | Path, ema: bool | None = None) -> Loaded:
    """A Lightning checkpoint of ``vit fit`` as a model in eval mode with its description.

    Args:
        path: The ``.ckpt`` file.
        ema: ``True`` for the EMA weights (an error without them), ``False`` for the trained weights, ``None`` for
            the EMA weights when the run kept them (what validation and ``vit predict`` use).

    Raises:
        UsageError: If the file is missing or not a checkpoint of ``vit fit``, or ``ema`` asks for absent weights.
    """
    from .models.checkpoint_errors import CHECKPOINT_ERRORS

    try:
        checkpoint = read_checkpoint(path)
    except CHECKPOINT_ERRORS as err:
        raise UsageError(str(err)) from None
    state = checkpoint.get("state_dict") if isinstance(checkpoint, Mapping) else None
    if not isinstance(state, Mapping):
        raise UsageError(f"{path} is not a checkpoint of `vit fit` (it has no state_dict)")
    has_ema = any(k.startswith("model_ema.module.") for k in state)
    if ema and not has_ema:
        raise UsageError(f"{path} has no EMA weights (the run was trained without model.ema_decay); drop --ema")
    use_ema = has_ema if ema is None else ema
    meta = read_metadata(checkpoint)
    if meta is None:
        meta = _legacy_metadata(path, checkpoint)
    model = build(meta)
    weights = _weights(state, "model_ema.module." if use_ema else "model.")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise UsageError(
            f"{path}: its weights do not fit the model it describes ({len(missing)} missing, {len(unexpected)} "
            f"unexpected keys, e.g. {(list(missing) + list(unexpected))[:3]})"
        )
    return Loaded(model.eval(), meta, use_ema, has_ema)


def _legacy_metadata(path: str | Path, checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The description of a checkpoint written before checkpoints carried it: the model from its hyper-parameters,
    the data's statistics and class names from its data settings when they work here."""
    from . import ImageClassifier

    try:
        module = ImageClassifier.load_from_checkpoint(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise UsageError(f"cannot rebuild the model of {path}: {str(err).splitlines()[0]}") from None
    names = mean = std = rule = None
    data = {k: v for k, v in (checkpoint.get("datamodule_hyper_parameters") or {}).items() if not k.startswith("_")}
    try:
        from .data import ImageDataModule

        datamodule = ImageDataModule(**{**data, "num_workers": 0})
        names, mean, std, rule = datamodule.class_names, datamodule.mean, datamodule.std, datamodule.preset
    except Exception:  # the data is not here: indices as names, ImageNet statistics
        pass
    return inference_metadata(module.model, module.hparams, names, mean, std, rule)


def read_export_config(folder: str | Path) -> dict[str, Any]:
    """``config.json`` of an export folder.

    Raises:
        UsageError: If the folder has no readable ``config.json`` written by ``vit export``.
    """
    file = Path(folder) / CONFIG_FILE
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UsageError(f"{folder} is not an export folder of `vit export`: cannot read {file} ({err})") from None
    if not isinstance(config, dict) or not isinstance(config.get("vit"), Mapping):
        raise UsageError(f"{file} was not written by `vit export` (it has no 'vit' entry)")
    return config


def load_export(folder: str | Path) -> Loaded:
    """An export folder of ``vit export`` (``config.json`` + ``model.safetensors``) as a model in eval mode."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config = read_export_config(folder)
    meta = dict(config["vit"])
    model = build(meta)
    try:
        weights = load_file(str(Path(folder) / WEIGHTS_FILE))
    except (OSError, SafetensorError) as err:
        raise UsageError(f"cannot read the weights of {folder}: {err}") from None
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        raise UsageError(f"{folder}/{WEIGHTS_FILE} does not fit its config.json: {str(err).splitlines()[0]}") from None
    return Loaded(model.eval(), meta, bool(meta.get("ema", False)), bool(meta.get("ema", False)))


def load_any(path: str | Path, ema: bool | None = None) -> Loaded:
    """:func:`load_export` for a folder, :func:`load_checkpoint` for a file."""
    path = Path(path)
    if path.is_dir():
        if ema:
            raise UsageError(f"{path} is an export folder: it holds one set of weights, no EMA to choose")
        return load_export(path)
    return load_checkpoint(path, ema)


def load(path: str | Path, ema: bool | None = None) -> VisionTransformer:
    """The :class:`~vit.VisionTransformer` of a checkpoint (``vit fit``) or an export folder (``vit export``), in eval
    mode, with its preprocessing in ``model.pretrained_cfg`` (timm's keys: ``input_size``, ``mean``, ``std``,
    ``interpolation``, ``crop_pct``, ``label_names``).

    Args:
        path: A ``.ckpt`` file or an export folder.
        ema: For a checkpoint: the EMA weights (``True``), the trained ones (``False``), or the EMA's when present
            (``None``, what validation used).

    Raises:
        UsageError: If ``path`` is neither, or its weights do not fit the model it describes.
    """
    return load_any(path, ema).model


# --------------------------------------------------------------------------------------------------- predicting
@dataclass(frozen=True)
class Prediction:
    """One image's prediction: the most likely class, its probability, and the top classes."""

    label: str
    index: int
    prob: float
    top5: list[tuple[str, float]]


ImageInput = str | Path | np.ndarray | Any  # a file, a uint8 (H, W[, C]) array, or a PIL image


class Predictor:
    """Classify images with a checkpoint or an export folder, preprocessing them as at evaluation in training.

    Args:
        path: A ``.ckpt`` of ``vit fit`` or a folder of ``vit export``.
        device: Where to run the model.
        batch_size: Images per forward pass.
        ema: As for :func:`load`.

    Example:
        >>> predict = Predictor("last.ckpt")  # doctest: +SKIP
        >>> predict(["cat.jpg"])[0].label
        'cat'
    """

    def __init__(
        self, path: str | Path, device: str | torch.device = "cpu", batch_size: int = 64, ema: bool | None = None
    ) -> None:
        from .data import build_transforms

        loaded = load_any(path, ema)
        self.device = torch.device(device)
        self.model = loaded.model.to(self.device)
        self.meta = loaded.meta
        self.cfg = self.model.pretrained_cfg
        self.class_names: list[str] = list(self.cfg["label_names"])
        self.batch_size = batch_size
        height, width = self.meta["img_size"]
        if height != width:
            raise UsageError(f"the eval transform needs a square input, the model takes {height}x{width}")
        self.transform = build_transforms(self.meta["eval_transform"], height, False, normalize=False)

    def preprocess(self, images: Iterable[ImageInput]) -> torch.Tensor:
        """``(B, C, H, W)`` normalised float images, through the eval transform of training."""
        from .normalize import normalize

        pixels = torch.stack([self.transform(image=_rgb(image))["image"] for image in images])
        return normalize(pixels.to(self.device), self.cfg["mean"], self.cfg["std"])

    @torch.no_grad()
    def probabilities(self, images: Sequence[ImageInput]) -> torch.Tensor:
        """Class probabilities ``(B, num_classes)`` on the CPU."""
        if isinstance(images, (str, Path, np.ndarray)) or hasattr(images, "convert"):
            images = [images]
        chunks = [images[i : i + self.batch_size] for i in range(0, len(images), self.batch_size)]
        return torch.cat([self.model(self.preprocess(chunk)).float().softmax(-1).cpu() for chunk in chunks])

    def __call__(self, images: Sequence[ImageInput] | ImageInput) -> list[Prediction]:
        """One :class:`Prediction` per image (a single image counts as a list of one)."""
        probs = self.probabilities(images)
        k = min(5, probs.shape[1])
        top_p, top_i = probs.topk(k, dim=1)
        return [
            Prediction(
                label=self.class_names[int(i[0])],
                index=int(i[0]),
                prob=float(p[0]),
                top5=[(self.class_names[int(c)], float(q)) for c, q in zip(i, p, strict=True)],
            )
            for p, i in zip(top_p, top_i, strict=True)
        ]


def _rgb(image: ImageInput) -> np.ndarray:
    """A uint8 ``(H, W, 3)`` RGB array from a file path, a PIL image or a uint8 array (gray or RGB)."""
    if isinstance(image, (str, Path)):
        from .data import load_rgb

        try:
            return load_rgb(image)
        except OSError as err:
            raise UsageError(str(err)) from None
    if hasattr(image, "convert"):  # PIL
        return np.array(image.convert("RGB"))  # a writable copy: torch refuses to wrap read-only memory
    array = np.asarray(image)
    if array.dtype != np.uint8:
        raise UsageError(f"an image array must be uint8 (H, W) or (H, W, 3) pixels, got dtype {array.dtype}")
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4):
        raise UsageError(f"an image array must be (H, W) or (H, W, 3), got shape {array.shape}")
    if array.shape[2] == 1:
        array = np.repeat(array, 3, axis=2)
    return np.ascontiguousarray(array[:, :, :3])


__all__ = ["Predictor", "Prediction", "inference_metadata", "load", "model_args", "pretrained_cfg"]
