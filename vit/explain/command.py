"""``vit explain`` (``scripts/explain.py``): explain images with any registered method, measure which map to believe.

    vit explain CHECKPOINT IMAGE_OR_FOLDER [...] [--methods attnlrp,rollout,...] [--faithfulness] [--json out.json]
                [--html report.html] [--out explanations]
    vit explain CHECKPOINT --split val --limit 500 --methods rollout,attribution,attnlrp,ig --faithfulness

CHECKPOINT is a Lightning ``.ckpt`` written by ``vit fit`` (model, image size, normalisation and class names come
from it), or plain weights (``.pth``/``.safetensors``, timm's included) with ``--model PRESET`` (ImageNet
normalisation, ``--img-size``, class indices as names). ``--methods`` takes names of ``vit.explain.METHODS``
(default: AttnLRP, the map measured most faithful among those a plain install has). Per image and method it writes
``<out>/<name>_<method>.png`` (image | overlay with a colour bar, prediction in the caption) plus a grid per method,
and prints the predicted class and its probability. ``--faithfulness`` measures every method by deletion and
insertion beside a random patch order (Petsiuk et al., "RISE", BMVC 2018) with 95 % bootstrap intervals and the
time per image (:func:`~vit.explain.benchmark_methods`), prints the table and writes it as JSON (``--json``, else
``<out>/faithfulness.json``) with the curves as ``<out>/faithfulness_curves.png``. Bad input (an unknown method, one
that does not apply to the model, a method whose optional extra is missing) is one ``error:`` line and exit status 2,
before anything is written; every file is written to a temporary name and renamed. Results go to stdout, progress to
stderr: a bar per method and phase (maps, curves, overlays) on a terminal, else a plain line every 10 s with the
count and the elapsed time, and one line per finished phase either way: loading (with the thread count:
``--threads``, by default the cores not already busy), predictions, each method's maps and curves, overlays, report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, get_args

import torch
from torch import nn

from ..atomic import write_bytes
from ..bench.harness import available_cores, busy_load, default_threads, device_name
from ..checkpoints import check_checkpoint_path, data_settings, load_checkpoint, load_file, rebuild_datamodule
from ..errors import ArgumentParser, InputError, UsageError, VitError, error_message, fail
from ..normalize import IMAGENET_MEAN, IMAGENET_STD, normalize
from .colors import is_signed
from .method_benchmark import MethodBenchmark, benchmark_methods, timed_maps
from .methods import ALIASES, DEFAULT_METHOD, METHODS, get_method, require_extras
from .panels import png_bytes, render_grid, render_panel
from .progress import Progress, stop_all
from .report import render_report
from .results import Results, benchmark_scores, block_index, compute
from .rollout import HeadFusion

MAX_IMAGE_PIXELS = 50_000_000
"""``--max-image-pixels``' default: the limit of ``vit predict`` (:data:`vit.data.datasets.MAX_IMAGE_PIXELS`)."""
LEGACY_METHODS = {"rollout": ["rollout"], "attribution": ["attribution"], "both": ["rollout", "attribution"]}
"""``--method``, the option before ``--methods``: kept as an alias for scripts written against it."""
GRID_IMAGES = 32  # the grid PNG shows the first images only


@dataclass
class Explainer:
    """A network with the preprocessing it was trained with."""

    model: nn.Module
    img_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    preset: str
    class_names: list[str] | None
    data: Any = None  # the run's ImageDataModule (checkpoints of `vit fit` whose data settings work here)
    model_name: str | None = None  # the preset, where known


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def load_explainer(checkpoint: Path, model_name: str | None = None, img_size: int | None = None) -> Explainer:
    """A checkpoint of ``vit fit`` (it describes its model and preprocessing), or plain weights loaded into preset
    ``model_name``.

    Raises:
        InputError: If the file holds plain weights without ``model_name``, or ``model_name`` is unknown or does not
            fit the weights.
        CheckpointError: If the path is missing or a folder, the file is not a checkpoint, or a Lightning checkpoint
            that does not describe its model.
    """
    from ..models import create_model, load_pretrained

    check_checkpoint_path(checkpoint)  # missing, or a folder: the wording of every command
    raw = load_file(checkpoint)
    if isinstance(raw, dict) and "hyper_parameters" in raw and model_name is None:
        return _from_checkpoint(checkpoint, raw)
    if model_name is None:
        raise InputError(
            f"{checkpoint} holds plain weights, not a Lightning checkpoint of vit.ImageClassifier: "
            "say which model they belong to with --model PRESET (see vit.list_models())"
        )
    try:
        model = create_model(model_name, **({"img_size": img_size} if img_size else {}))
    except Exception as err:
        raise InputError(f"--model {model_name}: {_first_line(err)} (see vit.list_models())") from None
    try:
        load_pretrained(model, raw)
    except Exception as err:
        raise InputError(f"--model {model_name} does not fit {checkpoint}: {_first_line(err)}") from None
    return Explainer(
        model.eval(), model.patch_embed.img_size[0], IMAGENET_MEAN, IMAGENET_STD, "imagenet", None, None, model_name
    )


