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

``train_run`` is the proxy's training loop, a plain PyTorch loop a reader can check line by line against the paper;
its data and per-block probes are :mod:`vit.bench.recipe_proxy`'s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vit.bench.defaults import RECIPE_LRS, RECIPE_VARIANTS
from vit.bench.harness import BenchError, autocast, log, print_table, write_report
from vit.bench.recipe_proxy import (
    accuracy,
    augment,
    block_gradients,
    load_images,
    normalize,
    update_probe,
)
from vit.models import create_model

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


def build_proxy(
    settings: dict[str, Any],
    num_classes: int,
    lr: float,
    *,
    width: int,
    depth: int,
    heads: int,
    seed: int,
    device: torch.device,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The proxy of :data:`RECIPE` with a variant's ``settings`` (:func:`parse_variant`), seeded, and its AdamW with
    timm's weight-decay groups (no decay on biases, norms and position embeddings)."""
    from timm.optim import param_groups_weight_decay

    torch.manual_seed(seed)
    model = create_model(
        RECIPE["model"], embed_dim=width, depth=depth, num_heads=heads, num_classes=num_classes,
        **RECIPE["overrides"], **settings["model"],
    ).to(device)  # fmt: skip
    groups = param_groups_weight_decay(model, RECIPE["weight_decay"], no_weight_decay_list=model.no_weight_decay())
    return model, torch.optim.AdamW(groups, lr=lr, betas=settings["betas"])


def run_record(
    losses: list[float],
    probes: list[dict[str, Any]],
    nonfinite_step: int | None,
    *,
    num_classes: int,
    probe_every: int,
) -> dict[str, Any]:
    """What one run measured: start and final loss, whether it diverged, the attention and update extremes of its
    probes, and its loss curve (means over ``probe_every`` steps)."""
    head = losses[: max(1, min(10, len(losses)))]
    start_loss = sum(head) / len(head)
    tail = losses[-max(1, round(len(losses) * FINAL_FRACTION)) :]
    final_loss = sum(tail) / len(tail) if nonfinite_step is None else float("nan")
    # Above the loss of its first steps, or of a uniform prediction (log C): the run blew up or never learned.
    diverged = not math.isfinite(final_loss) or final_loss > min(start_loss, math.log(num_classes))
    last = probes[-1] if probes else {"blocks": [], "max_output_logit": None, "mean_lse": None}
    return {
        "steps_run": len(losses),
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
    model, optimizer = build_proxy(settings, num_classes, lr, width=width, depth=depth, heads=heads, seed=seed,
                                   device=device)  # fmt: skip
    warmup = max(1, round(steps * RECIPE["warmup_fraction"] * settings["warmup_factor"]))
    from vit.lit_module import warmup_cosine

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
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            nonfinite_step = step
            break
        before = block_gradients(model) if step % probe_every == 0 or step == steps - 1 else None
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), RECIPE["grad_clip"]).item()
        optimizer.step()
        if before is not None:
            record = update_probe(model, probe_x, precision, before)
            probes.append({"step": step, "lr": lr * factor, "loss": losses[-1], "grad_norm": grad_norm, **record})
    result = run_record(losses, probes, nonfinite_step, num_classes=num_classes, probe_every=probe_every)
    result = {"variant": variant, "lr": lr, "warmup_steps": warmup, "seconds": time.perf_counter() - start, **result}
    if eval_images is not None and nonfinite_step is None:
        result["eval_acc"] = accuracy(model, eval_images, eval_labels, precision)
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


def split_held_out(
    images: torch.Tensor, labels: torch.Tensor, count: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``count`` random images held out for accuracy (seeded): ``(train images, labels, held images, labels)``;
    nothing held out when ``count`` is 0."""
    if not count:
        return images, labels, None, None
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed + 1))
    held, kept = perm[:count], perm[count:]
    return images[kept], labels[kept], images[held], labels[held]


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
        raise BenchError(f"--recipe_width {width} is not divisible by --recipe_heads {heads}")
    images, labels, source = load_images(data_dir, train_images, seed)
    images, labels, held_images, held_labels = split_held_out(images, labels, eval_images, seed)
    log(f"recipe: {source}; {len(labels)} training images, {len(variants)} variants x {len(lrs)} lrs")
    held = 0 if held_labels is None else len(held_labels)
    proxy = {"width": width, "depth": depth, "heads": heads, "batch_size": batch_size, "steps": steps,
             "precision": precision, "train_images": len(labels), "eval_images": held}  # fmt: skip
    section: dict[str, Any] = {
        "data": source,
        "recipe": {**RECIPE, "variants": {v: parse_variant(v) for v in variants}},
        "proxy": proxy,
        "runs": [],
        "stable": {},
    }
    report["recipe"] = section
    shape = {"steps": steps, "batch_size": batch_size, "width": width, "depth": depth, "heads": heads,
             "device": device, "precision": precision, "probe_every": probe_every, "seed": seed}  # fmt: skip
    for variant in variants:
        for lr in lrs:
            run = train_run(images, labels, lr, variant, **shape, eval_images=held_images, eval_labels=held_labels)
            section["runs"].append(run)
            diverged = " DIVERGED" if run["diverged"] else ""
            log(f"  {variant} lr {lr:.2e}: final loss {run['final_loss']:.4f} (start {run['start_loss']:.4f})"
                f"{diverged}, max attention logit {run['max_attn_logit_end']}, {run['seconds']:.1f} s")  # fmt: skip
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
