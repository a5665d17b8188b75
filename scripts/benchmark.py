"""Benchmarks: our ViT against timm's, global against window attention, and the data pipelines.

Suites (``--suite model|attention|data|all``), each printing a table and writing one JSON report (``--json``)
with the date, versions, device name, thread count and every setting:

- ``model``: training-step (forward, backward, AdamW step) and inference throughput of a preset against timm's
  ``VisionTransformer`` built from the same configuration and loaded with the same weights, measured alternately
  (ours then timm, then timm then ours, ...) for several rounds after warm-up; per-round ratios (ours / timm, above
  1 means we are faster) and their median; peak tensor memory; FLOPs per image and, on CUDA, MFU.
- ``attention``: forward + backward time and peak memory per token of ``vit.layers.Attention`` against
  ``vit.layers.WindowAttention`` as the patch grid grows, for several window sizes.
- ``data``: images/s of one worker (one core, main process) for our albumentations pipelines and torchvision v2
  equivalents: the CIFAR preset on 32×32 images, and JPEG decode -> random-resized crop 224 -> flip -> normalise,
  with the normalisation in the worker or, as ``ImageDataModule`` does it, on the device after the copy.

The ``model`` and ``attention`` suites import only torch, timm and ``vit``'s model code; albumentations, OpenCV,
torchvision and ``vit.data`` are imported by the ``data`` suite only.

Examples::

    python scripts/benchmark.py --suite model --models vit_small_patch16_224 vit_small_patch4_32 --batch-sizes 8 64
    python scripts/benchmark.py --suite attention --json runs/attention.json
    python scripts/benchmark.py --suite model --device cuda --precision bf16 --compile --batch-sizes 512
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from vit.layers import Attention, WindowAttention
from vit.models import VisionTransformer, model_config

SUITES = ("model", "attention", "data")

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, matched against the CUDA device name in order.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("GH200", 989.0),
    ("A100", 312.0),
)

DATA_CIFAR_TARGET = 5000.0  # images/s per worker
DATA_JPEG_TARGET = 600.0
MODEL_RATIO_TARGET = 1.0
WINDOW_FLATNESS_TARGET = 0.15  # per-token time within ±15 % of the smallest grid's
WINDOW_SPEEDUP_TARGET = 5.0  # over global attention at 64x64 tokens
WINDOW_SPEEDUP_GRID = 64

_START = time.perf_counter()


def log(message: str) -> None:
    """Progress line on stderr with the seconds since start."""
    print(f"[{time.perf_counter() - _START:7.1f}s] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- measurement


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], steps: int, device: torch.device) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of ``steps`` calls of ``fn``, the device synchronised before and after.

    On a shared CPU the process time (all of this process's threads) is the steadier measure of the work done: it
    does not count time spent waiting for a core that another process holds.
    """
    synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        fn()
    synchronize(device)
    return time.perf_counter() - wall, time.process_time() - cpu


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles, min and max of a list of measurements."""
    ordered = sorted(values)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return {"median": statistics.median(ordered), "q1": q1, "q3": q3, "min": ordered[0], "max": ordered[-1]}


class TensorMemoryTracker(TorchDispatchMode):
    """Peak bytes of the tensor storages that ops allocate while the mode is active, on any device.

    The CPU stand-in for ``torch.cuda.max_memory_allocated``: every storage an op returns that is not one of its
    inputs' storages counts from its creation until it is freed (a finaliser on the storage). Storages that existed
    before (parameters, optimizer state) are not counted; add them yourself. Only eager ops are seen: kernels that
    ``torch.compile`` generates allocate outside the dispatcher.
    """

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._live: dict[tuple[str, int], weakref.finalize] = {}

    def _release(self, key: tuple[str, int], nbytes: int) -> None:
        self.current -= nbytes
        self._live.pop(key, None)

    @staticmethod
    def _storage(value: Any) -> torch.UntypedStorage | None:
        if not isinstance(value, torch.Tensor):
            return None
        try:
            return value.untyped_storage()
        except (RuntimeError, NotImplementedError):  # tensors without storage (nested, some subclasses)
            return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        inputs = {(str(s.device), s.data_ptr()) for s in map(self._storage, leaves) if s is not None}
        for value in torch.utils._pytree.tree_leaves(out):
            storage = self._storage(value)
            if storage is None or storage.nbytes() == 0:
                continue
            key = (str(storage.device), storage.data_ptr())
            if key in inputs or key in self._live:
                continue
            nbytes = storage.nbytes()
            self.current += nbytes
            self.peak = max(self.peak, self.current)
            self._live[key] = weakref.finalize(storage, self._release, key, nbytes)
        return out


def peak_bytes(fn: Callable[[], Any], device: torch.device) -> int:
    """Peak bytes that ``fn`` allocates on top of what is already allocated: CUDA allocator or the tracker."""
    if device.type == "cuda":
        synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    with TensorMemoryTracker() as tracker:
        fn()
    return tracker.peak


def tensor_bytes(tensors: Iterator[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def count_flops(config: dict[str, Any]) -> dict[str, float]:
    """FLOPs per image of one forward pass and of one training step (forward + backward), counted on the CPU.

    ``FlopCounterMode`` counts matrix products (patch projection, linear layers, attention); attention is counted
    through PyTorch's reference (math) kernel because the counter has no formula for the CPU fused kernel. The
    count does not depend on the device; elementwise ops (softmax, GELU, LayerNorm) are not counted.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model = VisionTransformer(**config)
    size = model.patch_embed.img_size
    x = torch.randn(1, model.patch_embed.proj.in_channels, *size)
    with sdpa_kernel(SDPBackend.MATH):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(x)
        forward = counter.get_total_flops()
        with FlopCounterMode(display=False) as counter:
            model(x).sum().backward()
        train = counter.get_total_flops()
    return {"forward_gflops_per_image": forward / 1e9, "train_gflops_per_image": train / 1e9}


