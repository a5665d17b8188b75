"""Faithfulness of relevance maps by perturbation: deletion and insertion curves and their areas.

Petsiuk, Das & Saenko, "RISE: Randomized Input Sampling for Explanation of Black-box Models" (BMVC 2018), and the
positive perturbation test of Chefer, Gur & Wolf, "Transformer Interpretability Beyond Attention Visualization"
(CVPR 2021). Patches are ordered most-relevant-first by a map. **Deletion** removes the first ``k`` of them and
records the softmax probability of the target class; **least-relevant-first** removes the last ``k`` first;
**insertion** starts from the image with every patch removed and reveals them, most relevant first. A faithful map
makes the deletion curve fall fast (low area), the least-relevant-first curve stay high, and the insertion curve rise
fast (high area). The symmetric relevance gain SRG = area(least-relevant-first) - area(deletion) (Blücher, Vielhaben &
Strodthoff, 2024) is the single number that stays stable across ways of removing a patch. How a patch is removed is
:mod:`vit.explain.removal`'s: the dataset mean, a blur, ROAD's noisy linear imputation, or dropping its token. A
random order, averaged over seeds, is the reference every map should beat.

Long work reports its progress on stderr when asked (``show_progress=True``, as captum's perturbation methods do;
:mod:`vit.explain.progress`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.utils import eval_mode
from ..text import plural
from .attribution import resolve_target
from .progress import Progress
from .removal import REMOVALS, Removal, drop_reason, kept_probabilities, road_impute

Baseline = Removal
"""What a removed patch becomes: ``"mean"``, ``"blur"``, ``"road"`` or ``"drop"`` (:mod:`vit.explain.removal`)."""
RANDOM = "random"
KINDS = ("deletion", "lerf", "insertion")
"""The curves: most relevant removed first, least relevant removed first, most relevant revealed first."""


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


def _removed(rank: torch.Tensor, kind: str, count: int) -> torch.Tensor:
    """``(B, patches)`` true where a patch is removed at ``count`` on the ``kind`` curve (``rank``: each patch's place
    in the order, most relevant first)."""
    n = rank.shape[1]
    if kind == "deletion":
        return rank < count
    if kind == "lerf":
        return rank >= n - count
    return rank >= count  # insertion: the first ``count`` revealed, the rest removed


def _pixels(removed: torch.Tensor, grid: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """A patch mask ``(B, patches)`` as a pixel mask ``(B, 1, H, W)``."""
    (grid_h, grid_w), (H, W) = grid, size
    mask = removed.view(-1, 1, grid_h, grid_w)
    return mask.repeat_interleave(H // grid_h, dim=2).repeat_interleave(W // grid_w, dim=3)


def _curves(
    model: nn.Module,
    images: torch.Tensor,
    removal: str,
    fill: torch.Tensor | None,
    order: torch.Tensor,
    grid: tuple[int, int],
    target: torch.Tensor,
    counts: list[int],
    batch_size: int,
    generator: torch.Generator | None = None,
    advance: Callable[[int], None] | None = None,
) -> dict[str, torch.Tensor]:
    """Each curve's probabilities ``(B, len(counts))``, patches taken in ``order`` ``(B, patches)``.

    Filled and imputed removals perturb the pixels: the copies of about ``batch_size / (3 · len(counts))`` images
    exist at a time. Token drop keeps the same number of patches in a forward pass: one pass per curve point and
    chunk of ``batch_size`` images. ``advance(n)`` is called as images are done.
    """
    B, _, H, W = images.shape
    rank = torch.empty_like(order)  # rank[b, p]: position of patch p in image b's order
    rank.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    views = [(kind, count) for kind in KINDS for count in counts]
    if not views:
        if advance is not None:
            advance(B)
        return {kind: images.new_empty(B, 0) for kind in KINDS}
    if removal == "drop":
        probs = torch.empty(B, len(views), device=images.device)
        for v, (kind, count) in enumerate(views):
            for start in range(0, B, batch_size):
                part = slice(start, start + batch_size)
                kept = ~_removed(rank[part], kind, count)  # as many on every row: the order's first or last ones
                keep = kept.float().argsort(dim=1, descending=True, stable=True)[:, : int(kept[0].sum())]
                probs[part, v] = kept_probabilities(model, images[part], keep, target[part])
        if advance is not None:
            advance(B)
    else:
        chunk, rows = max(1, batch_size // len(views)), []
        for start in range(0, B, chunk):
            part = slice(start, start + chunk)
            masks = torch.stack([_pixels(_removed(rank[part], kind, count), grid, (H, W)) for kind, count in views], 1)
            if removal == "road":  # one solve for every view of the chunk: its iterations are many small steps
                copies = images[part, None].expand(-1, len(views), -1, -1, -1)
                stacked = road_impute(copies.flatten(0, 1), masks.flatten(0, 1), generator=generator)
                stacked = stacked.view(-1, len(views), *images.shape[1:])
            else:
                stacked = torch.where(masks, fill[part, None], images[part, None])  # (b, views, C, H, W)
            rows.append(_probabilities(model, stacked.flatten(0, 1), target[part].repeat_interleave(len(views)),
                                       batch_size).view(-1, len(views)))  # fmt: skip
            if advance is not None:
                advance(len(stacked))
        probs = torch.cat(rows)
    return {kind: probs[:, k * len(counts) : (k + 1) * len(counts)] for k, kind in enumerate(KINDS)}


def _orders(
    maps: Mapping[str, torch.Tensor], B: int, n: int, num_random: int, device: torch.device
) -> dict[str, list[torch.Tensor]]:
    """Each map's patch order ``(B, n)``, most relevant first (ties: lower index first), and ``num_random`` random
    orders (seed ``s`` draws one ``torch.randperm`` per image, in image order)."""
    orders = {
        name: [m.reshape(B, n).to(device).float().argsort(dim=1, descending=True, stable=True)]
        for name, m in maps.items()
    }
    if num_random > 0:
        orders[RANDOM] = []
        for seed in range(num_random):
            seeded = torch.Generator().manual_seed(seed)
            orders[RANDOM].append(torch.stack([torch.randperm(n, generator=seeded) for _ in range(B)]).to(device))
    return orders


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
    """Deletion, least-relevant-first and insertion curves of each map and of random patch orders, their areas and
    the symmetric relevance gain.

    Patches are ranked by each map, most relevant first (ties: lower row-major index first). At the ``steps + 1``
    points ``k = 0 … steps`` the first ``round(k / steps · num_patches)`` patches are removed (deletion) or revealed
    (insertion), or the last ones removed (least-relevant-first); a removed patch goes as ``baseline`` says. The area
    under each curve is the trapezoid rule over the fraction of patches removed, in ``[0, 1]``, averaged over the
    images. ``random`` averages ``num_random``
    seeds; seed ``s`` (``0 … num_random - 1``) draws one ``torch.randperm`` per image in image order.

    Args:
        model: Classifier returning logits ``(B, classes)``; run in eval mode without gradients, flags restored.
        images: ``(B, C, H, W)`` normalised as the model expects.
        maps: Method name to relevance ``(B, grid_h, grid_w)``; the grid must divide the image. ``"random"`` is
            reserved.
        target: Class per image (tensor, list or int); ``None``: the prediction on the intact image.
        steps: Number of equal fractions; at least 1.
        baseline: How a patch is removed (:mod:`vit.explain.removal`): ``"mean"``: zero, the dataset mean after
            normalisation; ``"blur"``: the image blurred with a Gaussian of σ = half a patch; ``"road"``: ROAD's
            noisy linear imputation; ``"drop"``: its token leaves the sequence (global and linear attention only).
        num_random: Seeds of the random order; 0 for none.
        batch_size: Images per forward pass.
        show_progress: Report the curves of each map and of the random order on stderr (:class:`Progress`).

    Returns:
        ``{"deletion_auc": {method: float, "random": float}, "lerf_auc": {...}, "insertion_auc": {...}, "srg":
        {...}, "deletion_curve": {method: [steps + 1 floats]}, "lerf_curve": {...}, "insertion_curve": {...},
        "fractions": [...], "per_image": {"deletion_auc": {method: [B floats]}, "lerf_auc": {...}, "insertion_auc":
        {...}, "srg": {...}}, "target": [B ints], "num_images": B, "steps": steps, "baseline": baseline,
        "num_random": num_random}``.

    Raises:
        ValueError: On an empty or misshapen map, a grid that does not divide the image, a map named ``random``,
            ``steps < 1``, an unknown removal, token drop on a model that cannot drop tokens, or a target out of
            range.
    """
    grid_h, grid_w = _check(model, images, maps, steps, baseline, num_random)
    B, n = images.shape[0], grid_h * grid_w
    param = next(model.parameters(), None)
    if param is not None:
        images = images.to(param.device)
    generator = torch.Generator(device=images.device).manual_seed(0)  # ROAD's noise, the same on every call
    with eval_mode(model), torch.no_grad():
        target = resolve_target(target, model.forward(images).float())
        ends, fill = _ends(model, images, baseline, target, (grid_h, grid_w), batch_size)
        counts = removal_counts(n, steps)
        orders = _orders(maps, B, n, num_random, images.device)
        curves: dict[str, dict[str, torch.Tensor]] = {kind: {} for kind in KINDS}
        for name, candidates in orders.items():
            progress = Progress(name, B * len(candidates), show_progress)
            per_seed: dict[str, list[torch.Tensor]] = {kind: [] for kind in KINDS}
            for indices in candidates:
                inner = _curves(model, images, baseline, fill, indices, (grid_h, grid_w), target, counts[1:-1],
                                batch_size, generator, progress.update)  # fmt: skip
                for kind in KINDS:  # insertion runs from everything removed to the intact image
                    first, last = (ends[1], ends[0]) if kind == "insertion" else (ends[0], ends[1])
                    per_seed[kind].append(torch.cat([first[:, None], inner[kind], last[:, None]], dim=1))
            for kind in KINDS:
                curves[kind][name] = torch.stack(per_seed[kind])  # (seeds, B, steps + 1)
            seeds = f" x {len(candidates)} seed{'s' * (len(candidates) > 1)}" if name == RANDOM else ""
            done = f"deletion/insertion curves of {plural(B, 'image')}{seeds} ({steps} steps)"
            progress.close(f"{done} in {progress.seconds:.1f} s")

    result = _areas(curves, torch.tensor(counts, dtype=torch.float64) / n)
    result.update(target=target.tolist(), num_images=B, steps=steps, baseline=baseline, num_random=num_random)
    return result


def _check(
    model: nn.Module, images: torch.Tensor, maps: Mapping[str, torch.Tensor], steps: int, baseline: str, num_random: int
) -> tuple[int, int]:
    """The patch grid of :func:`faithfulness`' maps (the model's without maps), after checking its arguments.

    Raises:
        ValueError: As :func:`faithfulness` says.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if baseline not in REMOVALS:
        raise ValueError(f"baseline must be one of {', '.join(REMOVALS)} (how a patch is removed), got {baseline!r}")
    if baseline == "drop" and drop_reason(model) is not None:
        raise ValueError(f"token drop does not apply to this model: {drop_reason(model)}")
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
    return grid_h, grid_w


