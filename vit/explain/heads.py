"""Which heads matter: the drop of the target logit and of accuracy when one head's output is mean-ablated.

For every block and head, the head's output (its slice of the attention's output before the projection ``attn.proj``)
is replaced by its mean over the images, token by token, and the images go through the model again: the drop of the
target class's logit (the clean prediction, or the class asked for) and of accuracy says how much the decision
depends on what that head computes for each image rather than on its average (mean ablation: Wang et al.,
"Interpretability in the Wild", 2022; Michel, Levy & Neubig, "Are Sixteen Heads Really Better than One?", NeurIPS
2019, zero the head instead). The heads of one block are ablated in one batched pass: the images are repeated once
per head, each copy with its own head replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter
from typing import Any

import torch
from torch import nn

from ..layers.utils import eval_mode
from .capture import attention_modules


@dataclass
class HeadImportance:
    """The effect of mean-ablating each head.

    Attributes:
        logit_drop: ``(blocks, heads)`` mean drop of the target logit (clean minus ablated; positive: the head helps).
        accuracy_drop: ``(blocks, heads)`` drop of accuracy in points of [0, 1], or ``None`` without labels.
        accuracy: The clean accuracy, or ``None`` without labels.
        num_images: Images measured.
        seconds: Wall time of the whole measurement.
    """

    logit_drop: torch.Tensor
    accuracy_drop: torch.Tensor | None
    accuracy: float | None
    num_images: int
    seconds: float

    def ranked(self) -> list[tuple[int, int, float]]:
        """``(block, head, logit drop)`` from the most important head to the least."""
        blocks, heads = self.logit_drop.shape
        order = self.logit_drop.flatten().argsort(descending=True, stable=True).tolist()
        return [(i // heads, i % heads, float(self.logit_drop.flatten()[i])) for i in order]

    def share_of_top(self, count: int) -> float:
        """The share of the summed positive logit drop that the ``count`` most important heads carry."""
        positive = self.logit_drop.clamp_min(0).flatten().sort(descending=True).values
        total = float(positive.sum())
        return float(positive[:count].sum()) / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "logit_drop": self.logit_drop.tolist(),
            "accuracy_drop": None if self.accuracy_drop is None else self.accuracy_drop.tolist(),
            "accuracy": self.accuracy, "num_images": self.num_images, "seconds": self.seconds,
        }  # fmt: skip

    def table(self, top: int = 10) -> str:
        """The ``top`` most important heads, one line each."""
        lines = [f"{'block':>5} {'head':>4} {'logit drop':>10} {'accuracy drop':>13}"]
        for block, head, drop in self.ranked()[:top]:
            accuracy = "" if self.accuracy_drop is None else f"{float(self.accuracy_drop[block, head]):+.3f}"
            lines.append(f"{block:>5} {head:>4} {drop:>+10.3f} {accuracy:>13}")
        count = min(3, self.logit_drop.numel())
        lines.append(f"the {count} most important heads carry {100 * self.share_of_top(count):.0f} % of the summed "
                     f"logit drop of all {self.logit_drop.numel()} heads")  # fmt: skip
        return "\n".join(lines)


def head_importance(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor | None = None,
    target: int | None = None,
    batch_size: int = 64,
) -> HeadImportance:
    """Mean-ablate every head of every block (see the module docstring); the model is left as it was.

    Args:
        model: A :class:`~vit.VisionTransformer` whose attention modules have ``num_heads``, ``head_dim`` and
            ``proj`` (every attention kind of :mod:`vit.layers`).
        images: ``(B, C, H, W)`` normalised as the model expects.
        labels: ``(B,)`` true classes, for the accuracy drop; optional.
        target: The class whose logit is measured; ``None``: each image's clean prediction.
        batch_size: Images per forward pass (each block's pass holds ``heads`` copies of them).
    """
    start = perf_counter()
    modules = attention_modules(model)
    device = next(model.parameters()).device
    images = images.to(device)
    captured: dict[int, list[torch.Tensor]] = {}

    def record(index: int):
        def hook(module: nn.Module, args: tuple) -> None:
            captured.setdefault(index, []).append(args[0].detach())

        return hook

    with eval_mode(model), torch.no_grad():
        handles = [attn.proj.register_forward_pre_hook(record(i)) for i, attn in enumerate(modules)]
        try:
            logits = torch.cat([model.forward(chunk) for chunk in images.split(batch_size)]).float()
        finally:
            for handle in handles:
                handle.remove()
        means = {i: torch.cat(parts).mean(dim=0) for i, parts in captured.items()}  # (tokens, dim) per block
        classes = logits.argmax(-1) if target is None else torch.full((len(images),), target, device=device)
        clean = logits.gather(1, classes[:, None])[:, 0]
        correct = None if labels is None else (logits.argmax(-1) == labels.to(device)).float()
        heads = max(int(attn.num_heads) for attn in modules)
        logit_drop = torch.zeros(len(modules), heads)
        accuracy_drop = None if labels is None else torch.zeros(len(modules), heads)
        for i, attn in enumerate(modules):
            H, d = int(attn.num_heads), int(attn.head_dim)

            def ablate(module: nn.Module, args: tuple, H: int = H, d: int = d, mean: torch.Tensor = means[i]):
                x = args[0].view(H, -1, *args[0].shape[1:])  # (heads, images, tokens, dim): copy h ablates head h
                x = x.clone()
                for h in range(H):
                    x[h, :, :, h * d : (h + 1) * d] = mean[:, h * d : (h + 1) * d]
                return (x.view(-1, *x.shape[2:]),)

            handle = attn.proj.register_forward_pre_hook(ablate)
            try:
                step = max(1, batch_size // H)
                ablated = torch.cat([model.forward(chunk.repeat(H, 1, 1, 1)).float().view(H, len(chunk), -1)
                                     for chunk in images.split(step)], dim=1)  # fmt: skip
            finally:
                handle.remove()
            target_logit = ablated.gather(2, classes[None, :, None].expand(H, -1, 1))[..., 0]  # (heads, images)
            logit_drop[i, :H] = (clean - target_logit).mean(1).cpu()
            if correct is not None:
                accuracy_drop[i, :H] = (correct - (ablated.argmax(-1) == labels.to(device)).float()).mean(1).cpu()
    accuracy = None if correct is None else float(correct.mean())
    return HeadImportance(logit_drop, accuracy_drop, accuracy, len(images), perf_counter() - start)
