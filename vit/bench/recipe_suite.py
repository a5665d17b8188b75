"""Recipe suite: learning-rate sensitivity of a small proxy of a training recipe, per stabilising change.

Wortsman et al., "Small-scale proxies for large-scale Transformer training instabilities" (ICLR 2024): the
instabilities of large Transformers at high learning rates (attention logits that grow until the softmax collapses
to one key, output logits that drift) already appear in small models trained at high enough learning rates, and the
mitigations that widen the range of stable learning rates for the small model (qk-layernorm, a z-loss, AdamW's
beta2 below 0.999, a longer warm-up) carry over. This suite trains a narrow, shallow copy of a preset, in bf16
autocast by default, for every learning rate of a grid and every variant of the recipe, in a plain PyTorch loop:
AdamW with timm's weight-decay groups, linear warm-up then cosine (:func:`vit.lit_module.warmup_cosine`), gradient
clipping, label smoothing, random crop and flip on real images (a folder of JPEGs), or on scikit-learn's digits
when none is given.

Per run it records the final loss (mean cross-entropy of the last 10 % of the steps, the z-loss left out so that
variants compare), whether the run diverged (a non-finite loss, or a final loss above the loss of its first steps
or above ``log(classes)``, the loss of a uniform prediction: the run blew up, or never learned)
and, on a fixed probe batch every ``probe_every`` steps and per block: the largest attention logit ``q·k/√d``, the
mean attention entropy, the gradient norm and the update/weight ratio ``‖ΔW‖/‖W‖`` of one optimiser step; plus the
largest output logit and the mean log-partition ``logsumexp(logits)`` (the quantity the z-loss pulls to zero). Per
variant the verdict is a number: the largest learning rate whose final loss is finite and within 10 % of that
variant's best (and of the best of all variants).

Over 450 lines, and ``train_run`` over 80, on purpose: the proxy's training loop and its per-block probes
read top to bottom in one place, as a plain PyTorch loop a reader can check line by line against the paper.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vit.bench.defaults import RECIPE_LRS, RECIPE_VARIANTS
from vit.bench.harness import BenchError, autocast, log, print_table, write_report
from vit.models import VisionTransformer, create_model

# The changes a variant can combine ("qk_norm+beta2_095"): model arguments, and loop settings.
CHANGES: dict[str, dict[str, Any]] = {
    "baseline": {},
    "qk_norm": {"model": {"qk_norm": True}},  # LayerNorm on queries and keys per head (Dehghani et al. 2023)
    "layer_scale": {"model": {"init_values": 1e-4}},  # CaiT's LayerScale at DeiT III's ViT-S/B value
    "z_loss": {"z_loss": 1e-4},  # 1e-4 · logsumexp(logits)², PaLM's coefficient
    "beta2_095": {"betas": (0.9, 0.95)},
    "warmup_3x": {"warmup_factor": 3.0},
}
DEFAULT_VARIANTS = RECIPE_VARIANTS
DEFAULT_LRS = RECIPE_LRS
# The recipe the proxy copies (configs/cifar10_speedrun.yaml), narrowed and shortened by the suite's settings.
RECIPE: dict[str, Any] = {
    "model": "vit_small_patch4_32",
    "overrides": {"mlp_ratio": 3.0, "class_token": False, "global_pool": "avg", "drop_path_rate": 0.05},
    "betas": (0.9, 0.999),
    "weight_decay": 0.05,
    "warmup_fraction": 0.1,  # 3 warm-up epochs of the speedrun's first ~30 (past its divergence at step 288-335)
    "min_lr_ratio": 1e-5 / 3e-3,
    "label_smoothing": 0.1,
    "grad_clip": 1.0,
}
STABLE_TOLERANCE = 0.10  # a learning rate is stable when its final loss is finite and within 10 % of the best
FINAL_FRACTION = 0.10  # the final loss is the mean of the last 10 % of the steps
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


def parse_variant(name: str) -> dict[str, Any]:
    """The settings of a variant: changes of :data:`CHANGES` joined by ``+`` (``"qk_norm+beta2_095"``).

    Raises:
        BenchError: On an unknown change (the message lists the known ones).
    """
    settings: dict[str, Any] = {"model": {}, "z_loss": 0.0, "betas": RECIPE["betas"], "warmup_factor": 1.0}
    for part in name.split("+"):
        if part not in CHANGES:
            raise BenchError(f"unknown recipe change {part!r} in {name!r}; known: {', '.join(CHANGES)}")
        change = CHANGES[part]
        settings["model"] = {**settings["model"], **change.get("model", {})}
        settings.update({k: v for k, v in change.items() if k != "model"})
    return settings


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
        return images[keep], labels[keep], f"scikit-learn digits upscaled to {img_size}x{img_size} RGB (no --data-dir)"
    import numpy as np
    from PIL import Image

    root = Path(data_dir)
    root = root / "train" if (root / "train").is_dir() else root
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    files = [(f, c) for c, name in enumerate(classes) for f in sorted((root / name).glob("*")) if f.is_file()]
    if not files:
        raise BenchError(f"--data-dir {data_dir}: no <class>/<image> files under {root}")
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


def _block_vector(block: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten() for p in block.parameters()])


def train_run(
    images: torch.Tensor,
    labels: torch.Tensor,
    lr: float,
    variant: str,
    *,
    steps: int,
    batch_size: int,
    width: int,
    depth: int,
    heads: int,
    device: torch.device,
    precision: str = "bf16",
    probe_every: int = 25,
    probe_images: int = 64,
    seed: int = 0,
    eval_images: torch.Tensor | None = None,
    eval_labels: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Train one proxy at one peak learning rate with one variant of the recipe, and measure it.

    Args:
        images: uint8 ``(N, 3, 32, 32)`` training images; ``labels`` their classes.
        lr: Peak learning rate.
        variant: Changes of :data:`CHANGES` joined by ``+``.
        steps: Optimiser steps (the cosine ends there); warm-up is 10 % of them, times the variant's factor.
        batch_size: Images per step.
        width, depth, heads: The proxy's ``embed_dim``, ``depth`` and ``num_heads``.
        device: Where to train.
        precision: ``"bf16"`` (autocast) or ``"fp32"``.
        probe_every: Steps between two probes of attention logits, gradient norms and update ratios.
        probe_images: Size of the fixed probe batch (the first images, not augmented).
        seed: Seed of the initialisation and the batches.
        eval_images, eval_labels: Held-out images whose accuracy is measured at the end, if given.

    Returns:
        The run's record: final and start loss, ``diverged``, the step of the first non-finite loss, a loss curve
        and the probes.
    """
    settings = parse_variant(variant)
    num_classes = int(labels.max()) + 1
    torch.manual_seed(seed)
    model = create_model(
        RECIPE["model"],
        embed_dim=width,
        depth=depth,
        num_heads=heads,
        num_classes=num_classes,
        **RECIPE["overrides"],
        **settings["model"],
    ).to(device)
    from timm.optim import param_groups_weight_decay

    from vit.lit_module import warmup_cosine

    groups = param_groups_weight_decay(model, RECIPE["weight_decay"], no_weight_decay_list=model.no_weight_decay())
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=settings["betas"])
    warmup = max(1, round(steps * RECIPE["warmup_fraction"] * settings["warmup_factor"]))
    generator = torch.Generator().manual_seed(seed)
    images, labels = images.to(device), labels.to(device)
    probe_x = normalize(images[:probe_images])
    losses: list[float] = []
    probes: list[dict[str, Any]] = []
    nonfinite_step = None
    start = time.perf_counter()
    for step in range(steps):
        factor = warmup_cosine(step, warmup, steps, RECIPE["min_lr_ratio"])
        for group in optimizer.param_groups:
            group["lr"] = lr * factor
        idx = torch.randint(0, len(labels), (batch_size,), generator=generator).to(device)
        x, y = augment(images[idx], generator), labels[idx]
        with autocast(device, precision):
            logits = model(x)
        logits = logits.float()
        loss = F.cross_entropy(logits, y, label_smoothing=RECIPE["label_smoothing"])
        total = loss + settings["z_loss"] * torch.logsumexp(logits, dim=-1).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        value = loss.item()
        losses.append(value)
        if not math.isfinite(value):
            nonfinite_step = step
            break
        probe = step % probe_every == 0 or step == steps - 1
        if probe:
            grad_norms = [
                torch.linalg.vector_norm(
                    torch.stack([p.grad.float().norm() for p in b.parameters() if p.grad is not None])
                ).item()
                for b in model.blocks
            ]
            before = [_block_vector(b) for b in model.blocks]
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), RECIPE["grad_clip"]).item()
        optimizer.step()
        if probe:
            record = attention_probe(model, probe_x, precision)
            for i, block in enumerate(model.blocks):
                after = _block_vector(block)
                ratio = (after - before[i]).norm() / before[i].norm().clamp_min(1e-12)
                record["blocks"][i].update(grad_norm=grad_norms[i], update_ratio=ratio.item())
            probes.append({"step": step, "lr": lr * factor, "loss": value, "grad_norm": grad_norm, **record})
    seconds = time.perf_counter() - start
    head = losses[: max(1, min(10, len(losses)))]
    start_loss = sum(head) / len(head)
    tail = losses[-max(1, round(len(losses) * FINAL_FRACTION)) :]
    final_loss = sum(tail) / len(tail) if nonfinite_step is None else float("nan")
    # Above the loss of its first steps, or of a uniform prediction (log C): the run blew up or never learned.
    diverged = not math.isfinite(final_loss) or final_loss > min(start_loss, math.log(num_classes))
    last = probes[-1] if probes else {"blocks": [], "max_output_logit": None, "mean_lse": None}
    result: dict[str, Any] = {
        "variant": variant,
        "lr": lr,
        "warmup_steps": warmup,
        "steps_run": len(losses),
        "seconds": seconds,
        "start_loss": start_loss,
        "final_loss": final_loss,
        "diverged": diverged,
        "nonfinite_step": nonfinite_step,
        "max_attn_logit_end": max((b["max_logit"] for b in last["blocks"]), default=None),
        "max_attn_logit_peak": max((b["max_logit"] for p in probes for b in p["blocks"]), default=None),
        "min_attn_entropy_end": min((b["entropy"] for b in last["blocks"]), default=None),
        "max_output_logit_end": last["max_output_logit"],
        "mean_lse_end": last["mean_lse"],
        "max_update_ratio": max((b["update_ratio"] for p in probes for b in p["blocks"]), default=None),
        "loss_curve": [
            {"step": i, "loss": sum(losses[i : i + probe_every]) / len(losses[i : i + probe_every])}
            for i in range(0, len(losses), probe_every)
        ],
        "probes": probes,
        "eval_acc": None,
    }
    if eval_images is not None and nonfinite_step is None:
        model.eval()
        correct = 0
        with torch.no_grad(), autocast(device, precision):
            for i in range(0, len(eval_labels), 500):
                pred = model(normalize(eval_images[i : i + 500].to(device))).argmax(-1)
                correct += (pred == eval_labels[i : i + 500].to(device)).sum().item()
        result["eval_acc"] = correct / len(eval_labels)
    return result


