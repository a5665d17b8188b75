"""Where a classifier fails: per-class precision / recall / F1, the confusion matrix, top-5, NLL, Brier score, ECE / MCE
and the reliability diagram's bins, as torchmetrics states that sum (or concatenate) across DDP ranks.

Calibration follows Guo et al., "On Calibration of Modern Neural Networks" (ICML 2017): the top-label confidence is
sorted into 15 equal-width bins; ECE is the count-weighted mean of ``|accuracy - confidence|`` over the bins, MCE its
maximum (torchmetrics' :class:`~torchmetrics.classification.MulticlassCalibrationError`, ``norm="l1"`` / ``"max"``).
The Brier score is the multi-class one of Brier (1950): the mean over images of ``sum_k (p_k - [k == y])^2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassCalibrationError,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassPrecision,
    MulticlassRecall,
)

N_BINS = 15
"""Equal-width confidence bins of ECE, MCE and the reliability diagram (Guo et al. 2017)."""


def accuracy_metrics(num_classes: int, stage: str) -> MetricCollection:
    """Top-1 (and, from 5 classes, top-5) accuracy logged as ``{stage}/acc`` and ``{stage}/acc_top5`` during a fit.

    torchmetrics' argument validation counts the label values on the host (``torch.unique``): a device synchronisation
    per batch, which the training path must not have (``stage="train"``); evaluation keeps it.
    """
    kwargs = {"average": "micro", "validate_args": stage != "train"}
    metrics = {"acc": MulticlassAccuracy(num_classes, top_k=1, **kwargs)}
    if num_classes >= 5:
        metrics["acc_top5"] = MulticlassAccuracy(num_classes, top_k=5, **kwargs)
    return MetricCollection(metrics, prefix=f"{stage}/", compute_groups=False)


class _MeanPerImage(Metric):
    """The mean over images of a per-image loss of the logits (``image_losses``); its states are sums, reduced across
    ranks."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def image_losses(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def update(self, logits: torch.Tensor, target: torch.Tensor) -> None:
        self.total += self.image_losses(logits.double(), target).sum()
        self.count += target.numel()

    def compute(self) -> torch.Tensor:
        return self.total / self.count


class NegativeLogLikelihood(_MeanPerImage):
    """Mean ``-log p_y`` of the softmax of logits (nats)."""

    def image_losses(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits, target, reduction="none")


