"""What a model makes of images: :class:`Explanation`, the one result type of :func:`~vit.explain.explain`.

Maps by method, predictions, attention and its statistics (entropy and mean attention distance per head,
Dosovitskiy et al., ICLR 2021, Fig. 7; collapse reports), per-head maps of one block and the faithfulness benchmark,
every tensor on the CPU; panels, the report, the explorer and the training callback read it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from ..normalize import denormalize
from .faithfulness import RANDOM
from .stats import CollapseReport

if TYPE_CHECKING:
    from .heads import HeadImportance
    from .method_benchmark import MethodBenchmark
    from .sanity import SanityReport
    from .tuning import GammaTuning


@dataclass
class Explanation:
    """What a model makes of images, on the CPU: what :func:`explain` returns.

    Attributes:
        images: ``(B, C, H, W)`` display pixels in ``[0, 1]`` at the model's input size.
        labels: ``(B,)`` true classes, or ``None``.
        probs: ``(B, num_classes)`` softmax probabilities.
        preds: ``(B,)`` predicted classes.
        attentions: One ``(B, heads, N, N)`` tensor per block (dense; zeros outside a window pattern), or empty
            when not kept (``keep_attentions=False``: every block's weights of many images would not fit).
        entropy: ``(blocks, heads)`` mean attention entropy in nats, or ``None`` without statistics.
        distance: ``(blocks, heads)`` mean attention distance in pixels, or ``None`` without statistics.
        collapse: Block index -> :class:`~vit.explain.CollapseReport` for every block (empty without statistics);
            a report is truthy when its block collapsed.
        class_names: Name of every class, or ``None`` (classes are then shown as numbers).
        pool_attention: ``(B, heads, latent_len, num_patches)`` cross-attention of an attention-pooling head
            (``global_pool="map"``) from its latent queries to the patch tokens, or ``None``.
        pool_entropy: ``(heads,)`` mean entropy in nats of the pooling head's rows, or ``None``.
        maps: Method name (:data:`~vit.explain.METHODS`) to its ``(B, rows, cols)`` patch map, in the order asked.
        target: The class the class-specific maps explain; ``None``: each image's prediction.
        head_maps: ``(B, heads, rows, cols)`` each head's attention to the patches in block :attr:`block` (the class
            token's row, or the patch rows' mean), or ``None``.
        block: The block of :attr:`head_maps` (a non-negative index), or ``None``.
        benchmarks: Removal (``"mean"``, ``"road"``, ``"drop"``, ...) to the method benchmark that measured the maps
            under it (:func:`~vit.explain.benchmark_removals`: deletion, least-relevant-first, insertion, SRG, ratios
            to random, intervals, time per image); empty without ``faithfulness``.
        sanity: The cascading randomisation of every method (:func:`~vit.explain.sanity.sanity_check`), or ``None``.
        heads: Each head's importance by mean ablation (:func:`~vit.explain.heads.head_importance`), or ``None``.
        tuning: Method name to the gamma rule chosen for it on held-out images (:func:`~vit.explain.tune_gamma`),
            with which its maps were drawn; empty when none was tuned.
    """

    images: torch.Tensor
    labels: torch.Tensor | None
    probs: torch.Tensor
    preds: torch.Tensor
    attentions: list[torch.Tensor]
    entropy: torch.Tensor | None
    distance: torch.Tensor | None
    collapse: dict[int, CollapseReport]
    class_names: list[str] | None
    pool_attention: torch.Tensor | None = None
    pool_entropy: torch.Tensor | None = None
    maps: dict[str, torch.Tensor] = field(default_factory=dict)
    target: int | None = None
    head_maps: torch.Tensor | None = None
    block: int | None = None
    benchmarks: dict[str, MethodBenchmark] = field(default_factory=dict)
    sanity: SanityReport | None = None
    heads: HeadImportance | None = None
    tuning: dict[str, GammaTuning] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.images)

    def class_name(self, index: int) -> str:
        """The name of class ``index`` (its number when names are unknown or it is out of range)."""
        if self.class_names is not None and 0 <= index < len(self.class_names):
            return str(self.class_names[index])
        return str(index)

    def captions(self) -> list[str]:
        """One caption per image: ``"true 3 · pred 7 (32 %)"``, or ``"pred 7 (32 %)"`` without labels."""
        confidence = self.probs.gather(1, self.preds[:, None])[:, 0].tolist()
        captions = []
        for i, (pred, prob) in enumerate(zip(self.preds.tolist(), confidence, strict=True)):
            text = f"pred {self.class_name(pred)} ({100 * prob:.0f} %)"
            if self.labels is not None and int(self.labels[i]) >= 0:  # -1: unknown label
                text = f"true {self.class_name(int(self.labels[i]))} · {text}"
            captions.append(text)
        return captions

    @property
    def rollout(self) -> torch.Tensor | None:
        """``(B, rows, cols)`` attention rollout, when it was asked for (``maps["rollout"]``)."""
        return self.maps.get("rollout")

    @property
    def benchmark(self) -> MethodBenchmark | None:
        """The benchmark under the first removal measured (the mean fill by default), or ``None``."""
        return next(iter(self.benchmarks.values()), None)

    @property
    def faithfulness(self) -> dict[str, Any] | None:
        """The first benchmark's areas and curves per method, random last (the layout of
        :func:`~vit.explain.faithfulness`, which the report and the explorer read), or ``None``."""
        return None if self.benchmark is None else benchmark_scores(self.benchmark)

    def select(self, index: slice | torch.Tensor | Sequence[int]) -> Explanation:
        """The explanation of some of the images (per-image tensors indexed; statistics and benchmark kept)."""

        def pick(value: torch.Tensor | None) -> torch.Tensor | None:
            return None if value is None else value[index]

        return replace(
            self, images=self.images[index], labels=pick(self.labels), probs=self.probs[index],
            preds=self.preds[index], attentions=[attn[index] for attn in self.attentions],
            pool_attention=pick(self.pool_attention), maps={k: v[index] for k, v in self.maps.items()},
            head_maps=pick(self.head_maps),
        )  # fmt: skip

    @property
    def collapsed_blocks(self) -> list[int]:
        """Indices of the blocks whose every head is near-uniform or near-one-hot."""
        return sorted(i for i, report in self.collapse.items() if report)

    @property
    def max_distance(self) -> float:
        """The image diagonal in pixels: the largest possible attention distance."""
        height, width = self.images.shape[-2:]
        return math.hypot(height, width)

    @classmethod
    def concat(cls, parts: Sequence[Explanation]) -> Explanation:
        """One explanation of the images of all ``parts`` (batches of one model, in order).

        Per-image tensors are concatenated; entropy, distance and the pooling head's entropy are the means over all
        images (each part weighted by its number of images); the collapse reports are merged exactly
        (:meth:`~vit.explain.CollapseReport.merge`). ``attentions`` is kept only when every part kept it; the maps and
        head maps are concatenated; a benchmark (measured over all images, not per part) is not kept.

        Raises:
            ValueError: If ``parts`` is empty, or the parts differ in class names, statistics, labels or maps.
        """
        if not parts:
            raise ValueError("no explanations to concatenate")
        first = parts[0]
        for part in parts[1:]:
            if part.class_names != first.class_names:
                raise ValueError("cannot concatenate explanations with different class names")
            if (part.entropy is None) != (first.entropy is None) or (part.labels is None) != (first.labels is None):
                raise ValueError("cannot concatenate explanations with and without statistics or labels")
            if list(part.maps) != list(first.maps) or (part.head_maps is None) != (first.head_maps is None):
                raise ValueError("cannot concatenate explanations of different maps")
        sizes = torch.tensor([len(part) for part in parts], dtype=torch.float32)

        def cat(name: str) -> torch.Tensor | None:
            values = [getattr(part, name) for part in parts]
            return None if values[0] is None else torch.cat(values)

        def mean(name: str) -> torch.Tensor | None:
            values = [getattr(part, name) for part in parts]
            if values[0] is None:
                return None
            weights = sizes.reshape(-1, *([1] * values[0].ndim))
            return (torch.stack(values) * weights).sum(dim=0) / sizes.sum()

        kept = all(part.attentions for part in parts)
        return cls(
            images=torch.cat([part.images for part in parts]),
            labels=cat("labels"),
            probs=torch.cat([part.probs for part in parts]),
            preds=torch.cat([part.preds for part in parts]),
            attentions=[torch.cat(block) for block in zip(*(p.attentions for p in parts), strict=True)] if kept else [],
            entropy=mean("entropy"),
            distance=mean("distance"),
            collapse={i: CollapseReport.merge([part.collapse[i] for part in parts]) for i in first.collapse},
            class_names=first.class_names,
            pool_attention=cat("pool_attention"),
            pool_entropy=mean("pool_entropy"),
            maps={name: torch.cat([part.maps[name] for part in parts]) for name in first.maps},
            target=first.target,
            head_maps=cat("head_maps"),
            block=first.block,
        )

    def metrics(self, prefix: str = "attn") -> dict[str, float]:
        """Scalars for a logger: ``{prefix}/entropy/block_{i}`` (nats) and ``{prefix}/distance/block_{i}``
        (pixels), means over heads, ``{prefix}/collapsed_blocks``, and ``{prefix}/entropy/pool`` for an
        attention-pooling head; empty without statistics."""
        if self.entropy is None or self.distance is None:
            return {}
        values: dict[str, float] = {}
        for i, (entropy, distance) in enumerate(
            zip(self.entropy.mean(dim=1).tolist(), self.distance.mean(dim=1).tolist(), strict=True)
        ):
            values[f"{prefix}/entropy/block_{i}"] = entropy
            values[f"{prefix}/distance/block_{i}"] = distance
        values[f"{prefix}/collapsed_blocks"] = float(len(self.collapsed_blocks))
        if self.pool_entropy is not None:
            values[f"{prefix}/entropy/pool"] = float(self.pool_entropy.mean())
        return values


def display_pixels(
    images: torch.Tensor, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
) -> torch.Tensor:
    """Pixels in ``[0, 1]`` to show: uint8 images divided by 255; normalised float images un-normalised with
    ``mean`` / ``std`` (each image stretched to ``[0, 1]`` when they are unknown). Float32 on the CPU."""
    images = images.detach().cpu()
    if not images.is_floating_point():
        return images.float() / 255.0
    images = images.float()
    if mean is not None and std is not None:
        return denormalize(images, mean, std)
    low = images.amin(dim=(-3, -2, -1), keepdim=True)
    high = images.amax(dim=(-3, -2, -1), keepdim=True)
    return (images - low) / (high - low).clamp_min(1e-12)


def benchmark_scores(bench: MethodBenchmark) -> dict[str, Any]:
    """A method benchmark in the layout of :func:`~vit.explain.faithfulness` (areas and curves per method, random
    last), which the report and the explorer read."""
    names = [name for name in bench.scores if name != RANDOM] + [RANDOM]
    scores: dict[str, Any] = {
        "fractions": list(bench.fractions), "num_images": bench.num_images, "steps": bench.steps,
        "baseline": bench.baseline, "num_random": bench.num_random,
    }  # fmt: skip
    for kind in ("deletion", "lerf", "insertion"):
        scores[f"{kind}_auc"] = {name: getattr(bench.scores[name], f"{kind}_auc") for name in names}
        scores[f"{kind}_curve"] = {name: getattr(bench.scores[name], f"{kind}_curve") for name in names}
    scores["srg"] = {name: bench.scores[name].srg for name in names}
    return scores
