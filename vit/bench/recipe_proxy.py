"""The recipe suite's proxy, besides its training loop: the images it trains on (a folder of JPEGs, or
scikit-learn's digits), their augmentation, and the probes of one step (attention logits and entropy per block,
gradient norms, update/weight ratios, held-out accuracy). :mod:`vit.bench.recipe_suite` trains and reports.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vit.bench.harness import BenchError, autocast
from vit.models import VisionTransformer

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


def load_images(
    data_dir: str | None, max_images: int, seed: int = 0, img_size: int = 32
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Training images as one uint8 ``(N, 3, img_size, img_size)`` tensor, their labels, and what they are.

    Args:
        data_dir: A folder with ``train/<class>/*.jpg`` (or ``<class>/*.jpg``); ``None``: scikit-learn's 8 x 8
            digits, upscaled to ``img_size`` and repeated over three channels.
        max_images: A random subset of at most this many files is decoded.
        seed: Seed of the subset.
        img_size: Side the images are resized to when they differ.

    Raises:
        BenchError: If the folder holds no class folders with images.
    """
    if data_dir is None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.from_numpy(digits.images).float()[:, None] / 16.0  # (N, 1, 8, 8) in [0, 1]
        x = F.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False)
        images = (x.clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1).contiguous()
        labels = torch.from_numpy(digits.target).long()
        keep = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))[:max_images]
        return (
            images[keep],
            labels[keep],
            f"scikit-learn digits upscaled to {img_size}x{img_size} RGB (no --data.data_dir)",
        )
    import numpy as np
    from PIL import Image

    root = Path(data_dir)
    root = root / "train" if (root / "train").is_dir() else root
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    files = [(f, c) for c, name in enumerate(classes) for f in sorted((root / name).glob("*")) if f.is_file()]
    if not files:
        raise BenchError(f"--data.data_dir {data_dir}: no <class>/<image> files under {root}")
    files = random.Random(seed).sample(files, min(max_images, len(files)))
    images = torch.empty(len(files), 3, img_size, img_size, dtype=torch.uint8)
    for i, (path, _) in enumerate(files):
        with Image.open(path) as img:
            img = img.convert("RGB")
            if img.size != (img_size, img_size):
                img = img.resize((img_size, img_size), Image.BILINEAR)
            images[i] = torch.from_numpy(np.array(img)).permute(2, 0, 1)
    labels = torch.tensor([c for _, c in files])
    return images, labels, f"{len(files)} random images of {root} ({len(classes)} classes)"


def augment(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random crop after 4-pixel reflect padding, and horizontal flip, of a uint8 batch; returns normalised floats."""
    B, _, H, W = images.shape
    x = images.float().div_(255)
    mean = torch.tensor(CIFAR_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD, device=x.device).view(1, 3, 1, 1)
    x = F.pad((x - mean) / std, (4, 4, 4, 4), mode="reflect")
    dy, dx = (torch.randint(0, 9, (2, B), generator=generator)).tolist()
    flip = torch.rand(B, generator=generator) < 0.5
    out = torch.stack([x[i, :, dy[i] : dy[i] + H, dx[i] : dx[i] + W] for i in range(B)])
    return torch.where(flip.view(B, 1, 1, 1).to(x.device), out.flip(-1), out)


def normalize(images: torch.Tensor) -> torch.Tensor:
    """A uint8 batch as normalised floats, without augmentation (the probe batch)."""
    mean = torch.tensor(CIFAR_MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD, device=images.device).view(1, 3, 1, 1)
    return (images.float() / 255 - mean) / std


@contextlib.contextmanager
def attention_inputs(model: VisionTransformer) -> Iterator[list[torch.Tensor]]:
    """Within the block, every self-attention's input (the normalised tokens ``(B, N, C)``), in block order."""
    inputs: list[torch.Tensor] = []
    handles = [
        block.attn.register_forward_pre_hook(lambda _module, args: inputs.append(args[0].detach()))
        for block in model.blocks
    ]
    try:
        yield inputs
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def attention_probe(model: VisionTransformer, images: torch.Tensor, precision: str = "fp32") -> dict[str, Any]:
    """Attention logits and entropy per block, and the output logits, of one forward pass of ``images``.

    The attention logits ``q·k/√d`` are recomputed in float32 from each block's input through its own ``qkv`` and
    query-key norms (``Attention.split_qkv``), before the softmax.

    Returns:
        ``{"blocks": [{"max_logit", "entropy"}, ...], "max_output_logit", "mean_lse"}``.
    """
    was_training = model.training
    model.eval()
    device = images.device
    try:
        with autocast(device, precision), attention_inputs(model) as inputs:
            logits = model(images).float()
        blocks = []
        for block, x in zip(model.blocks, inputs, strict=True):
            attn = block.attn
            with autocast(device, precision):
                q, k, _ = attn.split_qkv(attn.qkv(x))  # (B, heads, N, head_dim)
            scores = (q.float() @ k.float().transpose(-2, -1)) * attn.scale  # (B, heads, N, N)
            p = scores.softmax(dim=-1)
            entropy = -(p * p.clamp_min(1e-30).log()).sum(-1).mean()
            blocks.append({"max_logit": scores.max().item(), "entropy": entropy.item()})
    finally:
        model.train(was_training)
    return {
        "blocks": blocks,
        "max_output_logit": logits.abs().max().item(),
        "mean_lse": torch.logsumexp(logits, dim=-1).mean().item(),
    }


def block_vector(block: nn.Module) -> torch.Tensor:
    """All of ``block``'s parameters as one float32 vector (a copy)."""
    return torch.cat([p.detach().float().flatten() for p in block.parameters()])


def block_gradients(model: VisionTransformer) -> tuple[list[float], list[torch.Tensor]]:
    """Before an optimiser step: each block's gradient norm, and its parameters (for :func:`update_probe`)."""
    norms = [
        torch.linalg.vector_norm(
            torch.stack([p.grad.float().norm() for p in b.parameters() if p.grad is not None])
        ).item()
        for b in model.blocks
    ]
    return norms, [block_vector(b) for b in model.blocks]


def update_probe(
    model: VisionTransformer, images: torch.Tensor, precision: str, before: tuple[list[float], list[torch.Tensor]]
) -> dict[str, Any]:
    """After an optimiser step: :func:`attention_probe` of ``images``, with each block's gradient norm and update
    ratio ``‖ΔW‖/‖W‖`` (from ``before``, :func:`block_gradients`)."""
    record = attention_probe(model, images, precision)
    grad_norms, vectors = before
    for i, block in enumerate(model.blocks):
        ratio = (block_vector(block) - vectors[i]).norm() / vectors[i].norm().clamp_min(1e-12)
        record["blocks"][i].update(grad_norm=grad_norms[i], update_ratio=ratio.item())
    return record


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, precision: str) -> float:
    """Top-1 accuracy of ``model`` (put in eval mode) on uint8 ``images``, in batches of 500."""
    device = next(model.parameters()).device
    model.eval()
    correct = 0
    with autocast(device, precision):
        for i in range(0, len(labels), 500):
            pred = model(normalize(images[i : i + 500].to(device))).argmax(-1)
            correct += (pred == labels[i : i + 500].to(device)).sum().item()
    return correct / len(labels)
