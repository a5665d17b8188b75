"""Explain many images at once: rollout, attribution, per-head maps and faithfulness, as one :class:`Results`.

:func:`compute` is what ``vit explain`` runs between reading the images and writing the pictures; it takes a model
and pixels and returns everything on the CPU, so a notebook gets the same numbers as the command::

    results = compute(model, pixels, mean=mean, std=std, faithfulness=True)
    results.explanation.rollout, results.attribution, results.faithfulness["deletion_auc"]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from ..normalize import normalize
from .attribution import attention_attribution
from .faithfulness import RANDOM, Baseline, faithfulness
from .method_benchmark import MethodBenchmark
from .pipeline import Explanation, explain_images
from .rollout import HeadFusion, head_pool

Method = Literal["rollout", "attribution", "both"]


@dataclass
class Results:
    """Everything :func:`compute` measured, on the CPU.

    Attributes:
        explanation: All images (:meth:`Explanation.concat` of the batches); ``attentions`` is empty, the per-head
            maps of one block are kept instead (``head_maps``).
        attribution: ``(B, rows, cols)`` class-specific attribution, or ``None`` when not asked for.
        head_maps: ``(B, heads, rows, cols)`` each head's attention to the patches in block ``block``.
        block: The block of ``head_maps`` (a non-negative index).
        faithfulness: Deletion / insertion areas and curves (:func:`~vit.explain.faithfulness`), or ``None``.
        target: The class attributed; ``None``: each image's prediction.
        maps: Method name (:data:`~vit.explain.METHODS`) to its ``(B, rows, cols)`` patch maps, in the order shown;
            empty when only ``rollout`` and ``attribution`` were computed.
        benchmark: The method benchmark (:func:`~vit.explain.benchmark_methods`) the faithfulness came from, or
            ``None``.
    """

    explanation: Explanation
    attribution: torch.Tensor | None
    head_maps: torch.Tensor
    block: int
    faithfulness: dict | None
    target: int | None = None
    maps: dict[str, torch.Tensor] = field(default_factory=dict)
    benchmark: MethodBenchmark | None = None

    def shown_maps(self) -> dict[str, torch.Tensor]:
        """The maps to draw, by name: :attr:`maps`, or rollout and (when computed) attribution."""
        if self.maps:
            return dict(self.maps)
        shown = {"rollout": self.explanation.rollout}
        if self.attribution is not None:
            shown["attribution"] = self.attribution
        return shown


def benchmark_scores(bench: MethodBenchmark) -> dict[str, Any]:
    """A method benchmark in the layout of :func:`~vit.explain.faithfulness` (areas and curves per method, random
    last), which the report and the explorer read."""
    names = [name for name in bench.scores if name != RANDOM] + [RANDOM]
    scores: dict[str, Any] = {
        "fractions": list(bench.fractions), "num_images": bench.num_images, "steps": bench.steps,
        "baseline": bench.baseline, "num_random": bench.num_random,
    }  # fmt: skip
    for kind in ("deletion", "insertion"):
        scores[f"{kind}_auc"] = {name: getattr(bench.scores[name], f"{kind}_auc") for name in names}
        scores[f"{kind}_curve"] = {name: getattr(bench.scores[name], f"{kind}_curve") for name in names}
    return scores


def block_index(model: nn.Module, block: int) -> int:
    """``block`` as a non-negative index into ``model.blocks`` (``-1`` is the last).

    Raises:
        ValueError: If the model has no such block.
    """
    depth = len(model.blocks)
    index = block if block >= 0 else depth + block
    if not 0 <= index < depth:
        raise ValueError(f"block {block} out of range: the model has {depth} blocks")
    return index


def head_maps(attn: torch.Tensor, num_prefix_tokens: int, pooled_by_token: bool, grid: tuple[int, int]):
    """Per-head maps ``(B, heads, rows, cols)`` of one block: the class-token row, or the patch rows' mean."""
    P = num_prefix_tokens
    rows = attn[:, :, 0, P:] if pooled_by_token else attn[:, :, P:, P:].mean(dim=2)
    return rows.reshape(*rows.shape[:2], *grid)