def peak_tflops(device_name: str) -> float | None:
    """Dense bf16 peak of a known CUDA device, else ``None``."""
    for key, value in PEAK_BF16_TFLOPS:
        if key in device_name:
            return value
    return None


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def environment(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    import timm

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "device_name": device_name(device),
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "settings": {key: value for key, value in vars(args).items() if key != "func"},
    }


def print_table(title: str, rows: list[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> None:
    """Print ``rows`` as a Markdown table; ``columns`` are (key, header, format spec)."""

    def cell(row: dict[str, Any], key: str, spec: str) -> str:
        value = row.get(key)
        if value is None:
            return "–"
        return format(value, spec) if spec else str(value)

    print(f"\n### {title}\n")
    print("| " + " | ".join(header for _, header, _ in columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for row in rows:
        print("| " + " | ".join(cell(row, key, spec) for key, _, spec in columns) + " |")
    sys.stdout.flush()


def check(name: str, passed: bool, detail: str) -> dict[str, Any]:
    print(f"{'PASS' if passed else 'FAIL'}  {name}: {detail}")
    return {"name": name, "passed": bool(passed), "detail": detail}


# ------------------------------------------------------------------------------------------------ model suite


def build_timm(config: dict[str, Any]) -> tuple[nn.Module | None, str | None]:
    """timm's ``VisionTransformer`` with our preset's arguments, or ``None`` and the reason."""
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    try:
        return TimmViT(**config), None
    except TypeError as err:  # e.g. window_size: timm's ViT has no window attention
        return None, f"timm's VisionTransformer cannot build this configuration ({err})"


def alternate(
    steps: dict[str, Callable[[], Any]], rounds: int, steps_per_round: int, batch: int, device: torch.device, what: str
) -> dict[str, dict[str, list[float]]]:
    """Images/s of each callable per wall-clock and per CPU second, measured alternately for ``rounds`` rounds.

    The order flips every round (A B, B A, A B, ...), so neither model always runs first or second: position effects
    (a warm allocator, a cold cache, load that rises during a round) cancel in the median.
    """
    speeds: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in steps}
    for r in range(rounds):
        order = list(steps.items())
        for name, fn in order if r % 2 == 0 else order[::-1]:
            wall, cpu = timed(fn, steps_per_round, device)
            speeds[name]["wall"].append(batch * steps_per_round / wall)
            speeds[name]["cpu"].append(batch * steps_per_round / max(cpu, 1e-9))
        ratio = ""
        if len(steps) == 2:
            ratio = f" ratio {speeds['ours']['wall'][-1] / speeds['timm']['wall'][-1]:.3f}"
            if device.type == "cpu":
                ratio += f" (CPU time {speeds['ours']['cpu'][-1] / speeds['timm']['cpu'][-1]:.3f})"
        log(
            f"  {what} round {r + 1}/{rounds}: "
            + ", ".join(f"{n} {v['wall'][-1]:.1f} img/s" for n, v in speeds.items())
            + ratio
        )
    return speeds


def bench_model(name: str, batch: int, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Train and inference throughput, memory and FLOPs of preset ``name`` (ours, and timm's when it exists)."""
    config = model_config(name, **args.override)
    torch.manual_seed(args.seed)
    models: dict[str, nn.Module] = {"ours": VisionTransformer(**config)}
    baseline, why_no_timm = build_timm(config)
    logit_diff = None
    if baseline is not None:
        baseline.load_state_dict(models["ours"].state_dict())  # the same weights, strictly
        models["timm"] = baseline
        probe = torch.randn(2, 3, *models["ours"].patch_embed.img_size)
        with torch.no_grad():
            logits = [m.eval()(probe) for m in models.values()]
        logit_diff = (logits[0] - logits[1]).abs().max().item()
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

    runners: dict[str, nn.Module] = {}
    optimizers: dict[str, torch.optim.Optimizer] = {}
    for key, model in models.items():
        model.to(device)
        optimizers[key] = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
        runners[key] = torch.compile(model) if args.compile else model

    def train_step(key: str) -> Callable[[], None]:
        def step() -> None:
            with autocast(device, args.precision):
                loss = F.cross_entropy(runners[key](x), y)
            loss.backward()
            optimizers[key].step()
            optimizers[key].zero_grad(set_to_none=True)

        return step

    def infer_step(key: str) -> Callable[[], None]:
        def step() -> None:
            with torch.inference_mode(), autocast(device, args.precision):
                runners[key](x)

        return step

    memory_note = None
    if device.type == "cpu" and args.compile:
        memory_note = "not measured: compiled CPU kernels allocate outside the dispatcher"
    elif device.type == "cpu":
        memory_note = "tensor bytes tracked per op (TorchDispatchMode), not process RSS"
    else:
        memory_note = "torch.cuda.max_memory_allocated increase during the step"
    result["memory_note"] = memory_note + "; peaks include parameters and AdamW state"

    for phase, make in (("train", train_step), ("inference", infer_step)):
        for model in models.values():
            model.train(phase == "train")
        steps = {key: make(key) for key in models}
        log(f"{name} batch {batch}: {phase} warm-up ({args.warmup} steps each{', compiling' if args.compile else ''})")
        for fn in steps.values():
            timed(fn, args.warmup, device)
        speeds = alternate(steps, args.rounds, args.steps, batch, device, phase)
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
                state += tensor_bytes(
                    t for s in optimizers[key].state.values() for t in s.values() if torch.is_tensor(t)
                )
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
        result[phase] = phase_result
    return result


def run_model_suite(args: argparse.Namespace, device: torch.device, report: dict[str, Any]) -> None:
    models = args.models or (
        ["vit_small_patch16_224", "vit_small_patch4_32"] if device.type == "cpu" else ["vit_small_patch16_224"]
    )
    batches = args.batch_sizes or ([8, 64] if device.type == "cpu" else [256])
    if len(batches) == 1:
        batches = batches * len(models)
    if len(batches) != len(models):
        raise SystemExit(f"--batch-sizes: give one batch size or one per model ({len(models)}), got {batches}")
    suite = report.setdefault("model", {"results": []})
    suite["notes"] = [
        "ratio = our images/s / timm's images/s in the same round; > 1 means ours is faster",
        "on CPU the ratio is also given per CPU second (time.process_time of this process), which does not count "
        "waiting for a core held by another process: the steadier number on a shared machine, and with one "
        "thread the ratio of work done",
        "train step = forward, cross-entropy, backward, AdamW step, zero_grad(set_to_none=True)",
        "FLOPs count matrix products only (FlopCounterMode), forward and forward+backward, per image",
    ]
    for name, batch in zip(models, batches, strict=True):
        result = bench_model(name, batch, args, device)
        suite["results"].append(result)
        write_report(args, report)

    rows = []
    for r in suite["results"]:
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
        f"model ({device_name(device)}, {args.precision}{', compiled' if args.compile else ''}, "
        f"{torch.get_num_threads()} threads, {args.rounds} rounds × {args.steps} steps)",
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
    checks = []
    for r in suite["results"]:
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
    suite["checks"] = checks
    write_report(args, report)


# -------------------------------------------------------------------------------------------- attention suite


def attention_cases(
    grid: int, args: argparse.Namespace, device: torch.device, windows: Sequence[int]
) -> list[dict[str, Any]]:
    """Global and window attention layers (shared weights) over a ``grid × grid`` patch grid plus a class token,
    each with a forward + backward closure ``run``."""
    tokens = 1 + grid * grid
    batch = max(1, args.attn_tokens // tokens)
    torch.manual_seed(args.seed)
    layers: dict[str, nn.Module] = {"global": Attention(args.attn_dim, args.attn_heads, qkv_bias=True)}
    for w in windows:
        if w <= grid:
            layer = WindowAttention(
                args.attn_dim, args.attn_heads, qkv_bias=True, grid_size=grid, window_size=w, num_prefix_tokens=1
            )
            layer.load_state_dict(layers["global"].state_dict())
            layers[f"window {w}"] = layer
    x = torch.randn(batch, tokens, args.attn_dim, device=device, requires_grad=True)
    grad = torch.randn(batch, tokens, args.attn_dim, device=device)

    def step(layer: nn.Module) -> Callable[[], None]:
        def run() -> None:
            with autocast(device, args.precision):
                out = layer(x)
            out.backward(grad.to(out.dtype))
            x.grad = None
            layer.zero_grad(set_to_none=True)

        return run

    cases = []
    for name, layer in layers.items():
        w = getattr(layer, "window_size", None)
        case = {"grid": grid, "tokens": tokens, "batch": batch, "layer": name, "window": w}
        case["divisible"] = None if w is None else grid % w == 0
        case["run"] = step(layer.to(device))
        cases.append(case)
    return cases


def run_attention_suite(args: argparse.Namespace, device: torch.device, report: dict[str, Any]) -> None:
    grids = args.attn_grids or ([16, 24, 32, 48, 56, 64] if device.type == "cpu" else [32, 48, 64, 96, 112, 128])
    windows = args.window_sizes
    suite = report.setdefault("attention", {})
    suite["notes"] = [
        f"dim {args.attn_dim}, {args.attn_heads} heads, 1 class token, qkv bias; forward + backward (input grads "
        "included) under the chosen precision; batch = max(1, attn_tokens // tokens)",
        "memory: "
        + (
            "torch.cuda.max_memory_allocated increase"
            if device.type == "cuda"
            else "tensor bytes tracked per op (TorchDispatchMode)"
        )
        + " during one forward + backward, per token; parameters excluded",
    ]
    cases = [case for grid in grids for case in attention_cases(grid, args, device, windows)]
    log(f"attention: warm-up of {len(cases)} layers on grids {grids}")
    for case in cases:
        timed(case["run"], 1, device)
    # Every round times every layer on every grid, so load changes on a shared machine hit all grids alike.
    seconds: list[list[tuple[float, float]]] = [[] for _ in cases]
    for r in range(args.attn_reps):
        for case, times in zip(cases, seconds, strict=True):
            times.append(timed(case["run"], 1, device))
        log(f"attention round {r + 1}/{args.attn_reps}")
    rows = suite["results"] = []
    for case, times in zip(cases, seconds, strict=True):
        run = case.pop("run")
        wall = [t for t, _ in times]
        median, tokens = statistics.median(wall), case["batch"] * case["tokens"]
        case["ms"] = median * 1e3
        case["ms_rounds"] = [t * 1e3 for t in wall]
        case["us_per_token"] = median * 1e6 / tokens
        case["us_per_token_min"] = min(wall) * 1e6 / tokens
        if device.type == "cpu":
            case["us_per_token_cpu_time"] = statistics.median(c for _, c in times) * 1e6 / tokens
        case["kib_per_token"] = peak_bytes(run, device) / 1024 / tokens
        rows.append(case)
    by_key = {(r["layer"], r["grid"]): r for r in rows}
    for r in rows:
        global_row = by_key.get(("global", r["grid"]))
        r["speedup_vs_global"] = global_row["us_per_token"] / r["us_per_token"] if global_row else None
    print_table(
        f"attention ({device_name(device)}, {args.precision}, {torch.get_num_threads()} threads, "
        f"median of {args.attn_reps} interleaved rounds)",
        rows,
        [
            ("grid", "grid", "d"),
            ("tokens", "tokens", "d"),
            ("batch", "batch", "d"),
            ("layer", "layer", ""),
            ("divisible", "grid % w == 0", ""),
            ("ms", "ms / call", ".1f"),
            ("us_per_token", "µs / token", ".3f"),
            ("kib_per_token", "KiB / token", ".1f"),
            ("speedup_vs_global", "speed-up vs global", ".2f"),
        ],
    )
    checks = []
    for w in windows:
        series = sorted((r["grid"], r["us_per_token"]) for r in rows if r["window"] == w)
        if len(series) >= 2:
            base = series[0][1]
            worst = max(abs(t / base - 1) for _, t in series)
            checks.append(
                check(
                    f"window {w}: per-token time flat within ±{WINDOW_FLATNESS_TARGET:.0%} from grid {series[0][0]} "
                    f"to {series[-1][0]}",
                    worst <= WINDOW_FLATNESS_TARGET,
                    f"largest deviation {worst:+.1%}",
                )
            )
        row = by_key.get((f"window {w}", WINDOW_SPEEDUP_GRID))
        if row is not None and row["speedup_vs_global"] is not None:
            checks.append(
                check(
                    f"window {w}: >= {WINDOW_SPEEDUP_TARGET:.0f}x faster than global at "
                    f"{WINDOW_SPEEDUP_GRID}x{WINDOW_SPEEDUP_GRID}",
                    row["speedup_vs_global"] >= WINDOW_SPEEDUP_TARGET,
                    f"{row['speedup_vs_global']:.2f}x",
                )
            )
    suite["checks"] = checks
    write_report(args, report)


# ------------------------------------------------------------------------------------------------- data suite


def photo_like(rng: Any, height: int, width: int, base: Any | None = None) -> Any:
    """A uint8 RGB image with a photograph's statistics: a smooth layout plus 1/f texture.

    ``base`` (any uint8 RGB image, e.g. a CIFAR picture) is upscaled for the layout; without it, upscaled smooth
    noise is used. The 1/f (pink) texture gives JPEG files the size of real photographs of this resolution.
    """
    import cv2
    import numpy as np

    if base is None:
        base = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    layout = cv2.resize(base, (width, height), interpolation=cv2.INTER_CUBIC).astype(np.float32)
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    amplitude = 1.0 / np.maximum(np.hypot(fy, fx), 1.0 / max(height, width))
    spectrum = amplitude[None] * (
        rng.standard_normal((3, *amplitude.shape)) + 1j * rng.standard_normal((3, *amplitude.shape))
    )
    texture = np.fft.irfft2(spectrum, s=(height, width)).transpose(1, 2, 0)
    texture = 0.7 * texture.mean(axis=2, keepdims=True) + 0.3 * texture  # mostly luminance, as in photographs
    texture *= 18.0 / texture.std()
    return np.clip(layout + texture, 0, 255).astype(np.uint8)


def find_cifar_mini(explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit)
    candidate = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10-mini"
    return candidate if candidate.is_dir() else None


def make_data(folder: Path, args: argparse.Namespace) -> tuple[list[Any], list[Path], str]:
    """CIFAR-sized uint8 arrays and JPEG files of ``--jpeg-size``; returns them and the source used."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(args.seed)
    cifar_dir = find_cifar_mini(args.cifar_mini)
    bases: list[Any] = []
    if cifar_dir is not None and cifar_dir.is_dir():
        for path in sorted(cifar_dir.glob("train/*/*.jpg"))[:: max(1, 1000 // args.data_images)][: args.data_images]:
            with Image.open(path) as image:
                bases.append(np.asarray(image.convert("RGB")))
    source = f"cifar10-mini ({cifar_dir})" if bases else "smooth noise"
    height, width = args.jpeg_size
    files = []
    for i in range(args.data_images):
        base = bases[i % len(bases)] if bases else None
        image = photo_like(rng, height, width, base)
        path = folder / f"{i:04d}.jpg"
        Image.fromarray(image).save(path, quality=90)
        files.append(path)
    if bases:
        small = bases
    else:
        import cv2

        small = [cv2.resize(photo_like(rng, 64, 64), (32, 32), interpolation=cv2.INTER_AREA) for _ in range(100)]
    return small, files, source


def per_sample_rate(fn: Callable[[Any], Any], items: Sequence[Any], samples: int) -> float:
    """Images/s of ``fn`` applied to ``samples`` items in turn, one at a time in this process."""
    start = time.perf_counter()
    for i in range(samples):
        fn(items[i % len(items)])
    return samples / (time.perf_counter() - start)


@contextlib.contextmanager
def one_worker() -> Iterator[None]:
    """Run as one data-loading worker does: one torch thread and one OpenCV thread (both restored afterwards)."""
    import cv2

    threads, cv2_threads = torch.get_num_threads(), cv2.getNumThreads()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    try:
        with warnings.catch_warnings():
            # PIL's arrays are read-only; torch warns when wrapping them, and nothing here writes to them.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            yield
    finally:
        torch.set_num_threads(threads)
        cv2.setNumThreads(cv2_threads)


def run_data_suite(args: argparse.Namespace, device: torch.device, report: dict[str, Any]) -> None:
    import albumentations as A
    import cv2
    import numpy as np
    from PIL import Image
    from torchvision.io import decode_jpeg, read_file
    from torchvision.transforms import InterpolationMode, v2

    from vit.data import CIFAR10_MEAN, CIFAR10_STD, IMAGENET_MEAN, IMAGENET_STD, build_transforms, load_rgb

    with one_worker(), tempfile.TemporaryDirectory(prefix="vit-bench-") as tmp:
        log(f"data: writing {args.data_images} JPEG files of {args.jpeg_size[0]}x{args.jpeg_size[1]}")
        cifar_images, files, source = make_data(Path(tmp), args)
        sizes = [f.stat().st_size for f in files]

        def pil_rgb(path: Path) -> Any:  # what load_rgb did before it decoded JPEGs with torchvision
            with Image.open(path) as image:
                return np.asarray(image.convert("RGB"))

        def cv2_rgb(path: Path) -> Any:
            return cv2.cvtColor(cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)

        def tv_decode(path: Path) -> torch.Tensor:
            return decode_jpeg(read_file(str(path)))

        def chw(image: Any) -> torch.Tensor:
            return torch.from_numpy(image).permute(2, 0, 1)

        def ours(preset: str, size: int, mean: Any, std: Any, normalize: bool, jitter: bool = True) -> A.Compose:
            transform = build_transforms(preset, size, True, mean, std, seed=0, normalize=normalize)  # type: ignore[arg-type]
            if not jitter:
                transform = A.Compose([t for t in transform.transforms if not isinstance(t, A.ColorJitter)], seed=0)
            return transform

        # ImageDataModule's workers stop at uint8 ("device": normalised after the copy to the accelerator);
        # normalize_on_device=False and torchvision's usual recipe normalise in the worker.
        cifar_device = ours("cifar", 32, CIFAR10_MEAN, CIFAR10_STD, normalize=False)
        cifar_worker = ours("cifar", 32, CIFAR10_MEAN, CIFAR10_STD, normalize=True)
        crop_device = ours("imagenet", 224, IMAGENET_MEAN, IMAGENET_STD, normalize=False, jitter=False)
        crop_worker = ours("imagenet", 224, IMAGENET_MEAN, IMAGENET_STD, normalize=True, jitter=False)
        preset_device = ours("imagenet", 224, IMAGENET_MEAN, IMAGENET_STD, normalize=False)
        tv_cifar = v2.Compose(
            [
                v2.Resize((32, 32), antialias=True),
                v2.Pad(4, padding_mode="reflect"),  # = cv2.BORDER_REFLECT_101
                v2.RandomCrop(32),
                v2.RandomHorizontalFlip(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(CIFAR10_MEAN, CIFAR10_STD),
            ]
        )
        tv_ops = [
            v2.RandomResizedCrop(224, scale=(0.08, 1.0), interpolation=InterpolationMode.BICUBIC, antialias=True),
            v2.RandomHorizontalFlip(),
        ]
        tv_tail = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
        tv_crop_device = v2.Compose(tv_ops)
        tv_crop_worker = v2.Compose(tv_ops + tv_tail)
        tv_preset = v2.Compose(tv_ops + [v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4)], p=0.8)] + tv_tail)

        cifar, crop, decode = (
            "CIFAR preset (pad-crop, flip, normalise)",
            "JPEG -> RRC 224 -> flip -> normalise",
            "JPEG decode only",
        )
        jitter = "JPEG -> imagenet train preset (+ colour jitter)"
        mine, tv, loader = "albumentations (ours)", "torchvision v2", "load_rgb (cv2)"
        pipelines: list[tuple[str, str, str, str, Callable[[Any], Any], str]] = [
            # (name, implementation, decoder, where the normalisation runs, fn, input kind)
            (cifar, mine, "–", "device", lambda im: cifar_device(image=im)["image"], "cifar"),
            (cifar, mine, "–", "worker", lambda im: cifar_worker(image=im)["image"], "cifar"),
            (cifar, tv, "–", "worker", lambda im: tv_cifar(chw(im)), "cifar"),
            (decode, "vit.data", loader, "–", load_rgb, "jpeg"),
            (decode, "PIL", "Image.convert('RGB')", "–", pil_rgb, "jpeg"),
            (decode, "OpenCV", "cv2.imdecode", "–", cv2_rgb, "jpeg"),
            (crop, mine, loader, "device", lambda p: crop_device(image=load_rgb(p))["image"], "jpeg"),
            (crop, mine, loader, "worker", lambda p: crop_worker(image=load_rgb(p))["image"], "jpeg"),
            (crop, mine, "PIL", "worker", lambda p: crop_worker(image=pil_rgb(p))["image"], "jpeg"),
            (crop, tv, "decode_jpeg", "device", lambda p: tv_crop_device(tv_decode(p)), "jpeg"),
            (crop, tv, "decode_jpeg", "worker", lambda p: tv_crop_worker(tv_decode(p)), "jpeg"),
            (jitter, mine, loader, "device", lambda p: preset_device(image=load_rgb(p))["image"], "jpeg"),
            (jitter, tv, "decode_jpeg", "worker", lambda p: tv_preset(tv_decode(p)), "jpeg"),
        ]
        # The pipelines must produce what the model (after the device step) eats: (3, size, size), uint8 or float32.
        for name, family, _, where, fn, kind in pipelines:
            out = fn(cifar_images[0] if kind == "cifar" else files[0])
            if name != decode:
                size = 32 if kind == "cifar" else 224
                dtype = torch.uint8 if where == "device" else torch.float32
                if tuple(out.shape) != (3, size, size) or out.dtype != dtype:
                    raise RuntimeError(f"{family} {name} ({where}): got {tuple(out.shape)} {out.dtype}")
        rates: list[list[float]] = [[] for _ in pipelines]
        for r in range(args.data_rounds):
            order = range(len(pipelines)) if r % 2 == 0 else reversed(range(len(pipelines)))  # drift hits all alike
            for i in order:
                *_, fn, kind = pipelines[i]
                items = cifar_images if kind == "cifar" else files
                samples = args.data_samples * (4 if kind == "cifar" else 1)
                rates[i].append(per_sample_rate(fn, items, samples))
            log(f"data round {r + 1}/{args.data_rounds} done")

    rows = []
    for (name, family, decoder, where, _, kind), values in zip(pipelines, rates, strict=True):
        spread = summarize(values)
        rows.append(
            {
                "pipeline": name,
                "implementation": family,
                "decoder": decoder,
                "normalise": where,
                "input": "32x32 uint8 array"
                if kind == "cifar"
                else f"{args.jpeg_size[0]}x{args.jpeg_size[1]} JPEG q90",
                "images_per_s": spread["median"],
                "ms_per_image": 1e3 / spread["median"],
                "spread": spread,
            }
        )
    report["data"] = {
        "threads": 1,  # torch and OpenCV, whatever the process default in "threads" above
        "results": rows,
        "jpeg": {
            "files": len(sizes),
            "height_width": list(args.jpeg_size),
            "quality": 90,
            "mean_kib": sum(sizes) / len(sizes) / 1024,
            "content": source + " upscaled with 1/f texture",
        },
        "notes": [
            "one worker = main process, torch.set_num_threads(1), cv2.setNumThreads(1); per-sample loop, files read "
            "from the page cache",
            "normalise 'device': the worker's output is the uint8 tensor ImageDataModule's workers return; the data "
            "module normalises the batch after the copy to the accelerator (on_after_batch_transfer), outside the "
            "worker. 'worker': A.Normalize / v2.Normalize in the worker (ImageDataModule(normalize_on_device=False))",
            "PIL draft() is not used: RandomResizedCrop may keep the whole image, so decoding at reduced size "
            "would lose resolution below the 224 output (draft((224, 224)) cannot reduce 500x375 anyway)",
            "torchvision RRC uses bicubic with antialias=True (its default antialiasing); albumentations uses "
            "cv2 INTER_CUBIC",
        ],
    }
    print_table(
        f"data (one worker: 1 thread, {device_name(torch.device('cpu'))}, median of {args.data_rounds} rounds)",
        rows,
        [
            ("pipeline", "pipeline", ""),
            ("implementation", "implementation", ""),
            ("decoder", "decoder", ""),
            ("normalise", "normalise", ""),
            ("images_per_s", "images/s", ".0f"),
            ("ms_per_image", "ms/image", ".3f"),
        ],
    )
    mean_kib = report["data"]["jpeg"]["mean_kib"]
    print(f"\nJPEG files: {len(sizes)} × {args.jpeg_size[0]}x{args.jpeg_size[1]}, quality 90, mean {mean_kib:.0f} KiB")
    decode_rate = next(r["images_per_s"] for r in rows if r["pipeline"] == decode and r["implementation"] == "vit.data")
    print(f"decoding alone (load_rgb) caps one worker at {decode_rate:.0f} images/s on this core")
    checks = []
    for row in rows:  # the targets apply to what ImageDataModule's workers run
        if row["implementation"] != mine or row["normalise"] != "device" or row["pipeline"] == jitter:
            continue
        target = DATA_CIFAR_TARGET if row["pipeline"] == cifar else DATA_JPEG_TARGET
        checks.append(
            check(
                f"{row['pipeline']} [{row['decoder']}, normalised on the device] >= {target:.0f} images/s per worker",
                row["images_per_s"] >= target,
                f"{row['images_per_s']:.0f} images/s",
            )
        )
    report["data"]["checks"] = checks
    write_report(args, report)


def write_report(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Write the JSON report (after every model and suite, so a timeout keeps what was measured)."""
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
        tmp.replace(path)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=(*SUITES, "all"), default="all", help="what to measure")
    parser.add_argument("--json", help="write the full report here")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16 = autocast")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    model = parser.add_argument_group("model suite")
    model.add_argument("--models", nargs="+", help="presets (default: vit_small_patch16_224 [and _patch4_32 on CPU])")
    model.add_argument("--batch-sizes", nargs="+", type=int, help="one for all models or one per model")
    model.add_argument(
        "--override", type=json.loads, default={}, help="JSON of model_config overrides: '{\"depth\": 2}'"
    )
    model.add_argument("--compile", action="store_true", help="torch.compile both models")
    model.add_argument("--rounds", type=int, default=None, help="alternating rounds (default: cpu 6, cuda 6)")
    model.add_argument("--steps", type=int, default=None, help="steps per model per round (default: cpu 1, cuda 10)")
    model.add_argument("--warmup", type=int, default=None, help="warm-up steps per model (default: cpu 1, cuda 5)")
    attn = parser.add_argument_group("attention suite")
    attn.add_argument("--attn-grids", nargs="+", type=int, help="patch grid sides (default: cpu 16..64, cuda 32..128)")
    attn.add_argument("--window-sizes", nargs="+", type=int, default=[7, 8])
    attn.add_argument("--attn-dim", type=int, default=384)
    attn.add_argument("--attn-heads", type=int, default=6)
    attn.add_argument("--attn-tokens", type=int, default=None, help="tokens per call (default: cpu 4096, cuda 2**17)")
    attn.add_argument("--attn-reps", type=int, default=None, help="timed calls per layer (default: cpu 9, cuda 10)")
    data = parser.add_argument_group("data suite")
    data.add_argument("--data-images", type=int, default=200, help="JPEG files to generate")
    data.add_argument("--data-samples", type=int, default=300, help="JPEG samples per round (CIFAR: 4x)")
    data.add_argument("--data-rounds", type=int, default=5)
    data.add_argument("--jpeg-size", nargs=2, type=int, default=[375, 500], metavar=("HEIGHT", "WIDTH"))
    data.add_argument("--cifar-mini", help="cifar10-mini folder for realistic content (default: ../shared/data/...)")
    args = parser.parse_args(argv)
    cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    args.device = "cuda" if cuda else "cpu"
    defaults = {
        "rounds": 6,
        "steps": 10 if cuda else 1,
        "warmup": 5 if cuda else 1,
        "attn_tokens": 2**17 if cuda else 4096,
        "attn_reps": 10 if cuda else 9,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible; use --device cpu")
    report: dict[str, Any] = environment(args, device)
    suites = SUITES if args.suite == "all" else (args.suite,)
    runners = {"model": run_model_suite, "attention": run_attention_suite, "data": run_data_suite}
    for suite in suites:
        log(f"suite {suite}")
        runners[suite](args, device, report)
    report["checks"] = [c for s in suites for c in report.get(s, {}).get("checks", [])]
    write_report(args, report)
    return report


if __name__ == "__main__":
    main()
