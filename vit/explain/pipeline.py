"""One explanation of a batch: predictions, attention, rollout, attention statistics, from one forward pass.

Attention rollout is Abnar & Zuidema, "Quantifying Attention Flow in Transformers" (ACL 2020); entropy and mean
attention distance per head follow Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021, Fig. 7).
:func:`explain_images` runs the model once, recording every block's attention on the way
(:func:`~vit.explain.record_attention`), and hands back an :class:`Explanation` that panels
(:mod:`vit.explain.panels`), the training callback and the scripts all read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..normalize import denormalize, normalize
from .capture import eval_mode, record_attention
from .rollout import HeadFusion, rollout_grid
from .stats import CollapseReport, attention_statistics, detect_collapse, row_entropy


@dataclass
class Explanation:
    """What a model makes of a batch of images, on the CPU.

    Attributes:
        images: ``(B, C, H, W)`` display pixels in ``[0, 1]`` at the model's input size.
        labels: ``(B,)`` true classes, or ``None``.
        probs: ``(B, num_classes)`` softmax probabilities.
        preds: ``(B,)`` predicted classes.
        attentions: One ``(B, heads, N, N)`` tensor per block (dense; zeros outside a window pattern).
        rollout: ``(B, rows, cols)`` raw attention rollout on the patch grid.
        entropy: ``(blocks, heads)`` mean attention entropy in nats, or ``None`` without statistics.
        distance: ``(blocks, heads)`` mean attention distance in pixels, or ``None`` without statistics.
        collapse: Block index -> :class:`~vit.explain.CollapseReport` for every block (empty without statistics);
            a report is truthy when its block collapsed.
        class_names: Name of every class, or ``None`` (classes are then shown as numbers).
        pool_attention: ``(B, heads, latent_len, num_patches)`` cross-attention of an attention-pooling head
            (``global_pool="map"``) from its latent queries to the patch tokens, or ``None``.
        pool_entropy: ``(heads,)`` mean entropy in nats of the pooling head's rows, or ``None``.
    """

    images: torch.Tensor
    labels: torch.Tensor | None
    probs: torch.Tensor
    preds: torch.Tensor
    attentions: list[torch.Tensor]
    rollout: torch.Tensor
    entropy: torch.Tensor | None
    distance: torch.Tensor | None
    collapse: dict[int, CollapseReport]
    class_names: list[str] | None
    pool_attention: torch.Tensor | None = None
    pool_entropy: torch.Tensor | None = None

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
        (:meth:`~vit.explain.CollapseReport.merge`). ``attentions`` is kept only when every part kept it.

        Raises:
            ValueError: If ``parts`` is empty, or the parts differ in class names, statistics or labels.
        """
        if not parts:
            raise ValueError("no explanations to concatenate")
        first = parts[0]
        for part in parts[1:]:
            if part.class_names != first.class_names:
                raise ValueError("cannot concatenate explanations with different class names")
            if (part.entropy is None) != (first.entropy is None) or (part.labels is None) != (first.labels is None):
                raise ValueError("cannot concatenate explanations with and without statistics or labels")
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
            rollout=torch.cat([part.rollout for part in parts]),
            entropy=mean("entropy"),
            distance=mean("distance"),
            collapse={i: CollapseReport.merge([part.collapse[i] for part in parts]) for i in first.collapse},
            class_names=first.class_names,
            pool_attention=cat("pool_attention"),
            pool_entropy=mean("pool_entropy"),
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


