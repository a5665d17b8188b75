"""A trained model on its own: :class:`Predictor` classifies images with nothing but a checkpoint or an export folder.

Reading the checkpoint or folder, and the description it carries (class names, mean and std, image size, the eval
transform's rule, every :class:`~vit.VisionTransformer` argument), is :mod:`vit.checkpoints`'s, as is ``vit.load``.

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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoints import TEMPERATURE_KEY, apply_temperature, load_any
from .data.datasets import MAX_IMAGE_PIXELS
from .errors import InputError, UsageError


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

    The probabilities of a checkpoint calibrated by ``vit calibrate`` (or its export) are ``softmax(z / T)`` with its
    temperature (:attr:`temperature`, ``None`` when uncalibrated); the predicted classes are the same either way.

    Args:
        path: A ``.ckpt`` of ``vit fit`` or a folder of ``vit export``.
        device: Where to run the model.
        batch_size: Images per forward pass.
        ema: As for :func:`vit.load`.
        max_image_pixels: Refuse image files with more pixels (width x height), read from their header before
            decoding (:data:`vit.data.datasets.MAX_IMAGE_PIXELS`); ``None``: no limit.

    Example:
        >>> predict = Predictor("last.ckpt")  # doctest: +SKIP
        >>> predict(["cat.jpg"])[0].label
        'cat'
    """

    def __init__(
        self,
        path: str | Path,
        device: str | torch.device = "cpu",
        batch_size: int = 64,
        ema: bool | None = None,
        max_image_pixels: int | None = MAX_IMAGE_PIXELS,
    ) -> None:
        from .data import build_transforms

        loaded = load_any(path, ema)
        self.device = torch.device(device)
        self.model = apply_temperature(loaded.model, loaded.meta).to(self.device)  # calibrated when `vit calibrate` ran
        self.temperature: float | None = loaded.meta.get(TEMPERATURE_KEY)
        self.meta = loaded.meta
        self.cfg = self.model.pretrained_cfg
        self.class_names: list[str] = list(self.cfg["label_names"])
        self.batch_size = batch_size
        self.max_image_pixels = max_image_pixels
        height, width = self.meta["img_size"]
        if height != width:
            raise UsageError(f"the eval transform needs a square input, the model takes {height}x{width}")
        self.transform = build_transforms(self.meta["eval_transform"], height, False, normalize=False)

    def preprocess(self, images: Iterable[ImageInput]) -> torch.Tensor:
        """``(B, C, H, W)`` normalised float images, through the eval transform of training."""
        from .normalize import normalize

        pixels = torch.stack([self.transform(image=_rgb(image, self.max_image_pixels))["image"] for image in images])
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


def _rgb(image: ImageInput, max_pixels: int | None) -> np.ndarray:
    """A uint8 ``(H, W, 3)`` RGB array from a file path (at most ``max_pixels``), a PIL image or a uint8 array (gray
    or RGB)."""
    if isinstance(image, (str, Path)):
        from .data import load_rgb

        try:
            return load_rgb(image, max_pixels)
        except OSError as err:
            raise InputError(str(err)) from None
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


__all__ = ["Prediction", "Predictor"]
