"""Faithfulness of relevance maps by perturbation: deletion and insertion curves and their areas.

Petsiuk, Das & Saenko, "RISE: Randomized Input Sampling for Explanation of Black-box Models" (BMVC 2018), and the
positive perturbation test of Chefer, Gur & Wolf, "Transformer Interpretability Beyond Attention Visualization"
(CVPR 2021). Patches are ordered most-relevant-first by a map. **Deletion** replaces the first ``k`` of them by a
baseline and records the softmax probability of the target class; **insertion** starts from the baseline image and
reveals them. A faithful map makes the deletion curve fall fast (low area) and the insertion curve rise fast (high
area). A random order, averaged over seeds, is the reference every map should beat.

Long work reports its progress on stderr when asked (``show_progress=True``, as captum's perturbation methods do;
:mod:`vit.explain.progress`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.utils import eval_mode
from .attribution import resolve_target
from .progress import Progress

Baseline = Literal["mean", "blur"]
RANDOM = "random"


def gaussian_blur(images: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of ``(B, C, H, W)`` images, radius ``ceil(3σ)``, edges replicated."""
    radius = max(1, math.ceil(3 * sigma))
    x = torch.arange(-radius, radius + 1, dtype=images.dtype, device=images.device)
    kernel = torch.exp(-(x**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    C = images.shape[1]
    out = F.pad(images, (radius, radius, radius, radius), mode="replicate")
    out = F.conv2d(out, kernel.view(1, 1, 1, -1).expand(C, 1, 1, -1), groups=C)  # along the width
    return F.conv2d(out, kernel.view(1, 1, -1, 1).expand(C, 1, -1, 1), groups=C)  # along the height


def removal_counts(num_patches: int, steps: int) -> list[int]:
    """Patches removed at each of the ``steps + 1`` points: ``round(k / steps · num_patches)``, halves up."""
    return [(2 * k * num_patches + steps) // (2 * steps) for k in range(steps + 1)]


def _probabilities(model: nn.Module, images: torch.Tensor, target: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Softmax probability of ``target`` for each image, in chunks of ``batch_size``."""
    probs = [
        model.forward(chunk).float().softmax(dim=-1).gather(1, t[:, None])[:, 0]
        for chunk, t in zip(images.split(batch_size), target.split(batch_size), strict=True)
    ]
    return torch.cat(probs)


def _curves(
    model: nn.Module,
    images: torch.Tensor,
    baseline: torch.Tensor,
    order: torch.Tensor,
    grid: tuple[int, int],
    target: torch.Tensor,
    counts: list[int],
    batch_size: int,
    advance: Callable[[int], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deletion and insertion probabilities ``(B, len(counts))``, patches taken in ``order`` ``(B, patches)``.

    The perturbed copies of about ``batch_size / (2 · len(counts))`` images exist at a time; ``advance(n)`` is
    called after each such chunk of ``n`` images.
    """
    B, _, H, W = images.shape
    grid_h, grid_w = grid
    steps = len(counts)
    if not steps:
        if advance is not None:
            advance(B)
        return images.new_empty(B, 0), images.new_empty(B, 0)
    rank = torch.empty_like(order)  # rank[b, p]: position of patch p in image b's order
    rank.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    chunk = max(1, batch_size // (2 * steps))
    probs = []
    for start in range(0, B, chunk):
        part = slice(start, start + chunk)
        deleted, inserted = [], []
        for count in counts:
            removed = (rank[part] < count).view(-1, 1, grid_h, grid_w)
            removed = removed.repeat_interleave(H // grid_h, dim=2).repeat_interleave(W // grid_w, dim=3)
            deleted.append(torch.where(removed, baseline[part], images[part]))
            inserted.append(torch.where(removed, images[part], baseline[part]))
        stacked = torch.cat([torch.stack(deleted, 1), torch.stack(inserted, 1)], dim=1)  # (b, 2 · steps, C, H, W)
        probs.append(
            _probabilities(model, stacked.flatten(0, 1), target[part].repeat_interleave(2 * steps), batch_size)
        )
        if advance is not None:
            advance(len(stacked))
    probs = torch.cat(probs).view(B, 2 * steps)
    return probs[:, :steps], probs[:, steps:]


def faithfulness(
    model: nn.Module,
    images: torch.Tensor,
    maps: Mapping[str, torch.Tensor],
    target: Any = None,
    steps: int = 10,
    baseline: Baseline = "mean",
    num_random: int = 5,
    batch_size: int = 256,
    show_progress: bool = False,
) -> dict[str, Any]:
    """Deletion and insertion curves of each map, and of random patch orders, with their areas.

    Patches are ranked by each map, most relevant first (ties: lower row-major index first). At the ``steps + 1``
    points ``k = 0 … steps`` the first ``round(k / steps · num_patches)`` patches are removed (deletion) or revealed
    (insertion); a removed patch takes the baseline. The area under each curve is the trapezoid rule over the
    fraction of patches removed, in ``[0, 1]``, averaged over the images. ``random`` averages ``num_random``
    seeds; seed ``s`` (``0 … num_random - 1``) draws one ``torch.randperm`` per image in image order.

    Args:
        model: Classifier returning logits ``(B, classes)``; run in eval mode without gradients, flags restored.
        images: ``(B, C, H, W)`` normalised as the model expects.
        maps: Method name to relevance ``(B, grid_h, grid_w)``; the grid must divide the image. ``"random"`` is
            reserved.
        target: Class per image (tensor, list or int); ``None``: the prediction on the intact image.
        steps: Number of equal fractions; at least 1.
        baseline: ``"mean"``: zero, the dataset mean after normalisation; ``"blur"``: the image blurred with a
            Gaussian of σ = half a patch.
        num_random: Seeds of the random order; 0 for none.
        batch_size: Images per forward pass.
        show_progress: Report the curves of each map and of the random order on stderr (:class:`Progress`).

    Returns:
        ``{"deletion_auc": {method: float, "random": float}, "insertion_auc": {...}, "deletion_curve":
        {method: [steps + 1 floats]}, "insertion_curve": {...}, "fractions": [...], "per_image": {"deletion_auc":
        {method: [B floats]}, "insertion_auc": {...}}, "target": [B ints], "num_images": B, "steps": steps,
        "baseline": baseline, "num_random": num_random}``.

    Raises:
        ValueError: On an empty or misshapen map, a grid that does not divide the image, a map named ``random``,
            ``steps < 1``, an unknown baseline or a target out of range.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if baseline not in ("mean", "blur"):
        raise ValueError(f"baseline must be 'mean' or 'blur', got {baseline!r}")
    if RANDOM in maps:
        raise ValueError(f"the map name {RANDOM!r} is reserved for the random order")
    if not maps and num_random <= 0:
        raise ValueError("nothing to measure: give at least one map or num_random > 0")
    B, _, H, W = images.shape
    grids = {tuple(m.shape) for m in maps.values()}
    if len(grids) > 1 or any(len(g) != 3 or g[0] != B for g in grids):
        raise ValueError(f"maps must all be (B={B}, grid_h, grid_w), got {sorted(grids)}")
    if grids:
        (_, grid_h, grid_w) = grids.pop()
    else:
        grid_h, grid_w = model.patch_embed.grid_size
    if H % grid_h or W % grid_w:
        raise ValueError(f"a {grid_h}x{grid_w} grid does not divide {H}x{W} images")
    n = grid_h * grid_w

    param = next(model.parameters(), None)
    if param is not None:
        images = images.to(param.device)
    with eval_mode(model), torch.no_grad():
        intact = model.forward(images).float()
        target = resolve_target(target, intact)
        if baseline == "mean":
            fill = torch.zeros_like(images)
        else:
            fill = gaussian_blur(images, sigma=max(H // grid_h, W // grid_w) / 2)
        ends = _probabilities(model, torch.cat([images, fill]), target.repeat(2), batch_size).view(2, B)
        counts = removal_counts(n, steps)
        orders: dict[str, list[torch.Tensor]] = {
            name: [m.reshape(B, n).to(images.device).float().argsort(dim=1, descending=True, stable=True)]
            for name, m in maps.items()
        }
        if num_random > 0:
            orders[RANDOM] = []
            for seed in range(num_random):
                generator = torch.Generator().manual_seed(seed)
                perms = torch.stack([torch.randperm(n, generator=generator) for _ in range(B)])
                orders[RANDOM].append(perms.to(images.device))
        curves: dict[str, dict[str, torch.Tensor]] = {"deletion": {}, "insertion": {}}
        for name, candidates in orders.items():
            progress = Progress(name, B * len(candidates), show_progress)
            per_seed_del, per_seed_ins = [], []
            for indices in candidates:
                inner_del, inner_ins = _curves(
                    model, images, fill, indices, (grid_h, grid_w), target, counts[1:-1], batch_size, progress.update
                )
                per_seed_del.append(torch.cat([ends[0, :, None], inner_del, ends[1, :, None]], dim=1))
                per_seed_ins.append(torch.cat([ends[1, :, None], inner_ins, ends[0, :, None]], dim=1))
            curves["deletion"][name] = torch.stack(per_seed_del)  # (seeds, B, steps + 1)
            curves["insertion"][name] = torch.stack(per_seed_ins)
            seeds = f" x {len(candidates)} seed{'s' * (len(candidates) > 1)}" if name == RANDOM else ""
            done = f"deletion/insertion curves of {B} images{seeds} ({steps} steps)"
            progress.close(f"{done} in {progress.seconds:.1f} s")

    fractions = torch.tensor(counts, dtype=torch.float64) / n
    result: dict[str, Any] = {"per_image": {}}
    for kind, by_name in curves.items():
        aucs = {name: torch.trapezoid(c.double().cpu(), fractions, dim=-1).mean(0) for name, c in by_name.items()}
        result[f"{kind}_auc"] = {name: float(auc.mean()) for name, auc in aucs.items()}
        result[f"{kind}_curve"] = {name: c.double().mean((0, 1)).tolist() for name, c in by_name.items()}
        result["per_image"][f"{kind}_auc"] = {name: auc.tolist() for name, auc in aucs.items()}
    result.update(
        fractions=fractions.tolist(),
        target=target.tolist(),
        num_images=B,
        steps=steps,
        baseline=baseline,
        num_random=num_random,
    )
    return result
