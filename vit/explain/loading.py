"""What ``vit explain`` reads: a checkpoint with the preprocessing it was trained with, and the images to explain.

:func:`load_explainer` takes a Lightning checkpoint of ``vit fit`` (model, image size, normalisation, class names and
data settings come from it) or plain weights with a preset name; :func:`load_images` reads image files through the
run's eval transform and :func:`load_split` the run's validation split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoints import check_checkpoint_path, data_settings, load_checkpoint, load_file, rebuild_datamodule
from ..errors import InputError
from ..normalize import IMAGENET_MEAN, IMAGENET_STD


@dataclass
class Explainer:
    """A network with the preprocessing it was trained with."""

    model: nn.Module
    img_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    preset: str
    class_names: list[str] | None
    data: Any = None  # the run's ImageDataModule (checkpoints of `vit fit` whose data settings work here)
    model_name: str | None = None  # the preset, where known


def first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def load_explainer(checkpoint: Path, model_name: str | None = None, img_size: int | None = None) -> Explainer:
    """A checkpoint of ``vit fit`` (it describes its model and preprocessing), or plain weights loaded into preset
    ``model_name``.

    Raises:
        InputError: If the file holds plain weights without ``model_name``, or ``model_name`` is unknown or does not
            fit the weights.
        CheckpointError: If the path is missing or a folder, the file is not a checkpoint, or a Lightning checkpoint
            that does not describe its model.
    """
    from ..checkpoints.pretrained import load_pretrained
    from ..models import create_model

    check_checkpoint_path(checkpoint)  # missing, or a folder: the wording of every command
    raw = load_file(checkpoint)
    if isinstance(raw, dict) and "hyper_parameters" in raw and model_name is None:
        return _from_checkpoint(checkpoint, raw)
    if model_name is None:
        raise InputError(
            f"{checkpoint} holds plain weights, not a Lightning checkpoint of vit.ImageClassifier: "
            "say which model they belong to with --model PRESET (see vit.list_models())"
        )
    try:
        model = create_model(model_name, **({"img_size": img_size} if img_size else {}))
    except Exception as err:
        raise InputError(f"--model {model_name}: {first_line(err)} (see vit.list_models())") from None
    try:
        load_pretrained(model, raw)
    except Exception as err:
        raise InputError(f"--model {model_name} does not fit {checkpoint}: {first_line(err)}") from None
    return Explainer(
        model.eval(), model.patch_embed.img_size[0], IMAGENET_MEAN, IMAGENET_STD, "imagenet", None, None, model_name
    )


def _from_checkpoint(checkpoint: Path, raw: dict) -> Explainer:
    """A checkpoint of ``vit fit``: model, image size, statistics and class names from its description
    (:mod:`vit.checkpoints`); the run's data module is kept for ``--split val`` when its settings work here."""
    loaded = load_checkpoint(checkpoint)  # the EMA weights when the run kept an EMA, as validation used
    meta = loaded.meta
    # A few hundred images: worker processes would cost more than they save.
    datamodule = rebuild_datamodule(data_settings(raw), num_workers=0)
    return Explainer(loaded.model, int(meta["img_size"][0]), tuple(meta["mean"]), tuple(meta["std"]),
                     meta["eval_transform"], meta.get("class_names"), datamodule, meta.get("model_name"))  # fmt: skip


def load_split(explainer: Explainer, limit: int | None = None) -> tuple[list[Path], torch.Tensor, torch.Tensor]:
    """The run's validation split through its eval transform: names ``val/<index>``, images, labels.

    Args:
        explainer: The loaded checkpoint with its data module.
        limit: Keep ``limit`` images evenly spaced over the split (splits are often sorted by class, so the first
            ``limit`` could all be one class); ``None`` keeps all.

    Raises:
        InputError: If the checkpoint's data settings are not usable on this machine.
    """
    if explainer.data is None:
        raise InputError("--split val needs a checkpoint of `vit fit` whose data settings work here; pass image files")
    batches = [(batch[0].cpu(), batch[1].cpu()) for batch in explainer.data.val_dataloader()]
    images, labels = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    index = split_indices(len(images), limit)
    return [Path("val") / f"{i:05d}" for i in index.tolist()], images[index], labels[index]


def split_indices(total: int, limit: int | None) -> torch.Tensor:
    """The indices of ``limit`` images evenly spaced over ``total`` (all of them for ``None``), as
    :func:`load_split` keeps them."""
    if limit is None or limit >= total:
        return torch.arange(total)
    return torch.linspace(0, total - 1, limit).round().long()


def load_images(explainer: Explainer, files: Sequence[Path], max_pixels: int | None) -> torch.Tensor:
    """``(B, 3, img_size, img_size)`` uint8 pixels through the run's eval transform (normalised later, once).

    Args:
        explainer: The loaded checkpoint with its preprocessing.
        files: Image files.
        max_pixels: Refuse an image whose header claims more pixels (width x height), before decoding it; ``None``:
            no limit (``--max_image_pixels``).

    Raises:
        InputError: If a file cannot be read, or is above ``max_pixels`` (naming ``--max_image_pixels``).
    """
    from ..data import build_transforms, load_rgb
    from ..data.datasets import ImageTooLargeError

    transform = build_transforms(
        explainer.preset, explainer.img_size, False, explainer.mean, explainer.std, "none", normalize=False
    )
    images = []
    for file in files:
        try:
            images.append(transform(image=load_rgb(file, max_pixels))["image"])
        except ImageTooLargeError as err:
            raise InputError(f"{err}: raise the limit with --max_image_pixels (e.g. --max_image_pixels 200000000, or "
                             "--max_image_pixels none for no limit)") from None  # fmt: skip
        except Exception as err:
            message = first_line(err)
            raise InputError(message if str(file) in message else f"cannot read image {file}: {message}") from None
    return torch.stack(images)


def parse_target(text: str | None, explainer: Explainer) -> int | None:
    """``--target``: a class index or name, checked against the model's classes."""
    if text is None:
        return None
    num_classes = explainer.model.num_classes
    names = explainer.class_names or []
    if text in names and not text.lstrip("-").isdigit():
        return names.index(text)
    try:
        index = int(text)
    except ValueError:
        raise InputError(f"--target {text!r} is neither a class index nor a class name ({', '.join(names)})") from None
    if not 0 <= index < num_classes:
        raise InputError(f"--target {index} out of range: the model has {num_classes} classes (0..{num_classes - 1})")
    return index