def _from_checkpoint(checkpoint: Path, raw: dict) -> Explainer:
    """A checkpoint of ``vit fit``: model, image size, statistics and class names from its description
    (:mod:`vit.checkpoints`); the run's data module is kept for ``--split val`` when its settings work here."""
    loaded = load_checkpoint(checkpoint)  # the EMA weights when the run kept an EMA, as validation used
    meta = loaded.meta
    # A few hundred images: worker processes would cost more than they save.
    datamodule = rebuild_datamodule(data_settings(raw), num_workers=0)
    return Explainer(loaded.model, int(meta["img_size"][0]), tuple(meta["mean"]), tuple(meta["std"]),
                     meta["eval_transform"], meta.get("class_names"), datamodule, meta.get("model_name"))  # fmt: skip


def load_split(explainer: Explainer, limit: int | None = None) -> tuple[list[Path], torch.Tensor, torch.Tensor]:
    """The run's validation split through its eval transform: names ``val/<index>``, images, labels.

    Args:
        explainer: The loaded checkpoint with its data module.
        limit: Keep ``limit`` images evenly spaced over the split (splits are often sorted by class, so the first
            ``limit`` could all be one class); ``None`` keeps all.

    Raises:
        InputError: If the checkpoint's data settings are not usable on this machine.
    """
    if explainer.data is None:
        raise InputError("--split val needs a checkpoint of `vit fit` whose data settings work here; pass image files")
    batches = [(batch[0].cpu(), batch[1].cpu()) for batch in explainer.data.val_dataloader()]
    images, labels = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    index = torch.arange(len(images))
    if limit is not None and limit < len(images):
        index = torch.linspace(0, len(images) - 1, limit).round().long()
    return [Path("val") / f"{i:05d}" for i in index.tolist()], images[index], labels[index]


def find_images(inputs: Sequence[str]) -> list[Path]:
    """Image files named on the command line, and those anywhere inside named folders, sorted per folder."""
    from ..data import DataError, list_predict_files  # the folder walk of `vit predict --data.predict_dir`

    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            try:
                files += [Path(found) for found, _ in list_predict_files(path)]
            except DataError as err:
                raise InputError(str(err)) from None
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"{path}: no such image file or folder; pass image files or folders after the checkpoint")
    if not files:
        raise InputError("no images given: pass image files or folders after the checkpoint")
    return files


def output_stems(files: Sequence[Path]) -> list[str]:
    """One output stem per file: its stem, ``<folder>_<stem>`` where stems repeat, then an index if still equal."""
    stems = [file.stem for file in files]
    names = [f"{file.parent.name}_{file.stem}" if stems.count(file.stem) > 1 else file.stem for file in files]
    return [f"{name}_{i}" if names.count(name) > 1 else name for i, name in enumerate(names)]