@torch.no_grad()
def explain_images(
    model: nn.Module,
    images: torch.Tensor,
    *,
    labels: torch.Tensor | Sequence[int] | None = None,
    class_names: Sequence[str] | None = None,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    statistics: bool = True,
    uniform_threshold: float = 0.98,
    one_hot_threshold: float = 0.05,
) -> Explanation:
    """Explain a batch with one forward pass: probabilities, every block's attention, its rollout and statistics.

    The model runs once, in eval mode under ``torch.no_grad()``, while :func:`~vit.explain.record_attention`
    records each block's attention (and an attention-pooling head's cross-attention, from which the rollout of a
    ``global_pool="map"`` model is read: :func:`~vit.explain.attention_rollout`); the model is left as it was
    (every module's ``training`` flag, no hooks, no gradients).

    Args:
        model: A :class:`~vit.VisionTransformer` (blocks with ``attn.attention_weights``, ``patch_embed``,
            ``num_prefix_tokens``).
        images: ``(B, C, H, W)`` uint8 pixels (normalised here, once, with ``mean`` / ``std``; displayed as they
            are) or float images already normalised as the model expects (un-normalised for display).
        labels: ``(B,)`` true classes for the captions (``-1`` = unknown), or ``None``.
        class_names: Name of every class, or ``None``.
        mean: Per-channel mean in ``[0, 1]`` of the normalisation, or ``None`` for float images of unknown
            normalisation (then each is stretched to ``[0, 1]`` for display).
        std: Per-channel standard deviation of the normalisation, or ``None`` (as ``mean``).
        head_fusion: How a block's heads are fused in the rollout (:func:`~vit.explain.attention_rollout`).
        discard_ratio: Fraction in ``[0, 1)`` of the weakest patch-key entries dropped per block in the rollout.
        statistics: Also compute entropy, mean attention distance and a collapse report per block.
        uniform_threshold: Normalised entropy at or above which a head counts as near-uniform
            (:func:`~vit.explain.detect_collapse`).
        one_hot_threshold: Normalised entropy at or below which a head counts as near-one-hot.

    Returns:
        An :class:`Explanation`, every tensor on the CPU.

    Raises:
        ValueError: If ``images`` is not a ``(B, C, H, W)`` batch, uint8 images come without ``mean`` / ``std``,
            ``labels`` has the wrong length, or the model does not expose its attention.
    """
    if images.ndim != 4:
        raise ValueError(f"images must be a (B, C, H, W) batch, got shape {tuple(images.shape)}")
    if not images.is_floating_point() and (mean is None or std is None):
        raise ValueError(f"{images.dtype} images need the mean and std to normalise them for the model")
    if labels is not None:
        labels = torch.as_tensor(labels).detach().cpu().long().reshape(-1)
        if len(labels) != len(images):
            raise ValueError(f"got {len(labels)} labels for {len(images)} images: pass one label per image")
    param = next(model.parameters())
    inputs = images.to(param.device)
    if not inputs.is_floating_point():
        inputs = normalize(inputs, mean, std)
    inputs = inputs.to(param.dtype)

    with eval_mode(model), record_attention(model) as attentions:
        # The one forward pass; the hooks record each block's attention on the way. ``forward`` rather than
        # ``__call__``: after ``model.compile()`` the call is compiled, and the recording hooks must run eagerly.
        logits = model.forward(inputs)
    probs = logits.float().softmax(dim=-1)
    rollout = rollout_grid(model, attentions, head_fusion, discard_ratio)
    entropy = distance = pool_entropy = None
    pool_attention = attentions.pool
    collapse: dict[int, CollapseReport] = {}
    if statistics:
        stats = attention_statistics(
            attentions, model.patch_embed.grid_size, model.patch_embed.patch_size, model.num_prefix_tokens
        )
        entropy, distance = stats["entropy"].cpu(), stats["distance"].cpu()
        collapse = {
            i: detect_collapse(attn, uniform_threshold=uniform_threshold, one_hot_threshold=one_hot_threshold)
            for i, attn in enumerate(attentions)
        }
        if pool_attention is not None:
            pool_entropy = row_entropy(pool_attention).mean(dim=(0, 2)).cpu()  # (heads,)
    return Explanation(
        images=display_pixels(images, mean, std),
        labels=labels,
        probs=probs.cpu(),
        preds=probs.argmax(dim=-1).cpu(),
        attentions=[attn.float().cpu() for attn in attentions],
        rollout=rollout.float().cpu(),
        entropy=entropy,
        distance=distance,
        collapse=collapse,
        class_names=list(class_names) if class_names is not None else None,
        pool_attention=pool_attention.float().cpu() if pool_attention is not None else None,
        pool_entropy=pool_entropy,
    )