class BrierScore(_MeanPerImage):
    """Mean over images of ``sum_k (p_k - [k == y])^2`` (0 is perfect, 2 the worst)."""

    def image_losses(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        probs = logits.softmax(-1)
        return (probs - nn.functional.one_hot(target, probs.shape[-1]).double()).square().sum(-1)


class ReliabilityBins(Metric):
    """Per confidence bin: the images, the sum of their top-label confidences and of their correct answers.

    Bins are torchmetrics': ``[i / n, (i + 1) / n)``, a confidence of exactly 1 in the last one.
    """

    full_state_update = False

    def __init__(self, n_bins: int = N_BINS) -> None:
        super().__init__()
        self.n_bins = n_bins
        for name in ("count", "confidence", "correct"):
            self.add_state(name, torch.zeros(n_bins, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, target: torch.Tensor) -> None:
        confidence, pred = logits.float().softmax(-1).max(-1)
        index = (confidence * self.n_bins).long().clamp(0, self.n_bins - 1)
        self.count.index_add_(0, index, torch.ones_like(confidence, dtype=torch.float64))
        self.confidence.index_add_(0, index, confidence.double())
        self.correct.index_add_(0, index, pred.eq(target).double())

    def compute(self) -> dict[str, torch.Tensor]:
        return {"count": self.count, "confidence": self.confidence, "correct": self.correct}


class ClassificationMetrics(nn.Module):
    """Every evaluation metric of a classifier, updated batch by batch with logits (or log-probabilities).

    A module so that ``.to(device)`` moves its states; each metric syncs its states across DDP ranks in
    :meth:`compute` (torchmetrics), so every rank gets the numbers of the whole test set.

    Args:
        num_classes: Number of classes.
        n_bins: Confidence bins of ECE, MCE and the reliability diagram.
    """

    def __init__(self, num_classes: int, n_bins: int = N_BINS) -> None:
        super().__init__()
        self.num_classes, self.n_bins = num_classes, n_bins
        per_class = {"num_classes": num_classes, "average": None}
        self.metrics = nn.ModuleDict(
            {
                "accuracy": MulticlassAccuracy(num_classes, average="micro"),
                "precision": MulticlassPrecision(**per_class),
                "recall": MulticlassRecall(**per_class),
                "f1": MulticlassF1Score(**per_class),
                "confusion": MulticlassConfusionMatrix(num_classes),
                "nll": NegativeLogLikelihood(),
                "brier": BrierScore(),
                "ece": MulticlassCalibrationError(num_classes, n_bins=n_bins, norm="l1"),
                "mce": MulticlassCalibrationError(num_classes, n_bins=n_bins, norm="max"),
                "bins": ReliabilityBins(n_bins),
            }
        )
        if num_classes >= 5:
            self.metrics["top5"] = MulticlassAccuracy(num_classes, top_k=5, average="micro")

    @torch.no_grad()
    def update(self, logits: torch.Tensor, target: torch.Tensor) -> None:
        """Add a batch: ``logits`` ``(B, num_classes)`` (or log-probabilities), ``target`` ``(B,)`` class indices."""
        logits = logits.detach().float()
        probs = logits.softmax(-1)
        for name, metric in self.metrics.items():
            metric.update(logits if name in ("nll", "brier", "bins") else probs, target)

    def reset(self) -> None:
        for metric in self.metrics.values():
            metric.reset()

    def compute(self, class_names: Sequence[str] | None = None) -> dict[str, Any]:
        """The metrics of everything added so far (over every rank), as plain numbers and lists.

        Returns:
            ``num_images``, ``accuracy``, ``top5`` (with 5 classes or more), ``nll``, ``brier``, ``ece``, ``mce``,
            ``n_bins``, ``macro`` (precision, recall, F1), ``per_class`` (class, precision, recall, F1, support),
            ``confusion_matrix`` (counts, rows the true class), ``confusion_matrix_normalized`` (each row divided by
            its count) and ``reliability`` (:func:`reliability_table`).
        """
        values = {name: metric.compute() for name, metric in self.metrics.items()}
        confusion = values["confusion"].long()
        support = confusion.sum(1)
        names = list(class_names) if class_names is not None else [str(i) for i in range(self.num_classes)]
        per_class = [
            {
                "class": names[k],
                "precision": float(values["precision"][k]),
                "recall": float(values["recall"][k]),
                "f1": float(values["f1"][k]),
                "support": int(support[k]),
            }
            for k in range(self.num_classes)
        ]
        result: dict[str, Any] = {"num_images": int(support.sum()), "accuracy": float(values["accuracy"])}
        if "top5" in values:
            result["top5"] = float(values["top5"])
        result |= {name: float(values[name]) for name in ("nll", "brier", "ece", "mce")}
        result["n_bins"] = self.n_bins
        result["macro"] = {name: float(values[name].mean()) for name in ("precision", "recall", "f1")}
        result["per_class"] = per_class
        result["confusion_matrix"] = confusion.tolist()
        rows = confusion.double() / support.clamp(min=1).double()[:, None]
        result["confusion_matrix_normalized"] = [[round(float(v), 6) for v in row] for row in rows]
        result["reliability"] = reliability_table(**values["bins"])
        return result


def reliability_table(count: torch.Tensor, confidence: torch.Tensor, correct: torch.Tensor) -> dict[str, list]:
    """The reliability diagram's numbers per bin: ``lower`` / ``upper`` edges, ``count``, mean ``confidence``, mean
    ``accuracy`` and ``gap`` (confidence - accuracy: positive is over-confident); empty bins hold ``None``."""
    n_bins = len(count)
    mean = [
        (float(s / c), float(a / c)) if c > 0 else (None, None)
        for c, s, a in zip(count, confidence, correct, strict=True)
    ]
    return {
        "lower": [i / n_bins for i in range(n_bins)],
        "upper": [(i + 1) / n_bins for i in range(n_bins)],
        "count": [int(c) for c in count],
        "confidence": [m[0] for m in mean],
        "accuracy": [m[1] for m in mean],
        "gap": [None if m[0] is None else m[0] - m[1] for m in mean],
    }


__all__ = ["N_BINS", "BrierScore", "ClassificationMetrics", "NegativeLogLikelihood", "ReliabilityBins"]