def load_images(explainer: Explainer, files: Sequence[Path], max_pixels: int | None = MAX_IMAGE_PIXELS) -> torch.Tensor:
    """``(B, 3, img_size, img_size)`` uint8 pixels through the run's eval transform (normalised later, once).

    Args:
        explainer: The loaded checkpoint with its preprocessing.
        files: Image files.
        max_pixels: Refuse an image whose header claims more pixels (width x height), before decoding it; ``None``:
            no limit (``--max-image-pixels``).

    Raises:
        InputError: If a file cannot be read, or is above ``max_pixels`` (naming ``--max-image-pixels``).
    """
    from ..data import build_transforms, load_rgb
    from ..data.datasets import ImageTooLargeError

    transform = build_transforms(
        explainer.preset, explainer.img_size, False, explainer.mean, explainer.std, "none", normalize=False
    )
    images = []
    for file in files:
        try:
            images.append(transform(image=load_rgb(file, max_pixels))["image"])
        except ImageTooLargeError as err:
            raise InputError(f"{err}: raise the limit with --max-image-pixels (e.g. --max-image-pixels 200000000, or "
                             "--max-image-pixels none for no limit)") from None  # fmt: skip
        except Exception as err:
            message = _first_line(err)
            raise InputError(message if str(file) in message else f"cannot read image {file}: {message}") from None
    return torch.stack(images)


def parse_target(text: str | None, explainer: Explainer) -> int | None:
    """``--target``: a class index or name, checked against the model's classes."""
    if text is None:
        return None
    num_classes = explainer.model.num_classes
    names = explainer.class_names or []
    if text in names and not text.lstrip("-").isdigit():
        return names.index(text)
    try:
        index = int(text)
    except ValueError:
        raise InputError(f"--target {text!r} is neither a class index nor a class name ({', '.join(names)})") from None
    if not 0 <= index < num_classes:
        raise InputError(f"--target {index} out of range: the model has {num_classes} classes (0..{num_classes - 1})")
    return index


def parse_methods(args: argparse.Namespace) -> list[str]:
    """The methods asked for (``--methods``, or the older ``--method``), registry names in order, each with the
    packages it needs: checked before the checkpoint is read.

    Raises:
        UsageError: On an unknown name, both options at once, or a method whose optional extra is missing.
    """
    if args.method is not None and args.methods is not None:
        raise UsageError("give --methods or --method, not both (--method is the older name)")
    if args.method is not None:
        return LEGACY_METHODS[args.method]
    names: list[str] = []
    for name in (args.methods or DEFAULT_METHOD).split(","):
        name = name.strip()
        if name and name not in METHODS and name not in ALIASES:
            raise UsageError(f"--methods: unknown method {name!r}: choose from {', '.join(METHODS)}")
        if name and ALIASES.get(name, name) not in names:
            names.append(ALIASES.get(name, name))
    if not names:
        raise UsageError(f"--methods is empty: name one or more of {', '.join(METHODS)}")
    for name in names:
        try:
            require_extras(name)
        except ImportError as err:
            raise UsageError(f"--methods {name}: {_first_line(err)}") from None
    return names


def check_options(explainer: Explainer, args: argparse.Namespace) -> int | None:
    """Check the options that depend on the model (before the images are read); returns ``--target``'s class.

    Raises:
        InputError: If ``--target`` or ``--report-block`` does not exist in the model.
        UsageError: If a method does not apply to the model (naming those that do).
    """
    target = parse_target(args.target, explainer)
    try:
        block_index(explainer.model, args.report_block)
    except ValueError as err:
        raise InputError(f"--report-{err}") from None
    for name in args.methods:
        try:
            get_method(name, explainer.model)
        except ValueError as err:
            raise UsageError(f"--methods: {err}") from None
    return target


