"""Model suite: training and inference throughput of a preset against timm's ``VisionTransformer``.

Both models are built from the same configuration and loaded with the same weights, then measured alternately (ours
then timm, then timm then ours, ...) for several rounds after warm-up; per-round ratios (ours / timm, above 1 means we
are faster) and their median; peak tensor memory; FLOPs per image and, on CUDA, MFU (model FLOPs utilisation,
Chowdhery et al., "PaLM", 2022, appendix B); and the peak activation memory of a training step with gradient
checkpointing against without it (Chen et al., "Training Deep Nets with Sublinear Memory Cost", 2016). Imports only
torch, timm and ``vit``'s model code.

Our model and timm's are measured by the same functions, step for step, in alternation
(:func:`~vit.bench.harness.alternate`); FLOPs and MFU are :mod:`vit.bench.flops`'s.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vit.bench.flops import count_flops, peak_tflops
from vit.bench.harness import BenchError, alternate, autocast, check, log, print_table, summarize, timed, write_report
from vit.bench.memory import peak_bytes, tensor_bytes
from vit.env import device_name
from vit.models import VisionTransformer, model_config

MODEL_RATIO_TARGET = 1.0
# Gradient checkpointing: peak activation memory of a training step at most this fraction of that without it.
CHECKPOINT_MEMORY_TARGET = 0.5
CHECKPOINT_DEFAULT = ("vit_small_patch16_224", 32)  # model and batch measured unless --models is given


def build_timm(config: dict[str, Any]) -> tuple[nn.Module | None, str | None]:
    """timm's ``VisionTransformer`` with our preset's arguments, or ``None`` and the reason."""
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    try:
        return TimmViT(**config), None
    except TypeError as err:  # e.g. window_size: timm's ViT has no window attention
        return None, f"timm's VisionTransformer cannot build this configuration ({err})"


def ours_and_timm(config: dict[str, Any], seed: int) -> tuple[dict[str, nn.Module], str | None, float | None]:
    """Our model of ``config`` (seeded) and timm's loaded with the same weights, strictly; the reason when timm
    cannot build it, and the largest logit difference of the two on a random batch."""
    torch.manual_seed(seed)
    models: dict[str, nn.Module] = {"ours": VisionTransformer(**config)}
    baseline, why_no_timm = build_timm(config)
    if baseline is None:
        return models, why_no_timm, None
    baseline.load_state_dict(models["ours"].state_dict())
    models["timm"] = baseline
    probe = torch.randn(2, 3, *models["ours"].patch_embed.img_size)
    with torch.no_grad():
        logits = [m.eval()(probe) for m in models.values()]
    return models, None, (logits[0] - logits[1]).abs().max().item()


def memory_method(device: torch.device, compile: bool) -> str:
    """How the peak memory of a step is measured there (or why it is not)."""
    if device.type == "cpu" and compile:
        return "not measured: compiled CPU kernels allocate outside the dispatcher"
    if device.type == "cpu":
        return "tensor bytes tracked per op (TorchDispatchMode), not process RSS"
    return "torch.cuda.max_memory_allocated increase during the step"


def step_functions(
    models: dict[str, nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    device: torch.device,
    precision: str,
    compile: bool,
) -> tuple[dict[str, torch.optim.Optimizer], dict[str, Callable[[], None]], dict[str, Callable[[], None]]]:
    """Each model on ``device`` with its AdamW, and its training step (forward, cross-entropy, backward, AdamW step,
    ``zero_grad``) and inference step on ``x``; compiled with ``compile``."""
    runners: dict[str, nn.Module] = {}
    optimizers: dict[str, torch.optim.Optimizer] = {}
    for key, model in models.items():
        model.to(device)
        optimizers[key] = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
        runners[key] = torch.compile(model) if compile else model

    def train_step(key: str) -> Callable[[], None]:
        def step() -> None:
            with autocast(device, precision):
                loss = F.cross_entropy(runners[key](x), y)
            loss.backward()
            optimizers[key].step()
            optimizers[key].zero_grad(set_to_none=True)

        return step

    def infer_step(key: str) -> Callable[[], None]:
        def step() -> None:
            with torch.inference_mode(), autocast(device, precision):
                runners[key](x)

        return step

    return optimizers, {key: train_step(key) for key in models}, {key: infer_step(key) for key in models}


def bench_model(
    name: str,
    batch: int,
    *,
    device: torch.device,
    override: dict[str, Any] | None = None,
    seed: int = 0,
    precision: str = "fp32",
    compile: bool = False,
    warmup: int = 1,
    rounds: int = 6,
    steps: int = 1,
) -> dict[str, Any]:
    """Train and inference throughput, memory and FLOPs of preset ``name`` (ours, and timm's when it exists).

    Args:
        name: A preset of :func:`vit.create_model`.
        batch: Images per step.
        device: Where the models run.
        override: ``model_config`` overrides (``{"depth": 2}``).
        seed: Seed of the weights.
        precision: ``fp32``, or ``bf16`` autocast.
        compile: ``torch.compile`` both models.
        warmup: Untimed steps per model and phase.
        rounds: Alternating rounds.
        steps: Steps per model per round.
    """
    config = model_config(name, **(override or {}))
    models, why_no_timm, logit_diff = ours_and_timm(config, seed)
    flops = count_flops(config)

    img_size = models["ours"].patch_embed.img_size
    num_classes = max(1, models["ours"].num_classes)
    x = torch.randn(batch, 3, *img_size, device=device)
    y = torch.randint(0, num_classes, (batch,), device=device)
    result: dict[str, Any] = {
        "model": name,
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()},
        "batch_size": batch,
        "params_m": sum(p.numel() for p in models["ours"].parameters()) / 1e6,
        "logit_max_abs_diff": logit_diff,
        "timm_note": why_no_timm,
        **flops,
    }

    optimizers, train_steps, infer_steps = step_functions(models, x, y, device=device, precision=precision,
                                                          compile=compile)  # fmt: skip
    memory_note = memory_method(device, compile)
    result["memory_note"] = memory_note + "; peaks include parameters and AdamW state"

    for phase, steps_of_phase in (("train", train_steps), ("inference", infer_steps)):
        result[phase] = bench_phase(
            phase,
            steps_of_phase,
            models,
            optimizers,
            name=name,
            batch=batch,
            device=device,
            flops=flops,
            memory_note=memory_note,
            compile=compile,
            warmup=warmup,
            rounds=rounds,
            steps_per_round=steps,
        )
    return result


def bench_phase(
    phase: str,
    steps: dict[str, Callable[[], None]],
    models: dict[str, nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    *,
    name: str,
    batch: int,
    device: torch.device,
    flops: dict[str, float],
    memory_note: str,
    compile: bool,
    warmup: int,
    rounds: int,
    steps_per_round: int,
) -> dict[str, Any]:
    """Throughput, ours/timm ratios, peak memory and (on CUDA) MFU of one phase (``"train"`` or ``"inference"``)
    of :func:`bench_model`, from the prepared step of each model."""
    for model in models.values():
        model.train(phase == "train")
    log(f"{name} batch {batch}: {phase} warm-up ({warmup} steps each{', compiling' if compile else ''})")
    for fn in steps.values():
        timed(fn, warmup, device)
    speeds = alternate(steps, rounds, steps_per_round, batch, device, phase)
    phase_result: dict[str, Any] = {}
    for key, values in speeds.items():
        phase_result[f"{key}_images_per_s"] = summarize(values["wall"])
        phase_result[f"{key}_rounds"] = values["wall"]
    if "timm" in speeds:
        ratios = [a / b for a, b in zip(speeds["ours"]["wall"], speeds["timm"]["wall"], strict=True)]
        phase_result["ratios"] = ratios
        phase_result["median_ratio"] = statistics.median(ratios)
        phase_result["ratio_spread"] = summarize(ratios)
        if device.type == "cpu":  # images per CPU second: robust to other processes on a shared machine
            cpu_ratios = [a / b for a, b in zip(speeds["ours"]["cpu"], speeds["timm"]["cpu"], strict=True)]
            phase_result["cpu_time_ratios"] = cpu_ratios
            phase_result["median_cpu_time_ratio"] = statistics.median(cpu_ratios)
            phase_result["cpu_time_ratio_spread"] = summarize(cpu_ratios)
    for key, model in models.items():
        state = tensor_bytes(model.parameters())
        if phase == "train":
            state += tensor_bytes(t for s in optimizers[key].state.values() for t in s.values() if torch.is_tensor(t))
        peak = None
        if memory_note.startswith(("tensor", "torch.cuda")):
            peak = (peak_bytes(steps[key], device) + state) / 2**20
        phase_result[f"{key}_peak_memory_mib"] = peak
    if device.type == "cuda":
        peak = peak_tflops(device_name(device))
        per_image = flops["train_gflops_per_image" if phase == "train" else "forward_gflops_per_image"] * 1e9
        for key in models:
            speed = phase_result[f"{key}_images_per_s"]["median"]
            phase_result[f"{key}_tflops"] = per_image * speed / 1e12
            phase_result[f"{key}_mfu"] = per_image * speed / (peak * 1e12) if peak else None
        phase_result["peak_bf16_tflops"] = peak
    return phase_result


def bench_grad_checkpointing(
    name: str,
    batch: int,
    *,
    device: torch.device,
    override: dict[str, Any] | None = None,
    seed: int = 0,
    precision: str = "fp32",
) -> dict[str, Any]:
    """Peak activation memory and time of one training step of preset ``name``, with and without checkpointing.

    The step is forward, cross-entropy and backward (eager, whatever ``--compile`` says: the CPU tracker does not see
    compiled kernels); its peak counts every tensor it allocates (activations, their gradients and the parameters'
    gradients), not the parameters themselves.
    """
    config = model_config(name, **(override or {}))
    torch.manual_seed(seed)
    model = VisionTransformer(**config).to(device).train()
    x = torch.randn(batch, 3, *model.patch_embed.img_size, device=device)
    y = torch.randint(0, max(1, model.num_classes), (batch,), device=device)

    def step() -> None:
        with autocast(device, precision):
            loss = F.cross_entropy(model(x), y)
        loss.backward()

    result: dict[str, Any] = {"model": name, "batch_size": batch}
    for enabled in (False, True):
        model.set_grad_checkpointing(enabled)
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        peak = peak_bytes(step, device) / 2**20
        key = "with" if enabled else "without"
        result[f"{key}_peak_mib"], result[f"{key}_step_s"] = peak, time.perf_counter() - start
        log(f"{name} batch {batch} grad checkpointing {key}: peak {peak:.0f} MiB, {result[f'{key}_step_s']:.1f} s")
    model.zero_grad(set_to_none=True)
    result["memory_ratio"] = result["with_peak_mib"] / result["without_peak_mib"]
    return result


def run_model_suite(
    *,
    device: torch.device,
    report: dict[str, Any],
    models: Sequence[str] | None = None,
    batch_sizes: Sequence[int] | None = None,
    override: dict[str, Any] | None = None,
    compile: bool = False,
    rounds: int = 6,
    steps: int = 1,
    warmup: int = 1,
    seed: int = 0,
    precision: str = "fp32",
    json_path: str | None = None,
) -> None:
    """Measure every model against timm's and gradient checkpointing, print the tables and the checks, and fill
    ``report["model"]``.

    Args:
        device: Where the models run.
        report: The report to fill (written to ``json_path`` after every model).
        models: Presets (default: vit_small_patch16_224, its MAP-head variant, and on the CPU vit_small_patch4_32).
        batch_sizes: One for all models or one per model (default: cpu 8 64 8, cuda 256).
        override: ``model_config`` overrides for every model.
        compile: ``torch.compile`` both models.
        rounds: Alternating rounds.
        steps: Steps per model per round (``vit bench``: cpu 1, cuda 10).
        warmup: Untimed steps per model (``vit bench``: cpu 1, cuda 5).
        seed: Seed of the weights.
        precision: ``fp32``, or ``bf16`` autocast.
        json_path: Where the report is written.

    Raises:
        BenchError: ``batch_sizes`` neither one nor one per model.
    """
    # vit_small_map_patch16_224: the same model with timm's attention-pooling (MAP) head instead of the class token.
    given = models
    models = list(
        models
        or (
            ["vit_small_patch16_224", "vit_small_patch4_32", "vit_small_map_patch16_224"]
            if device.type == "cpu"
            else ["vit_small_patch16_224", "vit_small_map_patch16_224"]
        )
    )
    batches = list(batch_sizes or ([8, 64, 8] if device.type == "cpu" else [256]))
    if len(batches) == 1:
        batches = batches * len(models)
    if len(batches) != len(models):
        raise BenchError(f"--batch_sizes: give one batch size or one per model ({len(models)}), got {batches}")
    suite = report.setdefault("model", {"results": []})
    suite["notes"] = [
        "ratio = our images/s / timm's images/s in the same round; > 1 means ours is faster",
        "on CPU the ratio is also given per CPU second (time.process_time of this process), which does not count "
        "waiting for a core held by another process: the steadier number on a shared machine, and with one "
        "thread the ratio of work done",
        "train step = forward, cross-entropy, backward, AdamW step, zero_grad(set_to_none=True)",
        "FLOPs count matrix products only (FlopCounterMode), forward and forward+backward, per image",
        f"grad checkpointing: peak tensor memory of one eager forward + backward with and without "
        f"set_grad_checkpointing, parameters not counted; {CHECKPOINT_DEFAULT[0]} at batch {CHECKPOINT_DEFAULT[1]}, "
        "or the first of --models at its batch size",
    ]
    weights = {"override": override, "seed": seed, "precision": precision}
    for name, batch in zip(models, batches, strict=True):
        timing = {"compile": compile, "warmup": warmup, "rounds": rounds, "steps": steps}
        result = bench_model(name, batch, device=device, **weights, **timing)
        suite["results"].append(result)
        write_report(json_path, report)
    ckpt_name, ckpt_batch = (models[0], batches[0]) if given else CHECKPOINT_DEFAULT
    ckpt = suite["grad_checkpointing"] = bench_grad_checkpointing(ckpt_name, ckpt_batch, device=device, **weights)
    write_report(json_path, report)

    print_model_tables(
        suite["results"], ckpt, device=device, precision=precision, compile=compile, rounds=rounds, steps=steps
    )
    suite["checks"] = model_checks(suite["results"], ckpt)
    write_report(json_path, report)


def print_model_tables(
    results: list[dict[str, Any]],
    ckpt: dict[str, Any],
    *,
    device: torch.device,
    precision: str,
    compile: bool,
    rounds: int,
    steps: int,
) -> None:
    """Print the throughput table (one row per model and phase) and the gradient-checkpointing table."""
    rows = []
    for r in results:
        for phase in ("train", "inference"):
            p = r[phase]
            spread = p.get("ratio_spread")
            rows.append(
                {
                    "model": r["model"],
                    "phase": phase,
                    "batch": r["batch_size"],
                    "ours": p["ours_images_per_s"]["median"],
                    "timm": p.get("timm_images_per_s", {}).get("median"),
                    "ratio": p.get("median_ratio"),
                    "cpu_ratio": p.get("median_cpu_time_ratio"),
                    "range": f"{spread['min']:.3f}–{spread['max']:.3f}" if spread else None,
                    "iqr": f"{spread['q1']:.3f}–{spread['q3']:.3f}" if spread else None,
                    "mem_ours": p["ours_peak_memory_mib"],
                    "mem_timm": p.get("timm_peak_memory_mib"),
                    "gflops": r["train_gflops_per_image" if phase == "train" else "forward_gflops_per_image"],
                    "mfu": p.get("ours_mfu"),
                }
            )
    print_table(
        f"model ({device_name(device)}, {precision}{', compiled' if compile else ''}, "
        f"{torch.get_num_threads()} threads, {rounds} rounds × {steps} steps)",
        rows,
        [
            ("model", "model", ""),
            ("phase", "phase", ""),
            ("batch", "batch", "d"),
            ("ours", "ours img/s", ".1f"),
            ("timm", "timm img/s", ".1f"),
            ("ratio", "median ratio", ".3f"),
            ("range", "ratio min–max", ""),
            ("iqr", "ratio IQR", ""),
            ("cpu_ratio", "CPU-time ratio", ".3f"),
            ("mem_ours", "ours peak MiB", ".0f"),
            ("mem_timm", "timm peak MiB", ".0f"),
            ("gflops", "GFLOP/img", ".2f"),
            ("mfu", "ours MFU", ".1%"),
        ],
    )
    print_table(
        f"gradient checkpointing ({device_name(device)}, {precision}; peak of forward + backward)",
        [ckpt],
        [
            ("model", "model", ""),
            ("batch_size", "batch", "d"),
            ("without_peak_mib", "peak MiB without", ".0f"),
            ("with_peak_mib", "peak MiB with", ".0f"),
            ("memory_ratio", "with / without", ".3f"),
            ("without_step_s", "step s without", ".1f"),
            ("with_step_s", "step s with", ".1f"),
        ],
    )


def model_checks(results: list[dict[str, Any]], ckpt: dict[str, Any]) -> list[dict[str, Any]]:
    """The gradient-checkpointing memory check, then per model the train ratio and logit parity with timm."""
    checks = [
        check(
            f"{ckpt['model']} batch {ckpt['batch_size']} grad checkpointing peak activation memory <= "
            f"{CHECKPOINT_MEMORY_TARGET}x without",
            ckpt["memory_ratio"] <= CHECKPOINT_MEMORY_TARGET,
            f"{ckpt['with_peak_mib']:.0f} / {ckpt['without_peak_mib']:.0f} MiB = {ckpt['memory_ratio']:.3f}",
        )
    ]
    for r in results:
        ratio = r["train"].get("median_ratio")
        if ratio is not None:
            checks.append(
                check(
                    f"{r['model']} batch {r['batch_size']} train ratio >= {MODEL_RATIO_TARGET}",
                    ratio >= MODEL_RATIO_TARGET,
                    f"median {ratio:.3f}",
                )
            )
        if r["logit_max_abs_diff"] is not None:
            diff = r["logit_max_abs_diff"]
            checks.append(check(f"{r['model']} logits match timm within 1e-5", diff <= 1e-5, f"max |diff| {diff:.2e}"))
    return checks