def stable_range(runs: Sequence[dict[str, Any]], best: float | None = None) -> dict[str, Any]:
    """The learning rates of one variant whose final loss is finite, not diverged and within
    :data:`STABLE_TOLERANCE` of ``best`` (default: the variant's own best); their smallest and largest."""
    finite = [r for r in runs if not r["diverged"] and math.isfinite(r["final_loss"])]
    if not finite:
        return {"best_loss": None, "best_lr": None, "min_lr": None, "max_lr": None, "lrs": []}
    own = min(finite, key=lambda r: r["final_loss"])
    reference = own["final_loss"] if best is None else best
    lrs = sorted(r["lr"] for r in finite if r["final_loss"] <= reference * (1 + STABLE_TOLERANCE))
    return {
        "best_loss": own["final_loss"],
        "best_lr": own["lr"],
        "min_lr": lrs[0] if lrs else None,
        "max_lr": lrs[-1] if lrs else None,
        "lrs": lrs,
    }


def run_recipe_suite(
    *,
    device: torch.device,
    report: dict[str, Any],
    lrs: Sequence[float] = RECIPE_LRS,
    variants: Sequence[str] = RECIPE_VARIANTS,
    steps: int = 300,
    batch_size: int = 256,
    width: int = 128,
    depth: int = 4,
    heads: int = 2,
    probe_every: int = 25,
    train_images: int = 10000,
    eval_images: int = 1000,
    data_dir: str | None = None,
    seed: int = 0,
    precision: str = "bf16",
    json_path: str | None = None,
) -> None:
    """Every variant at every learning rate; a table per variant, the stable ranges, written into ``report``.

    Args:
        device: Where the proxies train.
        report: The report to fill (written to ``json_path`` after every run).
        lrs: Peak learning rates.
        variants: Changes joined by ``+`` (:data:`CHANGES`).
        steps: Optimiser steps per run (10 % warm-up).
        batch_size: Images per step.
        width: ``embed_dim`` of the proxy.
        depth: Blocks of the proxy.
        heads: Attention heads of the proxy.
        probe_every: Steps between attention and update probes.
        train_images: Random training images decoded.
        eval_images: Of them, held out for accuracy (0: none).
        data_dir: Folder of ``train/<class>/*.jpg`` (default: scikit-learn's digits upscaled to 32x32 RGB).
        seed: Seed of the data split, the weights and the batches.
        precision: ``bf16`` autocast (the recipe's), or ``fp32``.
        json_path: Where the report is written.

    Raises:
        BenchError: An unknown variant, or a width that the heads do not divide.
    """
    variants = list(variants)
    for v in variants:
        parse_variant(v)  # an unknown change fails before any training
    if width % heads:
        raise BenchError(f"--recipe-width {width} is not divisible by --recipe-heads {heads}")
    images, labels, source = load_images(data_dir, train_images, seed)
    held_images = held_labels = None
    if eval_images:
        perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed + 1))
        held, kept = perm[:eval_images], perm[eval_images:]
        held_images, held_labels, images, labels = images[held], labels[held], images[kept], labels[kept]
    log(f"recipe: {source}; {len(labels)} training images, {len(variants)} variants x {len(lrs)} lrs")
    section: dict[str, Any] = {
        "data": source,
        "recipe": {**RECIPE, "variants": {v: parse_variant(v) for v in variants}},
        "proxy": {
            "width": width,
            "depth": depth,
            "heads": heads,
            "batch_size": batch_size,
            "steps": steps,
            "precision": precision,
            "train_images": len(labels),
            "eval_images": 0 if held_labels is None else len(held_labels),
        },
        "runs": [],
        "stable": {},
    }
    report["recipe"] = section
    for variant in variants:
        for lr in lrs:
            run = train_run(
                images,
                labels,
                lr,
                variant,
                steps=steps,
                batch_size=batch_size,
                width=width,
                depth=depth,
                heads=heads,
                device=device,
                precision=precision,
                probe_every=probe_every,
                seed=seed,
                eval_images=held_images,
                eval_labels=held_labels,
            )
            section["runs"].append(run)
            log(
                f"  {variant} lr {lr:.2e}: final loss {run['final_loss']:.4f} (start {run['start_loss']:.4f})"
                f"{' DIVERGED' if run['diverged'] else ''}, max attention logit {run['max_attn_logit_end']}, "
                f"{run['seconds']:.1f} s"
            )
            write_report(json_path, report)
    summarize_recipe(section)
    write_report(json_path, report)