def compute_for(explainer: Explainer, pixels: torch.Tensor, args: argparse.Namespace,
                labels: torch.Tensor | None = None) -> Results:  # fmt: skip
    """:func:`~vit.explain.results.compute` (predictions, rollout, statistics, per-head maps) with the command's
    options, then every method's maps: through :func:`~vit.explain.benchmark_methods` with ``--faithfulness``
    (which times and measures them), else through :func:`~vit.explain.explain_map`.

    Raises:
        InputError: If ``--target`` or ``--report-block`` does not exist in the model.
        UsageError: If a method does not apply to the model (naming those that do).
    """
    model = explainer.model
    target = check_options(explainer, args)
    progress = Progress("predictions", len(pixels), enabled=True)
    results = compute(
        model, pixels, mean=explainer.mean, std=explainer.std, labels=labels, class_names=explainer.class_names,
        method="rollout", target=target, block=args.report_block, head_fusion=args.head_fusion,
        discard_ratio=args.discard_ratio, batch_size=args.batch_size,
    )  # fmt: skip
    progress.close(f"classes, rollout and attention statistics of {len(pixels)} images in {progress.seconds:.1f} s")
    inputs = normalize(pixels, explainer.mean, explainer.std)
    options = {"rollout": {"head_fusion": args.head_fusion, "discard_ratio": args.discard_ratio}}
    if args.faithfulness:
        bench = benchmark_methods(
            model, inputs, None if target is None else torch.full((len(inputs),), target), args.methods,
            baseline=args.baseline, steps=args.steps, target="prediction" if target is None else "label",
            batch_size=args.batch_size, options=options, show_progress=True,
        )  # fmt: skip
        explanation = results.explanation
        if target is not None:  # the benchmark's "labels" were the target class: say so, and score the true labels
            bench.target = f"class {explanation.class_name(target)}"
        bench.accuracy = None if labels is None else float((explanation.preds == labels).float().mean())
        results.maps, results.benchmark = {name: bench.maps[name] for name in args.methods}, bench
        results.faithfulness = benchmark_scores(bench)
    else:
        others = [name for name in args.methods if name != "rollout"]  # rollout: computed, with the same options
        classes = None if target is None else torch.full((len(inputs),), target)
        maps, _ = timed_maps(model, inputs, classes, others, args.batch_size, options, show_progress=True)
        results.maps = {name: results.explanation.rollout if name == "rollout" else maps[name].cpu()
                        for name in args.methods}  # fmt: skip
    results.attribution = results.maps.get("attribution")
    return results


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole (:func:`vit.atomic.write_bytes`): readers never see half a file."""
    write_bytes(path, data)


def faithfulness_table(bench: MethodBenchmark) -> str:
    """The benchmark as an aligned text table under a line saying how it was measured."""
    return (
        f"faithfulness on {bench.num_images} images ({bench.steps} steps, {bench.baseline} baseline): lower deletion "
        "and higher insertion area are better; x random = the ratio to a random patch order; 95 % bootstrap "
        "intervals over the images\n" + bench.table()
    )


def benchmark_report(bench: MethodBenchmark, explainer: Explainer, args: argparse.Namespace, command: str) -> dict:
    """The JSON of ``--faithfulness``: :meth:`MethodBenchmark.to_dict` with where and how it was measured."""
    import vit

    images = f"--split val, {bench.num_images} images" if args.split else f"{bench.num_images} image files"
    return {
        "model": explainer.model_name or type(explainer.model).__name__,
        "checkpoint": str(args.checkpoint),
        "images": images,
        "methods": list(args.methods),
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{device_name(torch.device('cpu'))}, {os.cpu_count()} cores",
        "versions": {"torch": torch.__version__, "vit": vit.__version__, "python": platform.python_version()},
        "threads": torch.get_num_threads(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        **bench.to_dict(),
    }


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command's options (``scripts/explain.py``)."""
    head, tail = __doc__.split("\n\n", 1)
    parser = ArgumentParser(prog=prog or "vit explain", description=head, epilog=tail.split("\n\n", 1)[1])
    parser.add_argument("checkpoint", type=Path, help="Lightning .ckpt of `vit fit`, or weights with --model")
    parser.add_argument("images", nargs="*", help="image files and/or folders (searched recursively)")
    parser.add_argument("--split", choices=("val",), default=None, help="explain the run's validation split instead")
    parser.add_argument("--limit", type=int, default=None, help="with --split: N images evenly spaced over the split")
    parser.add_argument("--model", default=None, help="preset name for plain weights (.pth/.safetensors)")
    parser.add_argument("--img-size", type=int, default=None, help="input size for plain weights (default: preset's)")
    parser.add_argument(
        "--methods", default=None, help=f"comma-separated methods of vit.explain.METHODS ({', '.join(METHODS)}); "
        f"default: {DEFAULT_METHOD}",
    )  # fmt: skip
    parser.add_argument("--method", choices=tuple(LEGACY_METHODS), default=None, help="older name: --methods rollout, "
                        "attribution or rollout,attribution (both)")  # fmt: skip
    parser.add_argument("--target", default=None, help="class (index or name) to attribute; default: the prediction")
    parser.add_argument(
        "--out", type=Path, default=None, help="overlay folder (default: a new explanations/<checkpoint>-<time>)"
    )
    parser.add_argument(
        "--faithfulness", action="store_true", help="measure every method: deletion / insertion beside random, time"
    )
    parser.add_argument("--steps", type=int, default=16, help="perturbation steps of --faithfulness (default: 16)")
    parser.add_argument("--baseline", choices=("mean", "blur"), default="mean", help="removed patches become this")
    parser.add_argument(
        "--json", type=Path, default=None, help="--faithfulness JSON here (default: <out>/faithfulness.json)"
    )
    parser.add_argument("--html", type=Path, default=None, help="write a self-contained HTML report here")
    parser.add_argument("--report-block", type=int, default=-1, help="block whose per-head maps the report shows")
    parser.add_argument(
        "--explorer-bits",
        type=explorer_bits,
        choices=("auto", *range(2, 9)),
        metavar="{auto,2..8}",
        default="auto",
        help="bits per attention code in the report's explorer (default: auto, the finest of 6 to 3 that fits 4 MB)",
    )
    parser.add_argument("--head-fusion", choices=get_args(HeadFusion), default="mean", help="rollout: fuse heads by")
    parser.add_argument("--discard-ratio", type=float, default=0.0, help="rollout: drop this fraction of weak links")
    parser.add_argument("--alpha", type=float, default=0.6, help="heatmap opacity in [0, 1]")
    parser.add_argument("--batch-size", type=int, default=64, help="images per forward pass (default: 64)")
    parser.add_argument("--no-overlays", action="store_true", help="write no per-image PNGs (grids and report only)")
    parser.add_argument(
        "--max-image-pixels", type=pixel_limit, default=MAX_IMAGE_PIXELS, metavar="{N,none}",
        help="refuse image files whose header claims more pixels (width x height), before decoding them; none: no "
        "limit (default: 50000000, as vit predict's --data.max_image_pixels)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: the cores this process may use minus the "
        "1-minute load average, at least 1: one thread per core, PyTorch's default, makes every parallel step wait "
        "for a core another process holds; measured 8x slower beside one busy process on 2 cores)",
    )  # fmt: skip
    return parser