def compute(
    model: nn.Module,
    pixels: torch.Tensor,
    *,
    mean: Sequence[float],
    std: Sequence[float],
    labels: torch.Tensor | None = None,
    class_names: Sequence[str] | None = None,
    method: Method = "both",
    target: int | None = None,
    block: int = -1,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    faithfulness_steps: int | None = None,
    baseline: Baseline = "mean",
    batch_size: int = 64,
) -> Results:
    """Explain ``pixels`` in batches of ``batch_size``, then measure faithfulness over all of them.

    Args:
        model: A :class:`~vit.VisionTransformer` in any mode (it is left as it was).
        pixels: ``(B, C, H, W)`` uint8 pixels at the model's input size (normalised here with ``mean`` / ``std``).
        mean: Per-channel mean in ``[0, 1]`` the model was trained with.
        std: Per-channel standard deviation.
        labels: ``(B,)`` true classes for the captions, or ``None``.
        class_names: Name of every class, or ``None``.
        method: Which maps: ``"rollout"``, ``"attribution"`` or ``"both"`` (the rollout is always computed).
        target: The class to attribute; ``None`` attributes each image's prediction.
        block: The block whose per-head maps are kept (``-1``: the last).
        head_fusion: How the rollout fuses heads (:func:`~vit.explain.attention_rollout`).
        discard_ratio: Fraction in ``[0, 1)`` of the weakest links the rollout drops per block.
        faithfulness_steps: Measure deletion / insertion with this many steps; ``None`` skips it.
        baseline: What removed patches become in the faithfulness curves (:func:`~vit.explain.faithfulness`).
        batch_size: Images per forward pass (faithfulness uses four times as many).

    Returns:
        The :class:`Results`.

    Raises:
        ValueError: If ``block`` or ``target`` does not exist in the model, or ``method`` is unknown.
    """
    if method not in ("rollout", "attribution", "both"):
        raise ValueError(f"method must be 'rollout', 'attribution' or 'both', got {method!r}")
    if target is not None and not 0 <= target < model.num_classes:
        raise ValueError(f"target {target} out of range: the model has {model.num_classes} classes")
    index = block_index(model, block)
    pooled_by_token = head_pool(model) == "token"
    parts, attributions, heads = [], [], []
    chunks = pixels.split(batch_size)
    label_chunks = labels.split(batch_size) if labels is not None else [None] * len(chunks)
    for chunk, chunk_labels in zip(chunks, label_chunks, strict=True):
        part = explain_images(
            model, chunk, labels=chunk_labels, class_names=class_names, mean=mean, std=std,
            head_fusion=head_fusion, discard_ratio=discard_ratio, statistics=True,
        )  # fmt: skip
        heads.append(head_maps(part.attentions[index], model.num_prefix_tokens, pooled_by_token,
                               model.patch_embed.grid_size))  # fmt: skip
        part.attentions = []  # one block's head maps are kept; every block's weights would not fit for many images
        parts.append(part)
        if method != "rollout":
            inputs = normalize(chunk, mean, std)
            attributions.append(attention_attribution(model, inputs, target=target).float().cpu())
    explanation = Explanation.concat(parts)
    attribution = torch.cat(attributions) if attributions else None
    scores = None
    if faithfulness_steps is not None:
        maps = {}
        if method != "attribution":
            maps["rollout"] = explanation.rollout
        if attribution is not None:
            maps["attribution"] = attribution
        inputs = normalize(pixels, mean, std)
        scores = faithfulness(model, inputs, maps, target=target, steps=faithfulness_steps, baseline=baseline,
                              batch_size=4 * batch_size)  # fmt: skip
    return Results(explanation, attribution, torch.cat(heads), index, scores, target)