def summarize_recipe(section: dict[str, Any]) -> None:
    """Print a table per variant and the stable learning rates; adds ``stable`` and ``summary`` to ``section`` (the
    ``recipe`` part of a report, also one merged from several reports' ``runs``)."""
    variants = list(dict.fromkeys(r["variant"] for r in section["runs"]))
    section["stable"] = {}
    finite = [r["final_loss"] for r in section["runs"] if not r["diverged"] and math.isfinite(r["final_loss"])]
    overall = min(finite) if finite else None
    columns = [
        ("lr", "lr", ".1e"),
        ("final_loss", "final loss", ".4f"),
        ("diverged", "diverged", ""),
        ("max_attn_logit_end", "max attn logit (end)", ".1f"),
        ("max_attn_logit_peak", "max attn logit (peak)", ".1f"),
        ("min_attn_entropy_end", "min entropy", ".2f"),
        ("mean_lse_end", "logsumexp", ".2f"),
        ("max_update_ratio", "max ΔW/W", ".3f"),
        ("eval_acc", "held-out acc", ".3f"),
    ]
    summary = []
    for variant in variants:
        runs = [r for r in section["runs"] if r["variant"] == variant]
        print_table(f"recipe: {variant}", runs, columns)
        own, shared = stable_range(runs), stable_range(runs, overall)
        section["stable"][variant] = {"own_best": own, "overall_best": shared}
        summary.append(
            {
                "variant": variant,
                "best_loss": own["best_loss"],
                "best_lr": own["best_lr"],
                "max_stable_lr": own["max_lr"],
                "max_lr_near_overall_best": shared["max_lr"],
                "diverged": sum(r["diverged"] for r in runs),
            }
        )
    section["summary"] = summary
    print_table(
        f"recipe: stable learning rates (final loss finite and within {STABLE_TOLERANCE:.0%} of the best)",
        summary,
        [
            ("variant", "variant", ""),
            ("best_loss", "best loss", ".4f"),
            ("best_lr", "at lr", ".1e"),
            ("max_stable_lr", "largest lr within 10% of own best", ".1e"),
            ("max_lr_near_overall_best", "largest lr within 10% of overall best", ".1e"),
            ("diverged", "diverged runs", ""),
        ],
    )