def pixel_limit(value: str) -> int | None:
    """``--max-image-pixels``: a positive number of pixels, or ``none``."""
    if value.lower() == "none":
        return None
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is neither a positive number of pixels nor none")
    return limit


def set_threads(requested: int | None) -> str:
    """Set torch's intra-op threads to ``requested``, or to :func:`~vit.bench.harness.default_threads` of this
    machine's cores and load; returns the words saying which, for the first progress line."""
    cores, load = available_cores(), busy_load()
    threads = requested or default_threads(cores, load)
    torch.set_num_threads(threads)
    how = "--threads" if requested else "cores minus the 1-minute load average; --threads N to choose"
    return f"{threads} thread{'s' * (threads > 1)} of {cores} cores, load average {load:.2f} ({how})"


def explorer_bits(value: str) -> int | str:
    """``--explorer-bits``: ``"auto"`` or a number of bits (argparse checks it against the choices)."""
    return value if value == "auto" else int(value)


def new_folder(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... : the first that does not exist yet (not created here)."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject option values that cannot work (argparse's usage error, exit 2)."""
    if not 0.0 <= args.discard_ratio < 1.0:
        parser.error(f"--discard-ratio must be in [0, 1), got {args.discard_ratio}")
    if not 0.0 <= args.alpha <= 1.0:
        parser.error(f"--alpha must be in [0, 1], got {args.alpha}")
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be positive")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be positive, got {args.threads}")
    if bool(args.images) == bool(args.split):
        parser.error("give image files or folders, or --split val (not both)")
    if args.json is not None and not args.faithfulness:
        parser.error("--json writes the faithfulness benchmark: add --faithfulness")
    for option, path in (("--json", args.json), ("--html", args.html)):
        if path is not None and path.is_dir():
            parser.error(f"{option} {path} is a folder: give a file name")


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run the command; returns 0.

    Raises:
        SystemExit: On bad input, after one ``error:`` line on stderr (:func:`vit.errors.fail`, the progress bars
            closed first), with the error's exit status (2).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    if args.out is None:  # a fresh folder: one run never overwrites another's pictures
        args.out = new_folder(Path("explanations") / f"{args.checkpoint.stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    start = time.perf_counter()
    try:
        args.methods = parse_methods(args)
        files = find_images(args.images) if args.images else []
        threads = set_threads(args.threads)
        progress = Progress("load", args.limit or len(files), enabled=True)
        explainer = load_explainer(args.checkpoint, args.model, args.img_size)
        check_options(explainer, args)
        labels = None
        if args.split:
            files, pixels, labels = load_split(explainer, args.limit)
        else:
            pixels = load_images(explainer, files, args.max_image_pixels)
        progress.close(f"checkpoint and {len(files)} images in {progress.seconds:.1f} s; {threads}")
        results = compute_for(explainer, pixels, args, labels)
        command = f"{parser.prog} {shlex.join(argv)}"
        write_outputs(args, files, results, explainer, pixels, command)
    except VitError as err:
        stop_all()
        fail(error_message(err), err.exit_status)
    except OSError as err:  # an unwritable --out, --json or --html
        stop_all()
        fail(f"cannot write the outputs: {err}")
    finally:
        stop_all()
    explanation = results.explanation
    confidence = explanation.probs.gather(1, explanation.preds[:, None])[:, 0].tolist()
    width = max(len(str(file)) for file in files)
    for file, pred, p in zip(files, explanation.preds.tolist(), confidence, strict=True):
        print(f"{str(file):<{width}}  {explanation.class_name(pred)}  {p:.3f}")
    written = [f"{'grids' if args.no_overlays else 'overlays'} of {', '.join(args.methods)} in {args.out}/"]
    if results.benchmark is not None:
        print(faithfulness_table(results.benchmark))
        written += [f"JSON {args.json or args.out / 'faithfulness.json'}", f"curves {args.out / CURVES}"]
    written += [f"report {args.html}"] if args.html else []
    seconds = time.perf_counter() - start
    print(f"explained {len(files)} images in {seconds:.1f} s: {', '.join(written)}", file=sys.stderr)
    return 0


CURVES = "faithfulness_curves.png"


def write_outputs(args: argparse.Namespace, files: Sequence[Path], results: Results, explainer: Explainer,
                  pixels: torch.Tensor, command: str) -> None:  # fmt: skip
    """Overlays and a grid per method, the benchmark's JSON and curves, the HTML report, each written whole
    (temporary file, then rename)."""
    explanation = results.explanation
    captions = explanation.captions()
    shown = slice(0, GRID_IMAGES)
    first = replace(explanation, images=explanation.images[shown], probs=explanation.probs[shown],
                    preds=explanation.preds[shown], rollout=explanation.rollout[shown])  # fmt: skip
    for method, maps in results.shown_maps().items():
        class_specific = METHODS[method].class_specific and results.target is not None
        label = f"{method} of {explanation.class_name(results.target)}" if class_specific else method
        signed = is_signed(method)
        if not args.no_overlays:
            progress = Progress(method, len(files), enabled=True)
            for stem, image, grid_map, caption in zip(
                output_stems(files), explanation.images, maps, captions, strict=True
            ):
                panel = render_panel(image, grid_map, f"{caption} · {label}", signed=signed, alpha=args.alpha, size=224)
                write_atomic(args.out / f"{stem}_{method}.png", png_bytes(panel))
                progress.update(1)
            progress.close(f"overlays of {len(files)} images in {progress.seconds:.1f} s")
        grid = render_grid(first, maps[shown], ncols=min(4, len(files)), title=label, signed=signed, alpha=args.alpha)
        write_atomic(args.out / f"{method}_grid.png", png_bytes(grid))
    if results.benchmark is not None:
        report = benchmark_report(results.benchmark, explainer, args, command)
        write_atomic(args.json or args.out / "faithfulness.json", (json.dumps(report, indent=2) + "\n").encode())
        results.benchmark.plot(args.out / CURVES, title=f"{report['model']}: {report['images']}")
    if args.html is not None:
        progress = Progress("report", len(files), enabled=True)
        html = render_report(
            files, results, title=f"{args.checkpoint.name}: {len(files)} images", alpha=args.alpha,
            model=explainer.model, pixels=pixels, mean=explainer.mean, std=explainer.std, bits=args.explorer_bits,
        )  # fmt: skip
        write_atomic(args.html, html.encode())
        progress.close(f"{args.html} with the explorer, {len(html) / 1e6:.1f} MB in {progress.seconds:.1f} s")