def _ends(
    model: nn.Module,
    images: torch.Tensor,
    baseline: str,
    target: torch.Tensor,
    grid: tuple[int, int],
    batch_size: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The target's probabilities ``(2, B)`` on the intact images and with every patch removed, and the fill that
    replaces a removed patch (``None`` for token drop)."""
    B, _, H, W = images.shape
    if baseline == "drop":
        empty = kept_probabilities(model, images, torch.empty(B, 0, dtype=torch.long), target)
        return torch.stack([_probabilities(model, images, target, batch_size), empty]), None
    if baseline == "blur":
        fill = gaussian_blur(images, sigma=max(H // grid[0], W // grid[1]) / 2)
    else:  # mean, and ROAD with nothing left to impute from
        fill = torch.zeros_like(images)
    return _probabilities(model, torch.cat([images, fill]), target.repeat(2), batch_size).view(2, B), fill


def _areas(curves: dict[str, dict[str, torch.Tensor]], fractions: torch.Tensor) -> dict[str, Any]:
    """The areas under ``curves`` (``{kind: {name: (seeds, B, steps + 1)}}``), their mean curves and the SRG,
    overall and per image, as :func:`faithfulness` returns them."""
    result: dict[str, Any] = {"per_image": {}}
    for kind, by_name in curves.items():
        aucs = {name: torch.trapezoid(c.double().cpu(), fractions, dim=-1).mean(0) for name, c in by_name.items()}
        result[f"{kind}_auc"] = {name: float(auc.mean()) for name, auc in aucs.items()}
        result[f"{kind}_curve"] = {name: c.double().mean((0, 1)).tolist() for name, c in by_name.items()}
        result["per_image"][f"{kind}_auc"] = {name: auc.tolist() for name, auc in aucs.items()}
    per_image, names = result["per_image"], list(curves["deletion"])
    per_image["srg"] = {
        name: [a - b for a, b in zip(per_image["lerf_auc"][name], per_image["deletion_auc"][name], strict=True)]
        for name in names
    }
    result["srg"] = {name: result["lerf_auc"][name] - result["deletion_auc"][name] for name in names}
    result["fractions"] = fractions.tolist()
    return result
