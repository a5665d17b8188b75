"""Which images to explain: a deterministic, class-balanced pick from a dataset, loaded as the data gives them.

Explanations are compared across epochs (and runs), so the same images must come back every time: the first image
of each class, in class order, then evenly spaced ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def select_indices(labels: Sequence[int] | np.ndarray | None, length: int, num_images: int) -> list[int]:
    """Deterministic choice of images to explain.

    With labels: the first image of each class, for the ``num_images`` classes that appear first, sorted by label;
    when there are fewer classes than ``num_images``, evenly spaced further images fill up. Without labels:
    ``num_images`` evenly spaced indices.

    Args:
        labels: Label of every item, or ``None`` when the dataset does not expose them.
        length: Number of items in the dataset.
        num_images: How many indices to return (fewer if the dataset is smaller).
    """
    num_images = min(num_images, length)
    chosen: dict[int, int] = {}  # label -> first index
    if labels is not None:
        for index, label in enumerate(np.asarray(labels).tolist()):
            if label not in chosen:
                chosen[label] = index
                if len(chosen) == num_images:
                    break
    picked = [chosen[label] for label in sorted(chosen)]
    taken = set(picked)
    for index in np.linspace(0, length - 1, num=max(num_images, 1)).round().astype(int).tolist():
        if len(picked) == num_images:
            break
        if index not in taken:
            picked.append(index)
            taken.add(index)
    for index in range(length):  # rounding collisions on a tiny dataset
        if len(picked) == num_images:
            break
        if index not in taken:
            picked.append(index)
            taken.add(index)
    return picked


def dataset_labels(dataset: Any) -> Sequence[int] | None:
    """The ``labels`` (or ``targets``) of every item of a dataset, or ``None`` when it exposes neither."""
    for name in ("labels", "targets"):
        labels = getattr(dataset, name, None)
        if labels is not None and len(labels) == len(dataset):
            return labels
    return None


def fixed_images(dataset: Any, num_images: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Load the images :func:`select_indices` picks from a map-style dataset of ``(image, label)`` items.

    Items the dataset returns as ``None`` (unreadable files it skips) are left out. Images are stacked as the dataset
    gives them: uint8 pixels, or float tensors already normalised.

    Args:
        dataset: Map-style dataset of ``(C, H, W)`` tensors and integer labels.
        num_images: How many images to pick.

    Returns:
        ``(images (B, C, H, W), labels (B,), dataset indices)``.

    Raises:
        ValueError: If the dataset is empty, an item is not an ``(image tensor, label)`` pair, or nothing could be read.
    """
    if len(dataset) == 0:
        raise ValueError("the dataset is empty: there is no image to explain")
    images, labels, indices = [], [], []
    for index in select_indices(dataset_labels(dataset), len(dataset), num_images):
        item = dataset[index]
        if item is None:  # an unreadable file skipped by the dataset
            continue
        if not isinstance(item[0], torch.Tensor) or item[0].ndim != 3:
            raise ValueError(
                f"item {index} of the dataset is not a (C, H, W) tensor but {type(item[0]).__name__}: "
                "explanations need the model's input tensors"
            )
        images.append(item[0])
        labels.append(int(item[1]))
        indices.append(index)
    if not images:
        raise ValueError("none of the chosen images could be read")
    return torch.stack(images), torch.tensor(labels), indices
