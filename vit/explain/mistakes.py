"""The most confident mistakes of a classifier, each explained for the class it predicted and for the true one.

Where a model is wrong with high confidence, a learner learns most about it: the map of the predicted class shows
what the model took for evidence, the map of the true class what it found (or missed) of the right one. Like
captum's ``attribute``, :func:`worst_mistakes` takes a model, images and labels and returns tensors;
:mod:`vit.explain.render.mistakes` draws them (a PNG, an HTML section of the report), and the explorer filters its
images to the mistakes::

    mistakes = worst_mistakes(model, pixels, labels, mean=mean, std=std, class_names=names, method="attnlrp")
    mistakes.captions()[0], mistakes.predicted_maps.shape      # "true cat · pred dog (97 %)", (N, rows, cols)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .capture import eval_mode
from .explanation import display_pixels
from .methods import DEFAULT_METHOD, explain_map, get_method
from .pipeline import model_inputs

NUM_MISTAKES = 16
"""How many of the most confident errors are shown by default."""


@dataclass
class Mistakes:
    """The ``N`` most confident errors among ``num_images`` images, most confident first, on the CPU.

    Attributes:
        indices: ``(N,)`` positions of the mistakes among the images searched.
        images: ``(N, C, H, W)`` display pixels in ``[0, 1]``.
        labels: ``(N,)`` true classes.
        preds: ``(N,)`` predicted classes.
        confidence: ``(N,)`` probability of the predicted class.
        true_prob: ``(N,)`` probability of the true class.
        predicted_maps: ``(N, rows, cols)`` ``method``'s map of the predicted class.
        true_maps: ``(N, rows, cols)`` ``method``'s map of the true class (equal to the other for a method that
            ignores the class: rollout, attention).
        method: The name in :data:`~vit.explain.METHODS` of the maps.
        class_names: Name of every class, or ``None``.
        num_images: Images searched.
        num_errors: Errors among them (at least ``N``).
    """

    indices: torch.Tensor
    images: torch.Tensor
    labels: torch.Tensor
    preds: torch.Tensor
    confidence: torch.Tensor
    true_prob: torch.Tensor
    predicted_maps: torch.Tensor
    true_maps: torch.Tensor
    method: str
    class_names: list[str] | None
    num_images: int
    num_errors: int

    def __len__(self) -> int:
        return len(self.indices)

    def class_name(self, index: int) -> str:
        """The name of class ``index`` (its number when names are unknown)."""
        names = self.class_names
        return str(names[index]) if names is not None and 0 <= index < len(names) else str(index)

    def captions(self) -> list[str]:
        """One caption per mistake: ``"true cat · pred dog (97 %)"``."""
        return [
            f"true {self.class_name(t)} · pred {self.class_name(p)} ({100 * c:.0f} %)"
            for t, p, c in zip(self.labels.tolist(), self.preds.tolist(), self.confidence.tolist(), strict=True)
        ]

    def to_dict(self, names: Sequence[str] | None = None) -> dict[str, Any]:
        """The list without pictures (JSON, a W&B table's columns): per mistake its index (or ``names[index]``),
        true and predicted class, and both probabilities."""
        rows = []
        for i, index in enumerate(self.indices.tolist()):
            label, pred = int(self.labels[i]), int(self.preds[i])
            rows.append({
                "index": index, "name": None if names is None else str(names[index]),
                "true": self.class_name(label), "predicted": self.class_name(pred),
                "confidence": float(self.confidence[i]), "true_probability": float(self.true_prob[i]),
            })  # fmt: skip
        return {"method": self.method, "num_images": self.num_images, "num_errors": self.num_errors, "mistakes": rows}


def most_confident_errors(probs: torch.Tensor, labels: torch.Tensor, num: int = NUM_MISTAKES) -> torch.Tensor:
    """Indices of the ``num`` errors (``argmax != label``; label ``-1``, unknown, is never an error) with the highest
    probability of the predicted class, most confident first (ties: lower index first)."""
    confidence, preds = probs.max(dim=1)
    wrong = torch.nonzero((preds != labels) & (labels >= 0)).flatten()
    order = confidence[wrong].argsort(descending=True, stable=True)
    return wrong[order[:num]]


def worst_mistakes(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor | Sequence[int],
    *,
    num: int = NUM_MISTAKES,
    method: str = DEFAULT_METHOD,
    options: Mapping[str, Any] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    class_names: Sequence[str] | None = None,
    probs: torch.Tensor | None = None,
    batch_size: int = 64,
) -> Mistakes:
    """The ``num`` most confident errors of ``model`` on ``images``, each with ``method``'s map of the predicted and
    of the true class.

    Args:
        model: The classifier; run in eval mode, flags restored.
        images: ``(B, C, H, W)`` uint8 pixels (normalised here with ``mean`` / ``std``) or float images normalised as
            the model expects.
        labels: ``(B,)`` true classes (``-1``: unknown, never counted as an error).
        num: How many errors to keep (fewer when there are fewer).
        method: A name of :data:`~vit.explain.METHODS` (e.g. the one ``vit explain --tune`` chose).
        options: That method's options (its tuned gamma rule).
        mean: Per-channel mean of the normalisation (needed for uint8 images).
        std: Per-channel standard deviation.
        class_names: Name of every class, or ``None``.
        probs: ``(B, classes)`` softmax probabilities already computed (an :class:`~vit.explain.Explanation`'s), to
            skip the forward pass.
        batch_size: Images per forward pass.

    Raises:
        ValueError: If ``labels`` or ``probs`` do not match the images, ``num < 0``, or the method does not apply.
    """
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    method = get_method(method, model).name
    labels = torch.as_tensor(labels, dtype=torch.long).flatten().cpu()
    if len(labels) != len(images):
        raise ValueError(f"got {len(labels)} labels for {len(images)} images")
    if probs is None:
        with eval_mode(model), torch.no_grad():
            probs = torch.cat([model.forward(model_inputs(model, chunk, mean, std)).float().softmax(-1).cpu()
                               for chunk in images.split(batch_size)])  # fmt: skip
    elif probs.shape[0] != len(images):
        raise ValueError(f"got probabilities of {probs.shape[0]} images for {len(images)} images")
    probs = probs.float().cpu()
    chosen = most_confident_errors(probs, labels, num)
    preds = probs.argmax(dim=1)
    picked = model_inputs(model, images[chosen], mean, std)
    maps = {}
    with torch.inference_mode(False), torch.enable_grad():  # gradients, also inside a validation loop
        for name, target in (("predicted", preds[chosen]), ("true", labels[chosen])):
            if len(chosen):
                result = explain_map(model, picked.clone(), method, target.to(picked.device), **(options or {}))
                maps[name] = result.patches.detach().float().cpu()
            else:
                maps[name] = torch.zeros(0, *model.patch_embed.grid_size)
    return Mistakes(
        indices=chosen, images=display_pixels(images[chosen], mean, std), labels=labels[chosen], preds=preds[chosen],
        confidence=probs[chosen, preds[chosen]], true_prob=probs[chosen, labels[chosen]],
        predicted_maps=maps["predicted"], true_maps=maps["true"], method=method,
        class_names=None if class_names is None else list(class_names), num_images=len(images),
        num_errors=int(((preds != labels) & (labels >= 0)).sum()),
    )  # fmt: skip


def collect_mistakes(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    num: int = NUM_MISTAKES,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    **kwargs: Any,
) -> Mistakes:
    """:func:`worst_mistakes` over a stream of ``(images, labels)`` batches (a validation loader), keeping only the
    ``num`` most confident errors seen so far: memory for ``num`` images and one batch, whatever the dataset's size.

    Args:
        model: The classifier.
        batches: ``(images, labels)`` pairs as a data loader yields them (uint8 pixels with ``mean`` / ``std``, or
            normalised float images); further items of a batch are ignored.
        num: How many errors to keep.
        mean: Per-channel mean of the normalisation.
        std: Per-channel standard deviation.
        **kwargs: Passed to :func:`worst_mistakes` (``method``, ``options``, ``class_names``).
    """
    kept: tuple[torch.Tensor, ...] | None = None  # images, labels, probabilities, positions in the stream
    seen = errors = 0
    with eval_mode(model), torch.no_grad():
        for batch in batches:
            images, labels = batch[0].cpu(), torch.as_tensor(batch[1]).flatten().cpu()
            probs = model.forward(model_inputs(model, images, mean, std)).float().softmax(-1).cpu()
            current = (images, labels, probs, torch.arange(seen, seen + len(images)))
            seen += len(images)
            errors += int(((probs.argmax(1) != labels) & (labels >= 0)).sum())
            if kept is not None:
                current = tuple(torch.cat([old, new]) for old, new in zip(kept, current, strict=True))
            keep = most_confident_errors(current[2], current[1], num)
            kept = tuple(part[keep] for part in current)
    if kept is None:
        raise ValueError("no batches: there are no images to search for mistakes")
    images, labels, probs, positions = kept
    found = worst_mistakes(model, images, labels, num=num, mean=mean, std=std, probs=probs, **kwargs)
    found.indices, found.num_images, found.num_errors = positions[found.indices], seen, errors
    return found
