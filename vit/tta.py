"""Test-time augmentation: class probabilities averaged over mirrored and shifted views of each image.

The views are airbench's mirror-and-translate views (Keller Jordan, "94% on CIFAR-10 in 3.29 seconds on a single
GPU", 2024), which shift by 1 px and average logits; here the shift is 1/16 of the side and the probabilities
(not the logits) are averaged with equal weights.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

TestTimeAugment = Literal["none", "flip", "flip_translate"]


def views(x: torch.Tensor, mode: TestTimeAugment) -> list[torch.Tensor]:
    """The images ``(B, C, H, W)`` as ``mode`` sees them, the images alone first.

    Args:
        x: Normalised images.
        mode: ``"none"``, the images alone; ``"flip"``, also their mirror images; ``"flip_translate"``, those two and
            each shifted diagonally by ±1/16 of the side (2 px at 32 px, reflect-padded as the training crop), six
            views.
    """
    out = [x]
    if mode != "none":
        out.append(x.flip(-1))
    if mode == "flip_translate":
        height, width = x.shape[-2:]
        dy, dx = max(1, round(height / 16)), max(1, round(width / 16))
        padded = F.pad(torch.cat(out[:2]), (dx, dx, dy, dy), mode="reflect")
        for y, x0 in ((0, 0), (2 * dy, 2 * dx)):  # shifted down-right, then up-left
            out.extend(padded[..., y : y + height, x0 : x0 + width].chunk(2))
    return out


def averaged_logits(model: nn.Module, x: torch.Tensor, mode: TestTimeAugment) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of the images alone, and the log of the mean class probabilities over ``mode``'s :func:`views`
    (the same tensor as the first when ``mode`` is ``"none"``).

    Args:
        model: Images ``(B, C, H, W)`` to logits ``(B, num_classes)``.
        x: Normalised images.
        mode: See :func:`views`.
    """
    logits = model(x)
    others = views(x, mode)[1:]
    if not others:
        return logits, logits
    log_probs = [logits.log_softmax(-1)] + [model(view).log_softmax(-1) for view in others]
    return logits, torch.logsumexp(torch.stack(log_probs), dim=0) - math.log(len(others) + 1)  # log of the mean
