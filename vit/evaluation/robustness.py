"""Robustness to common corruptions (Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to Common
Corruptions and Perturbations", ICLR 2019): accuracy on each of the 15 corruptions at 5 severities, their mean (the
unnormalised mean corruption accuracy CIFAR papers report) and, per corruption, the drop from clean accuracy.

The corrupted images come from :func:`vit.evaluation.corruptions.iter_corrupted`: generated from the clean test
images (``"cifar10-c"``) or read from a folder of the released CIFAR-10-C files. Every image is classified by the
model alone (one view, no test-time augmentation), the clean ones included, so the drops compare like with like.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..normalize import normalize


@torch.no_grad()
def predict_classes(
    model: nn.Module,
    images: np.ndarray,
    mean: Sequence[float],
    std: Sequence[float],
    batch_size: int = 256,
    img_size: int | None = None,
) -> torch.Tensor:
    """The predicted class of each uint8 ``(N, H, W, 3)`` image: normalised with ``mean`` / ``std``, resized
    (bilinear, antialiased) to ``img_size`` when it differs, and classified in batches.

    Args:
        model: Images ``(B, 3, H, W)`` to logits, in eval mode.
        images: uint8 pixels, channels last.
        mean: Per-channel mean of the model's normalisation.
        std: Per-channel standard deviation.
        batch_size: Images per forward pass.
        img_size: The model's input side; ``None`` keeps the images' size.
    """
    device = next(model.parameters()).device
    preds = []
    for start in range(0, len(images), batch_size):
        pixels = torch.from_numpy(np.array(images[start : start + batch_size])).to(device)  # a copy of a memory map
        x = normalize(pixels.permute(0, 3, 1, 2), mean, std)  # (B, 3, H, W)
        if img_size is not None and tuple(x.shape[-2:]) != (img_size, img_size):
            x = F.interpolate(x, size=(img_size, img_size), mode="bilinear", antialias=True, align_corners=False)
        preds.append(model(x).argmax(-1).cpu())
    return torch.cat(preds) if preds else torch.zeros(0, dtype=torch.long)


def evaluate_corruptions(
    model: nn.Module,
    images: np.ndarray,
    labels: np.ndarray | torch.Tensor,
    *,
    mean: Sequence[float],
    std: Sequence[float],
    source: str = "cifar10-c",
    seed: int = 0,
    batch_size: int = 256,
    img_size: int | None = None,
    progress: bool = True,
    cache_dir: str | Path | None = None,
) -> tuple[dict[str, Any], dict[str, list[np.ndarray]]]:
    """Accuracy of ``model`` on every corruption and severity of ``source``.

    Args:
        model: Images to logits, in eval mode.
        images: The clean test images, uint8 ``(N, H, W, 3)`` as the model's eval transform gives them.
        labels: Their ``(N,)`` classes.
        mean: Per-channel mean of the model's normalisation.
        std: Per-channel standard deviation.
        source: ``"cifar10-c"`` (corrupt ``images`` here) or a folder of the released CIFAR-10-C ``.npy`` files
            (then its own images and ``labels.npy`` are evaluated).
        seed: Seed of the random corruptions.
        batch_size: Images per forward pass.
        img_size: The model's input side (images of another size are resized); ``None``: the images' size.
        progress: Show the progress of the corruptions.
        cache_dir: Keep the generated corruptions there and read them back next time (:func:`iter_corrupted`).

    Returns:
        ``(report, examples)``: the report holds ``source``, ``seed``, ``num_images``, ``clean_accuracy``,
        ``mean_corruption_accuracy``, ``severity_accuracy`` (mean over corruptions per severity), ``accuracy``
        (corruption -> its 5 accuracies), ``drop`` (corruption -> clean accuracy minus its mean over severities) and
        ``not_exact`` (generated corruptions whose formula is not the authors' own, with the reason);
        ``examples`` maps each corruption to its first image at each severity.
    """
    from .corruptions import GENERATED, NOT_EXACT, iter_corrupted  # imported when corruptions are asked for

    labels = torch.as_tensor(np.asarray(labels)).long()
    clean = float(predict_classes(model, images, mean, std, batch_size, img_size).eq(labels).double().mean())
    accuracy: dict[str, list[float]] = {}
    examples: dict[str, list[np.ndarray]] = {}
    counted = 0
    for name, _severity, corrupted, corrupted_labels in iter_corrupted(
        source, images, np.asarray(labels), seed=seed, progress=progress, cache_dir=cache_dir
    ):
        target = torch.tensor(np.asarray(corrupted_labels)).long()  # a copy: the released files are read-only maps
        preds = predict_classes(model, corrupted, mean, std, batch_size, img_size)
        accuracy.setdefault(name, []).append(float(preds.eq(target).double().mean()))
        examples.setdefault(name, []).append(np.asarray(corrupted[0]).copy())
        counted = max(counted, len(target))
    report = corruption_report(accuracy, clean)
    not_exact = NOT_EXACT if str(source) == GENERATED else {}  # the released files are the authors' own pixels
    return {"source": str(source), "seed": seed, "num_images": counted, **report, "not_exact": not_exact}, examples


def corruption_report(accuracy: dict[str, list[float]], clean: float) -> dict[str, Any]:
    """``clean_accuracy``, ``mean_corruption_accuracy`` (over every corruption and severity), ``severity_accuracy``,
    ``accuracy`` and ``drop`` (clean minus each corruption's mean) from per-severity accuracies."""
    table = np.array([accuracy[name] for name in accuracy], dtype=float)  # (corruptions, severities)
    return {
        "clean_accuracy": clean,
        "mean_corruption_accuracy": float(table.mean()) if table.size else None,
        "severity_accuracy": [float(v) for v in table.mean(0)] if table.size else [],
        "accuracy": {name: [float(v) for v in values] for name, values in accuracy.items()},
        "drop": {name: clean - float(np.mean(values)) for name, values in accuracy.items()},
    }


__all__ = ["corruption_report", "evaluate_corruptions", "predict_classes"]
