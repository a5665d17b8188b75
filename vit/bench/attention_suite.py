"""Attention suite: forward + backward time and peak memory per token of global against local attention.

``vit.layers.Attention`` against ``vit.layers.WindowAttention`` (non-overlapping windows, Liu et al., "Swin
Transformer", ICCV 2021) and ``vit.layers.NeighborhoodAttention`` (sliding windows, Hassani et al., "Neighborhood
Attention Transformer", CVPR 2023) as the patch grid grows, for several window and kernel sizes, and
``vit.layers.LinearAttention`` (Katharopoulos et al., ICML 2020) for the feature maps in ``linear_maps``
(``--linear_maps elu relu``), all layers sharing one set of weights.
Local and linear attention cost a fixed amount per token, so their time per token should stay flat while global
attention's grows with the number of tokens. Imports only torch and ``vit``'s layers.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from vit.bench.harness import autocast, check, log, print_table, timed, write_report
from vit.bench.memory import peak_bytes
from vit.env import device_name
from vit.kernels import neighborhood as neighborhood_kernel
from vit.layers import Attention, LinearAttention, NeighborhoodAttention, WindowAttention

WINDOW_FLATNESS_TARGET = 0.15  # per-token time within ±15 % of the smallest grid's (window, sliding, linear layers)
WINDOW_SPEEDUP_TARGET = 5.0  # over global attention at 64x64 tokens (window, sliding and linear layers)
GLOBAL_CPU_MAX_GRID = 64  # larger grids leave global attention out on the CPU: 16k tokens cost it a minute a round
WINDOW_SPEEDUP_GRID = 64


def attention_cases(
    grid: int,
    *,
    device: torch.device,
    windows: Sequence[int],
    kernels: Sequence[int] = (),
    linear_maps: Sequence[str] = (),
    dim: int = 384,
    heads: int = 6,
    tokens_per_call: int = 4096,
    seed: int = 0,
    precision: str = "fp32",
) -> list[dict[str, Any]]:
    """Global, window, sliding-window and linear attention layers (shared weights) over a ``grid × grid`` patch grid
    plus a class token, each with a forward + backward closure ``run``; windows and kernels larger than the grid are
    left out; one linear layer per feature map in ``linear_maps``. On the CPU, grids above
    :data:`GLOBAL_CPU_MAX_GRID` leave the global layer out (its weights are still the others').

    Args:
        grid: Side of the patch grid.
        device: Where the layers run.
        windows: Block-window sides.
        kernels: Sliding-window kernel sides.
        linear_maps: Feature maps of the linear-attention layers.
        dim: Embedding width.
        heads: Attention heads.
        tokens_per_call: Tokens of one call: the batch is ``max(1, tokens_per_call // (1 + grid²))``.
        seed: Seed of the weights.
        precision: ``fp32``, or ``bf16`` autocast.
    """
    tokens = 1 + grid * grid
    batch = max(1, tokens_per_call // tokens)
    torch.manual_seed(seed)
    reference = Attention(dim, heads, qkv_bias=True)
    layers: dict[str, nn.Module] = {"global": reference}
    for w in windows:
        if w <= grid:
            layer = WindowAttention(dim, heads, qkv_bias=True, grid_size=grid, window_size=w, num_prefix_tokens=1)
            layer.load_state_dict(reference.state_dict())
            layers[f"window {w}"] = layer
    for k in kernels:
        if k <= grid:
            layer = NeighborhoodAttention(dim, heads, qkv_bias=True, grid_size=grid, kernel_size=k, num_prefix_tokens=1)
            layer.load_state_dict(reference.state_dict())
            layers[f"sliding {k}"] = layer
    for feature_map in linear_maps:
        layer = LinearAttention(dim, heads, qkv_bias=True, feature_map=feature_map)
        layer.load_state_dict(reference.state_dict())
        layers[f"linear {feature_map}"] = layer
    if device.type == "cpu" and grid > GLOBAL_CPU_MAX_GRID:
        del layers["global"]
    x = torch.randn(batch, tokens, dim, device=device, requires_grad=True)
    grad = torch.randn(batch, tokens, dim, device=device)

    def step(layer: nn.Module) -> Callable[[], None]:
        def run() -> None:
            with autocast(device, precision):
                out = layer(x)
            out.backward(grad.to(out.dtype))
            x.grad = None
            layer.zero_grad(set_to_none=True)

        return run

    cases = []
    for name, layer in layers.items():
        w = layer.window_size if isinstance(layer, WindowAttention) else None
        k = layer.kernel_size if isinstance(layer, NeighborhoodAttention) else None
        case = {"grid": grid, "tokens": tokens, "batch": batch, "layer": name, "window": w, "kernel": k}
        case["divisible"] = None if w is None else grid % w == 0
        case["run"] = step(layer.to(device))
        cases.append(case)
    return cases


def run_attention_suite(
    *,
    device: torch.device,
    report: dict[str, Any],
    grids: Sequence[int] | None = None,
    windows: Sequence[int] = (7, 8),
    kernels: Sequence[int] = (7, 9),
    linear_maps: Sequence[str] = ("elu", "relu"),
    dim: int = 384,
    heads: int = 6,
    tokens_per_call: int = 4096,
    reps: int = 9,
    seed: int = 0,
    precision: str = "fp32",
    freed_memory_kept: bool = False,
    json_path: str | None = None,
) -> None:
    """Measure every layer on every grid, print the table and the checks, and fill ``report["attention"]``.

    Args:
        device: Where the layers run.
        report: The report to fill (written to ``json_path`` when given).
        grids: Patch grid sides (default: cpu 16..64, cuda 32..128).
        windows: Block-window sides.
        kernels: Sliding-window kernel sides (odd).
        linear_maps: Feature maps of the linear-attention rows (none: no such rows).
        dim: Embedding width.
        heads: Attention heads.
        tokens_per_call: Tokens per call (``vit bench``: cpu 4096, cuda 2**17).
        reps: Timed calls per layer, interleaved (``vit bench``: cpu 9, cuda 10).
        seed: Seed of the weights.
        precision: ``fp32``, or ``bf16`` autocast.
        freed_memory_kept: Whether malloc keeps freed memory (:mod:`vit.allocator`), for the table's title.
        json_path: Where the report is written.
    """
    grids = list(grids or ([16, 24, 32, 48, 56, 64] if device.type == "cpu" else [32, 48, 64, 96, 112, 128]))
    layers = {"dim": dim, "heads": heads, "tokens_per_call": tokens_per_call, "seed": seed, "precision": precision}
    suite = report.setdefault("attention", {})
    suite["notes"] = [
        f"dim {dim}, {heads} heads, 1 class token, qkv bias; forward + backward (input grads "
        "included) under the chosen precision; batch = max(1, attn_tokens // tokens)",
        "memory: "
        + (
            "torch.cuda.max_memory_allocated increase"
            if device.type == "cuda"
            else "tensor bytes tracked per op (TorchDispatchMode)"
        )
        + " during one forward + backward, per token; parameters excluded",
    ]
    cases = [
        case
        for grid in grids
        for case in attention_cases(
            grid, device=device, windows=windows, kernels=kernels, linear_maps=linear_maps, **layers
        )
    ]
    rows, sliding_path = measure_attention(
        cases, grids=grids, kernels=kernels, device=device, reps=reps, precision=precision, suite=suite
    )
    print_attention_table(
        rows,
        device=device,
        precision=precision,
        reps=reps,
        freed_memory_kept=freed_memory_kept,
        sliding_path=sliding_path,
    )
    suite["checks"] = attention_checks(rows, windows=windows, kernels=kernels, linear_maps=linear_maps, device=device)
    write_report(json_path, report)


def measure_attention(
    cases: list[dict[str, Any]],
    *,
    grids: Sequence[int],
    kernels: Sequence[int],
    device: torch.device,
    reps: int,
    precision: str,
    suite: dict[str, Any],
) -> tuple[list[dict[str, Any]], str]:
    """Time and measure every case of :func:`attention_cases` on ``grids`` (``reps`` interleaved rounds); fills
    ``suite["results"]`` and returns its rows and which CPU path the sliding rows (``kernels``) measure (``""`` when
    that does not apply)."""
    log(f"attention: warm-up of {len(cases)} layers on grids {grids}")
    for case in cases:
        timed(case["run"], 1, device)
    sliding_path = ""  # which CPU path the sliding rows measure, for the table's title and the report
    if device.type == "cpu" and kernels and precision == "fp32":
        kernel = neighborhood_kernel.available()
        sliding_path = "the fused kernel" if kernel else "tiles"
        reason = "" if kernel else f"; the kernel is unavailable: {neighborhood_kernel.status()}"
        suite["notes"].append(f"sliding windows on the CPU: {sliding_path}{reason}")
        log(suite["notes"][-1])
    # Every round times every layer on every grid, so load changes on a shared machine hit all grids alike.
    seconds: list[list[tuple[float, float]]] = [[] for _ in cases]
    for r in range(reps):
        for case, times in zip(cases, seconds, strict=True):
            times.append(timed(case["run"], 1, device))
        log(f"attention round {r + 1}/{reps}")
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
        if global_row and "us_per_token_cpu_time" in r:
            r["speedup_vs_global_cpu_time"] = global_row["us_per_token_cpu_time"] / r["us_per_token_cpu_time"]
    return rows, sliding_path


def print_attention_table(
    rows: list[dict[str, Any]],
    *,
    device: torch.device,
    precision: str,
    reps: int,
    freed_memory_kept: bool,
    sliding_path: str,
) -> None:
    """Print the attention table."""
    threads = torch.get_num_threads()
    print_table(
        f"attention ({device_name(device)}, {precision}, {threads} thread{'s' * (threads != 1)}, "
        f"median of {reps} interleaved rounds, malloc "
        f"{'keeps freed memory' if freed_memory_kept else 'defaults'}"
        f"{f', sliding: {sliding_path}' if sliding_path else ''})",
        rows,
        [
            ("grid", "grid", "d"),
            ("tokens", "tokens", "d"),
            ("batch", "batch", "d"),
            ("layer", "layer", ""),
            ("divisible", "grid % w == 0", ""),
            ("ms", "ms / call", ".1f"),
            ("us_per_token", "µs / token", ".3f"),
            ("us_per_token_cpu_time", "CPU µs / token", ".3f"),
            ("kib_per_token", "KiB / token", ".1f"),
            ("speedup_vs_global", "speed-up vs global", ".2f"),
            ("speedup_vs_global_cpu_time", "CPU-time speed-up", ".2f"),
        ],
    )


def attention_checks(
    rows: list[dict[str, Any]],
    *,
    windows: Sequence[int],
    kernels: Sequence[int],
    linear_maps: Sequence[str],
    device: torch.device,
) -> list[dict[str, Any]]:
    """Flatness and speed-up checks of the window, sliding and linear layers."""
    # With one thread on the CPU the process time is the work itself, and does not count waiting for a core that
    # another process holds: the checks read it there, the wall clock elsewhere.
    cpu_time = device.type == "cpu" and torch.get_num_threads() == 1
    measure = "us_per_token_cpu_time" if cpu_time else "us_per_token"
    clock = "CPU time" if cpu_time else "wall clock"
    speedup = "speedup_vs_global_cpu_time" if cpu_time else "speedup_vs_global"
    by_key = {(r["layer"], r["grid"]): r for r in rows}
    checks = []
    names = [f"window {w}" for w in windows] + [f"sliding {k}" for k in kernels]
    for name in names + [f"linear {feature_map}" for feature_map in linear_maps]:
        series = sorted((r["grid"], r[measure]) for r in rows if r["layer"] == name)
        if len(series) >= 2:
            base = series[0][1]
            worst = max(abs(t / base - 1) for _, t in series)
            checks.append(
                check(
                    f"{name}: per-token time flat within ±{WINDOW_FLATNESS_TARGET:.0%} from grid {series[0][0]} "
                    f"to {series[-1][0]}",
                    worst <= WINDOW_FLATNESS_TARGET,
                    f"largest deviation {worst:.1%} ({clock})",
                )
            )
        row = by_key.get((name, WINDOW_SPEEDUP_GRID))
        if row is not None and row.get(speedup) is not None:
            checks.append(
                check(
                    f"{name}: >= {WINDOW_SPEEDUP_TARGET:.0f}x faster than global at "
                    f"{WINDOW_SPEEDUP_GRID}x{WINDOW_SPEEDUP_GRID}",
                    row[speedup] >= WINDOW_SPEEDUP_TARGET,
                    f"{row[speedup]:.2f}x ({clock})",
                )
            )
    return checks
