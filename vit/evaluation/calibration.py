"""Temperature scaling (Guo et al., "On Calibration of Modern Neural Networks", ICML 2017): one scalar ``T > 0``
divides the logits, ``p = softmax(z / T)``, fitted on held-out images by minimising the negative log-likelihood with
L-BFGS. The predicted class never changes; only the confidence does (``T > 1`` softens an over-confident model).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

TEMPERATURE_KEY = "temperature"
"""The entry of a checkpoint's inference description (:data:`vit.checkpoints.METADATA_KEY`) and of an export's
``config.json`` ``vit`` entry that holds the fitted temperature; absent means uncalibrated."""


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor, max_iter: int = 100) -> float:
    """The temperature that minimises the mean NLL of ``softmax(logits / T)`` on ``labels``.

    Optimised over ``log T`` (so ``T`` stays positive) by :class:`torch.optim.LBFGS` with a strong-Wolfe line search,
    in float64, starting at ``T = 1``.

    Args:
        logits: ``(N, num_classes)`` logits of held-out images (never those the calibration is reported on).
        labels: ``(N,)`` their classes.
        max_iter: L-BFGS iterations.

    Raises:
        ValueError: For no images, or logits and labels of different lengths.
    """
    if logits.ndim != 2 or len(logits) != len(labels) or len(labels) == 0:
        raise ValueError(f"fit_temperature needs (N, C) logits and N labels, N > 0: got {tuple(logits.shape)}, "
                         f"{tuple(labels.shape)}")  # fmt: skip
    logits, labels = logits.detach().double(), labels.detach().long()
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(logits / log_t.exp(), labels)
        loss.backward()
        return loss

    optimizer.step(closure)
    return float(log_t.detach().exp())


def calibration_summary(logits: torch.Tensor, labels: torch.Tensor, temperature: float, n_bins: int) -> dict[str, Any]:
    """NLL, Brier, ECE and MCE of ``logits`` before and after dividing them by ``temperature``.

    Returns:
        ``{"before": {...}, "after": {...}}``, each with ``nll``, ``brier``, ``ece``, ``mce``, ``accuracy`` and
        ``reliability`` (:meth:`vit.evaluation.ClassificationMetrics.compute`'s).
    """
    from .metrics import ClassificationMetrics

    out = {}
    for name, scale in (("before", 1.0), ("after", temperature)):
        metrics = ClassificationMetrics(logits.shape[1], n_bins)
        metrics.update(logits / scale, labels)
        full = metrics.compute()
        out[name] = {key: full[key] for key in ("accuracy", "nll", "brier", "ece", "mce", "reliability")}
    return out


__all__ = ["TEMPERATURE_KEY", "calibration_summary", "fit_temperature"]
