"""``vit bench`` (``python -m vit.bench``): our ViT against timm's, global against local attention, the data pipelines,
the attention explorer, and the learning-rate sensitivity of a training recipe.

Suites (``--suite model|attention|data|explorer|recipe|all``), each printing a table and writing one JSON report
(``--json``) with the date, versions, device name, thread count and every setting:

- ``model``: training-step (forward, backward, AdamW step) and inference throughput of a preset against timm's
  ``VisionTransformer`` built from the same configuration and loaded with the same weights, measured alternately
  (ours then timm, then timm then ours, ...) for several rounds after warm-up; per-round ratios (ours / timm, above
  1 means we are faster) and their median; peak tensor memory; FLOPs per image and, on CUDA, MFU; and the peak
  activation memory of a training step with ``set_grad_checkpointing`` against without it.
- ``attention``: forward + backward time and peak memory per token of ``vit.layers.Attention`` against
  ``vit.layers.WindowAttention`` (block windows), ``vit.layers.NeighborhoodAttention`` (sliding windows) and
  ``vit.layers.LinearAttention`` as the patch grid grows, for several window and kernel sizes.
- ``data``: images/s of one worker (one core, main process) for our albumentations pipelines and torchvision v2
  equivalents: the CIFAR preset on 32×32 images, and JPEG decode -> random-resized crop 224 -> flip -> normalise,
  with the normalisation in the worker or, as ``ImageDataModule`` does it, on the device after the copy.
- ``explorer``: the size of the attention explorer's HTML file, the time to write it and, where a Chromium is
  found, the browser's time to open it and to answer a click.
- ``recipe``: a narrow, shallow proxy of ``configs/cifar10_speedrun.yaml`` trained in bf16 autocast at several peak
  learning rates, once per variant of the recipe (qk-norm, layer scale, z-loss, AdamW beta2 0.95, a 3x warm-up and
  their combinations); per run the final loss, whether it diverged, and per block the largest attention logit,
  attention entropy, gradient norm and update/weight ratio; per variant the largest stable learning rate
  (Wortsman et al., 2023). It trains dozens of models (minutes each on a CPU), so ``--suite all`` leaves it out:
  ask for it with ``--suite recipe``.
- ``serve``: ``vit serve`` under load from locust on the loopback interface: the offline batched rate (the limit),
  images/s at saturation, latency percentiles against offered load, 200 or 503 only (none lost) at twice the
  saturation rate, an optional soak, torch against ONNX Runtime at batch 1 (:mod:`vit.bench.serve_suite`); ask for
  it with ``--suite serve --serve_model MODEL``.
- ``corruption``: generation time of the 15 common corruptions x 5 severities on real CIFAR-10 test images
  (``--corruption_data``), per corruption with where its time goes, and the disk cache's write and read; ask for it
  with ``--suite corruption``.

Every suite runs with glibc's malloc keeping freed memory for reuse (:mod:`vit.allocator`), as ``vit`` commands do;
``--keep_freed_memory false`` measures with the C library's defaults.

The ``model`` and ``attention`` suites import only torch, timm and ``vit``'s model code; albumentations, OpenCV,
torchvision and ``vit.data`` are imported by the ``data`` suite only, the explorer by the ``explorer`` suite only.
``--precision`` defaults to fp32, except for the ``recipe`` suite (bf16, the recipe's precision).

Examples::

    python -m vit.bench --suite model --models vit_small_patch16_224 vit_small_patch4_32 --batch_sizes 8 64
    python -m vit.bench --suite attention --json runs/attention.json
    python -m vit.bench --suite model --device cuda --precision bf16 --compile --batch_sizes 512
    python -m vit.bench --suite recipe --threads 1 --data.data_dir cifar10 --recipe_steps 300 --json runs/recipe.json

``scripts/benchmark.py`` is the same command, with cifar10-mini's pictures for the data suite when they are found.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from vit.allocator import keep_freed_memory
from vit.bench.defaults import EXPLORER_CASES, RECIPE_LRS, RECIPE_VARIANTS
from vit.bench.harness import BenchError, log, write_report
from vit.env import available_cores, busy_cores, default_threads, run_header
from vit.errors import ArgumentParser, add_switch, fail


def _common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", choices=(*SUITES, "all"), default="all", help="what to measure")
    parser.add_argument("--json", help="write the full report here")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument(
        "--precision", choices=("fp32", "bf16"), default=None, help="bf16 = autocast (default: recipe bf16, else fp32)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads (default: the cores this process may use "
        "minus those other processes keep busy now (/proc/stat), at least 1, as vit explain: all cores on an idle "
        "machine; see "
        "vit.env.default_threads)",
    )
    parser.add_argument("--seed", type=int, default=0)
    add_switch(
        parser,
        "--keep_freed_memory",
        default=True,
        help="glibc malloc keeps freed blocks for reuse, as training does (vit.allocator); false measures with the C "
        "library's defaults",
    )


def _model_options(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model suite")
    model.add_argument("--models", nargs="+", help="presets (default: vit_small_patch16_224 [and _patch4_32 on CPU])")
    model.add_argument("--batch_sizes", nargs="+", type=int, help="one for all models or one per model")
    model.add_argument(
        "--override", type=json.loads, default={}, help="JSON of model_config overrides: '{\"depth\": 2}'"
    )
    model.add_argument("--compile", action="store_true", help="torch.compile both models")
    model.add_argument("--rounds", type=int, default=None, help="alternating rounds (default: cpu 6, cuda 6)")
    model.add_argument("--steps", type=int, default=None, help="steps per model per round (default: cpu 1, cuda 10)")
    model.add_argument("--warmup", type=int, default=None, help="warm-up steps per model (default: cpu 1, cuda 5)")


def _model_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "models": args.models, "batch_sizes": args.batch_sizes, "override": args.override, "compile": args.compile,
        "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup, "precision": args.precision,
    }  # fmt: skip


def _attention_options(parser: argparse.ArgumentParser) -> None:
    attn = parser.add_argument_group("attention suite")
    attn.add_argument(
        "--attn_grids",
        nargs="+",
        type=int,
        help="patch grid sides (default: cpu 16..64, cuda 32..128; global attention stops at 64 on the cpu)",
    )
    attn.add_argument("--window_sizes", nargs="*", type=int, default=[7, 8], help="block windows (default: 7 8)")
    attn.add_argument(
        "--sliding_sizes", nargs="*", type=int, default=[7, 9], help="sliding-window kernels, odd (default: 7 9)"
    )
    attn.add_argument(
        "--linear_maps",
        nargs="*",
        choices=("elu", "relu"),
        default=["elu", "relu"],
        help="linear-attention rows for these feature maps (default: elu relu; none: leave them out)",
    )
    attn.add_argument("--attn_dim", type=int, default=384)
    attn.add_argument("--attn_heads", type=int, default=6)
    attn.add_argument("--attn_tokens", type=int, default=None, help="tokens per call (default: cpu 4096, cuda 2**17)")
    attn.add_argument("--attn_reps", type=int, default=None, help="timed calls per layer (default: cpu 9, cuda 10)")


def _attention_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "grids": args.attn_grids, "windows": args.window_sizes, "kernels": args.sliding_sizes,
        "linear_maps": args.linear_maps, "dim": args.attn_dim, "heads": args.attn_heads,
        "tokens_per_call": args.attn_tokens, "reps": args.attn_reps, "precision": args.precision,
        "freed_memory_kept": args.freed_memory_kept,
    }  # fmt: skip


def _data_options(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("data suite")
    data.add_argument("--data_images", type=int, default=200, help="JPEG files to generate")
    data.add_argument("--data_samples", type=int, default=300, help="JPEG samples per round (CIFAR: 4x)")
    data.add_argument("--data_rounds", type=int, default=5)
    data.add_argument("--jpeg_size", nargs=2, type=int, default=[375, 500], metavar=("HEIGHT", "WIDTH"))
    data.add_argument(
        "--cifar_mini", help="folder of small photos (<class>/*.jpg or train/<class>/*.jpg) for realistic content"
    )


def _data_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "images": args.data_images, "samples": args.data_samples, "rounds": args.data_rounds,
        "jpeg_size": args.jpeg_size, "cifar_mini": args.cifar_mini,
    }  # fmt: skip


def _explorer_options(parser: argparse.ArgumentParser) -> None:
    from vit.explain.command import explorer_bits

    explorer = parser.add_argument_group("explorer suite")
    explorer.add_argument("--explorer_weights", help="state dict of a trained cifar10_cpu model (default: initialised)")
    explorer.add_argument("--explorer_browser", default=None, help="Chromium executable (default: chromium on PATH)")
    explorer.add_argument(
        "--explorer_bits",
        type=explorer_bits,
        choices=("auto", *range(2, 9)),
        metavar="{auto,2..8}",
        default="auto",
        help="bits per attention code (default: auto, the finest of 6 to 3 that fits the case's budget)",
    )
    explorer.add_argument(
        "--explorer_cases",
        nargs="+",
        choices=EXPLORER_CASES,
        default=list(EXPLORER_CASES),
        help="models to measure (default: all)",
    )


def _explorer_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "cases": args.explorer_cases, "weights": args.explorer_weights, "browser": args.explorer_browser,
        "bits": args.explorer_bits, "cifar_mini": args.cifar_mini,
    }  # fmt: skip


def _recipe_options(parser: argparse.ArgumentParser) -> None:
    recipe = parser.add_argument_group("recipe suite")
    recipe.add_argument(
        "--recipe_lrs",
        nargs="+",
        type=float,
        default=list(RECIPE_LRS),
        help="peak learning rates (default: %(default)s)",
    )
    recipe.add_argument(
        "--recipe_variants",
        nargs="+",
        default=list(RECIPE_VARIANTS),
        help="changes joined by '+': baseline qk_norm layer_scale z_loss beta2_095 warmup_3x (default: %(default)s)",
    )
    recipe.add_argument("--recipe_steps", type=int, default=300, help="optimiser steps per run (10%% warm-up)")
    recipe.add_argument("--recipe_batch_size", type=int, default=256)
    recipe.add_argument("--recipe_width", type=int, default=128, help="embed_dim of the proxy")
    recipe.add_argument("--recipe_depth", type=int, default=4, help="blocks of the proxy")
    recipe.add_argument("--recipe_heads", type=int, default=2, help="attention heads of the proxy")
    recipe.add_argument("--recipe_probe_every", type=int, default=25, help="steps between attention/update probes")
    recipe.add_argument("--recipe_train_images", type=int, default=10000, help="random training images decoded")
    recipe.add_argument("--recipe_eval_images", type=int, default=1000, help="of them held out for accuracy (0: none)")
    recipe.add_argument(
        "--data.data_dir",
        dest="data_dir",
        help="folder of train/<class>/*.jpg (default: scikit-learn's digits upscaled to 32x32 RGB)",
    )


def _recipe_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "lrs": args.recipe_lrs, "variants": args.recipe_variants, "steps": args.recipe_steps,
        "batch_size": args.recipe_batch_size, "width": args.recipe_width, "depth": args.recipe_depth,
        "heads": args.recipe_heads, "probe_every": args.recipe_probe_every, "train_images": args.recipe_train_images,
        "eval_images": args.recipe_eval_images, "data_dir": args.data_dir, "precision": args.precision,
    }  # fmt: skip


def _corruption_options(parser: argparse.ArgumentParser) -> None:
    corruption = parser.add_argument_group("corruption suite")
    corruption.add_argument("--corruption_data", help="folder of the CIFAR-10 test images (<class>/*.jpg)")
    corruption.add_argument("--corruption_images", type=int, default=10000, help="images per cell")


def _corruption_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {"data_dir": args.corruption_data, "images": args.corruption_images}


def _serve_options(parser: argparse.ArgumentParser) -> None:
    serve = parser.add_argument_group("serve suite (vit serve under load, locust on 127.0.0.1)")
    serve.add_argument(
        "--serve_model",
        help="what vit serve takes (a checkpoint or a vit export folder), or preset:NAME: the preset "
        "with random weights (e.g. preset:vit_small_patch16_224)",
    )
    serve.add_argument("--serve_batch_size", type=int, default=8, help="the server's --max_batch_size (default: 8)")
    serve.add_argument("--serve_queue", type=int, default=64, help="the server's --max_queue (default: 64)")
    serve.add_argument("--serve_batch_timeout", type=float, help="the server's --batch_timeout (default: its own, 0)")
    serve.add_argument("--serve_seconds", type=float, default=20.0, help="seconds of each load run (default: 20)")
    serve.add_argument(
        "--serve_loads", nargs="+", type=float, default=[0.25, 0.5, 0.75, 1.0, 1.5, 2.0],
        help="offered loads, fractions of the saturation rate (default: %(default)s)",
    )  # fmt: skip
    serve.add_argument("--serve_backends", nargs="*", choices=("torch", "onnx"), default=["torch", "onnx"])
    serve.add_argument(
        "--serve_soak_s", type=float, default=0.0,
        help="seconds at half load, memory before/after (default 0: none; a full run: 300, the goal's 5 minutes)",
    )  # fmt: skip
    serve.add_argument("--serve_figure", help="the figure (default: beside --json, else serve_load.png)")
    serve.add_argument(
        "--serve_short", action="store_true", help="a quick check: 3 s runs, loads 0.5 and 2, torch only"
    )


def _serve_settings(args: argparse.Namespace) -> dict[str, Any]:
    short = args.serve_short
    return {
        "model": args.serve_model, "threads": args.threads, "max_batch_size": args.serve_batch_size,
        "max_queue": args.serve_queue, "batch_timeout": args.serve_batch_timeout,
        "seconds": 3.0 if short else args.serve_seconds,
        "fractions": [0.5, 2.0] if short else args.serve_loads,
        "backends": ["torch"] if short else args.serve_backends, "soak_s": args.serve_soak_s,
        "figure": args.serve_figure,
    }  # fmt: skip


@dataclass(frozen=True)
class Suite:
    """One suite of the command: the function that measures and reports (``"module:function"``, imported only when
    the suite runs), the option group it adds to the parser, and the keywords it takes from the parsed options.

    Args:
        function: ``"vit.bench.model_suite:run_model_suite"``; it is called with these keywords, ``report``,
            ``seed``, ``json_path`` and, with ``device=True``, ``device``.
        options: Adds the suite's option group to the parser.
        settings: The suite's keywords from the parsed options.
        device: Whether the function takes the ``device``.
        in_all: Whether ``--suite all`` runs it.
    """

    function: str
    options: Callable[[argparse.ArgumentParser], None]
    settings: Callable[[argparse.Namespace], dict[str, Any]]
    device: bool = True
    in_all: bool = True


SUITES: dict[str, Suite] = {
    "model": Suite("vit.bench.model_suite:run_model_suite", _model_options, _model_settings),
    "attention": Suite("vit.bench.attention_suite:run_attention_suite", _attention_options, _attention_settings),
    # albumentations, OpenCV and vit.data: imported only when asked for
    "data": Suite("vit.bench.data_suite:run_data_suite", _data_options, _data_settings, device=False),
    # writes HTML files and drives a browser
    "explorer": Suite("vit.bench.explorer_suite:run_explorer_suite", _explorer_options, _explorer_settings),
    # trains dozens of models for minutes each: only when asked for
    "recipe": Suite("vit.bench.recipe_suite:run_recipe_suite", _recipe_options, _recipe_settings, in_all=False),
    # numpy / scipy / OpenCV only, minutes of CPU: only when asked for
    "corruption": Suite(
        "vit.bench.corruption_suite:run_corruption_suite",
        _corruption_options,
        _corruption_settings,
        device=False,
        in_all=False,
    ),
    # starts vit serve and locust as subprocesses for minutes: only when asked for
    "serve": Suite(
        "vit.bench.serve_suite:run_serve_suite", _serve_options, _serve_settings, device=False, in_all=False
    ),
}
"""The suites in the order ``--suite all`` runs them; a new suite is one entry here (and its module)."""
ALL_SUITES = tuple(name for name, suite in SUITES.items() if suite.in_all)
OLD_SPELLINGS = {
    "--data-dir": "--data.data_dir",
    "--data_dir": "--data.data_dir",
    "--no-keep-freed-memory": "--keep_freed_memory false",
}
"""Older spellings of options that are more than ``-`` for ``_`` (:class:`vit.errors.ArgumentParser`)."""


def build_parser(prog: str = "vit bench") -> argparse.ArgumentParser:
    """Every option of every suite, each suite's in its group; defaults that depend on the device are ``None`` here
    (see ``parse_args``)."""
    parser = ArgumentParser(prog=prog, doc=__doc__, renamed=OLD_SPELLINGS)
    _common_options(parser)
    for suite in SUITES.values():
        suite.options(parser)
    return parser


def parse_args(argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """Parse ``argv`` and fill the device-dependent defaults; sets torch's thread count (``--threads``, by default
    :func:`~vit.env.default_threads`),
    and glibc's malloc thresholds unless ``--keep_freed_memory false`` (``args.freed_memory_kept`` says whether they
    are set)."""
    parser = parser or build_parser()
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be positive, got {args.threads}")
    import torch

    cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    args.device = "cuda" if cuda else "cpu"
    if args.precision is None:
        args.precision = "bf16" if args.suite == "recipe" else "fp32"
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
    busy = busy_cores()
    if args.threads is None:
        args.threads = default_threads(available_cores(), busy)
    torch.set_num_threads(args.threads)
    log(f"threads: {args.threads} of {available_cores()} cores, {busy:.1f} busy with other processes")
    args.freed_memory_kept = keep_freed_memory() if args.keep_freed_memory else False
    return args


def run(args: argparse.Namespace, command: str = "vit bench") -> dict[str, Any]:
    """Run the suites that ``args`` (from :func:`parse_args`) chose, each with its settings as keywords: print their
    tables and checks, write the JSON report; returns the report.

    Args:
        args: The parsed command line.
        command: The command line, for the report's header.

    Raises:
        BenchError: a setting that cannot be measured (no CUDA device, batch sizes that do not match the models).
    """
    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda: no CUDA device is visible; use --device cpu")
    import timm

    header = run_header(command, device=device)
    report: dict[str, Any] = {
        **header,
        "torch": header["versions"]["torch"],
        "timm": timm.__version__,
        "python": header["versions"]["python"],
        "settings": dict(vars(args)),
    }
    common = {"report": report, "seed": args.seed, "json_path": args.json}
    suites = ALL_SUITES if args.suite == "all" else (args.suite,)
    for name in suites:
        log(f"suite {name}")
        suite = SUITES[name]
        module, function = suite.function.split(":")
        where = {"device": device} if suite.device else {}
        getattr(import_module(module), function)(**suite.settings(args), **where, **common)
    report["checks"] = [c for s in suites for c in report.get(s, {}).get("checks", [])]
    write_report(args.json, report)
    return report


def main(argv: Sequence[str] | None = None, prog: str = "vit bench") -> dict[str, Any]:
    """The command line: parse, run, and turn a bad setting into one ``error:`` line and exit status 2; returns the
    report (:func:`run`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv, build_parser(prog))
    try:
        return run(args, command=shlex.join([*prog.split(), *argv]))
    except BenchError as err:
        fail(err)
