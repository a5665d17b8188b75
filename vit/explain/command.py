"""``vit explain`` (``scripts/explain.py``): the command around ``compute``: read images, write overlays and reports.

    python scripts/explain.py CHECKPOINT IMAGE_OR_FOLDER [...] [--method both] [--faithfulness] [--json out.json]
                              [--html report.html] [--out explanations]

CHECKPOINT is a Lightning ``.ckpt`` written by ``vit fit`` (model, image size, normalisation and class names come
from it), or plain weights (``.pth``/``.safetensors``, timm's included) with ``--model PRESET`` (ImageNet
normalisation, ``--img-size``, class indices as names). Per image it writes ``<out>/<name>_rollout.png`` and/or
``<name>_attribution.png`` (image | overlay with a colour bar, prediction in the caption) plus a grid, and
prints the predicted class and its probability. ``--faithfulness`` adds deletion/insertion areas
(:func:`~vit.explain.faithfulness.faithfulness`). Bad input is one ``error:`` line and exit status 2, before
anything is written; every file is written to a temporary name and renamed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, get_args

import torch
from torch import nn

from ..atomic import write_bytes
from ..checkpoints import data_settings, load_checkpoint, load_file, rebuild_datamodule
from ..errors import ArgumentParser, InputError, VitError
from ..normalize import IMAGENET_MEAN, IMAGENET_STD
from .panels import png_bytes, render_grid, render_panel
from .report import render_report
from .results import Results, block_index, compute
from .rollout import HeadFusion

METHODS = ("rollout", "attribution")
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


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def load_explainer(checkpoint: Path, model_name: str | None = None, img_size: int | None = None) -> Explainer:
    """A checkpoint of ``vit fit`` (it describes its model and preprocessing), or plain weights loaded into preset
    ``model_name``.

    Raises:
        InputError: If the file is missing or holds plain weights without ``model_name``, or ``model_name`` is
            unknown or does not fit the weights.
        CheckpointError: If the file is not a checkpoint, or a Lightning checkpoint that does not describe its model.
    """
    from ..models import create_model, load_pretrained

    if not checkpoint.is_file():
        raise InputError(f"checkpoint {checkpoint} not found: pass the .ckpt written by `vit fit` (e.g. last.ckpt)")
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
    return Explainer(model.eval(), model.patch_embed.img_size[0], IMAGENET_MEAN, IMAGENET_STD, "imagenet", None)


def _from_checkpoint(checkpoint: Path, raw: dict) -> Explainer:
    """A checkpoint of ``vit fit``: model, image size, statistics and class names from its description
    (:mod:`vit.checkpoints`); the run's data module is kept for ``--split val`` when its settings work here."""
    loaded = load_checkpoint(checkpoint)  # the EMA weights when the run kept an EMA, as validation used
    meta = loaded.meta
    # A few hundred images: worker processes would cost more than they save.
    datamodule = rebuild_datamodule(data_settings(raw), num_workers=0)
    return Explainer(loaded.model, int(meta["img_size"][0]), tuple(meta["mean"]), tuple(meta["std"]),
                     meta["eval_transform"], meta.get("class_names"), datamodule)  # fmt: skip


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
            raise InputError(f"image {path} not found")
    if not files:
        raise InputError("no images given: pass image files or folders after the checkpoint")
    return files


def output_stems(files: Sequence[Path]) -> list[str]:
    """One output stem per file: its stem, ``<folder>_<stem>`` where stems repeat, then an index if still equal."""
    stems = [file.stem for file in files]
    names = [f"{file.parent.name}_{file.stem}" if stems.count(file.stem) > 1 else file.stem for file in files]
    return [f"{name}_{i}" if names.count(name) > 1 else name for i, name in enumerate(names)]


def load_images(explainer: Explainer, files: Sequence[Path]) -> torch.Tensor:
    """``(B, 3, img_size, img_size)`` uint8 pixels through the run's eval transform (normalised later, once)."""
    from ..data import build_transforms, load_rgb

    transform = build_transforms(
        explainer.preset, explainer.img_size, False, explainer.mean, explainer.std, "none", normalize=False
    )
    images = []
    for file in files:
        try:
            images.append(transform(image=load_rgb(file))["image"])
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


def compute_for(explainer: Explainer, pixels: torch.Tensor, args: argparse.Namespace,
                labels: torch.Tensor | None = None) -> Results:  # fmt: skip
    """:func:`~vit.explain.results.compute` with the command's options.

    Raises:
        InputError: If ``--target`` or ``--report-block`` does not exist in the model.
    """
    target = parse_target(args.target, explainer)
    try:
        block_index(explainer.model, args.report_block)
    except ValueError as err:
        raise InputError(f"--report-{err}") from None
    return compute(
        explainer.model, pixels, mean=explainer.mean, std=explainer.std, labels=labels,
        class_names=explainer.class_names, method=args.method, target=target, block=args.report_block,
        head_fusion=args.head_fusion, discard_ratio=args.discard_ratio,
        faithfulness_steps=args.steps if args.faithfulness else None, baseline=args.baseline,
        batch_size=args.batch_size,
    )  # fmt: skip


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole (:func:`vit.atomic.write_bytes`): readers never see half a file."""
    write_bytes(path, data)


def faithfulness_table(scores: dict) -> str:
    """The deletion / insertion areas as an aligned text table."""
    lines = [
        f"faithfulness on {scores['num_images']} images ({scores['steps']} steps, {scores['baseline']} baseline): "
        "lower deletion and higher insertion area are better",
        f"{'method':<12}  {'deletion AUC':>12}  {'insertion AUC':>13}",
    ]
    for name, deletion in scores["deletion_auc"].items():
        lines.append(f"{name:<12}  {deletion:>12.4f}  {scores['insertion_auc'][name]:>13.4f}")
    return "\n".join(lines)


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
    parser.add_argument("--method", choices=(*METHODS, "both"), default="both", help="maps to draw (default: both)")
    parser.add_argument("--target", default=None, help="class (index or name) to attribute; default: the prediction")
    parser.add_argument(
        "--out", type=Path, default=None, help="overlay folder (default: a new explanations/<checkpoint>-<time>)"
    )
    parser.add_argument("--faithfulness", action="store_true", help="measure deletion / insertion areas")
    parser.add_argument("--steps", type=int, default=10, help="perturbation steps of --faithfulness (default: 10)")
    parser.add_argument("--baseline", choices=("mean", "blur"), default="mean", help="removed patches become this")
    parser.add_argument("--json", type=Path, default=None, help="write the faithfulness areas to this JSON file")
    parser.add_argument("--html", type=Path, default=None, help="write a self-contained HTML report here")
    parser.add_argument("--report-block", type=int, default=-1, help="block whose per-head maps the report shows")
    parser.add_argument("--head-fusion", choices=get_args(HeadFusion), default="mean", help="rollout: fuse heads by")
    parser.add_argument("--discard-ratio", type=float, default=0.0, help="rollout: drop this fraction of weak links")
    parser.add_argument("--alpha", type=float, default=0.6, help="heatmap opacity in [0, 1]")
    parser.add_argument("--batch-size", type=int, default=64, help="images per forward pass (default: 64)")
    parser.add_argument("--no-overlays", action="store_true", help="write no per-image PNGs (grids and report only)")
    return parser


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
    if bool(args.images) == bool(args.split):
        parser.error("give image files or folders, or --split val (not both)")
    if args.json is not None and not args.faithfulness:
        parser.error("--json writes the faithfulness areas: add --faithfulness")
    for option, path in (("--json", args.json), ("--html", args.html)):
        if path is not None and path.is_dir():
            parser.error(f"{option} {path} is a folder: give a file name")


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run the command; returns the exit status (2 on bad input, with one ``error:`` line on stderr)."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    if args.out is None:  # a fresh folder: one run never overwrites another's pictures
        args.out = new_folder(Path("explanations") / f"{args.checkpoint.stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        files = find_images(args.images) if args.images else []
        explainer = load_explainer(args.checkpoint, args.model, args.img_size)
        labels = None
        if args.split:
            files, pixels, labels = load_split(explainer, args.limit)
        else:
            pixels = load_images(explainer, files)
        results = compute_for(explainer, pixels, args, labels)
        write_outputs(args, files, results)
    except VitError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_status
    except OSError as err:  # an unwritable --out, --json or --html
        print(f"error: cannot write the outputs: {err}", file=sys.stderr)
        return 2
    explanation = results.explanation
    confidence = explanation.probs.gather(1, explanation.preds[:, None])[:, 0].tolist()
    width = max(len(str(file)) for file in files)
    for file, pred, p in zip(files, explanation.preds.tolist(), confidence, strict=True):
        print(f"{str(file):<{width}}  {explanation.class_name(pred)}  {p:.3f}")
    if results.faithfulness is not None:
        print(faithfulness_table(results.faithfulness))
    written = [f"{'grids' if args.no_overlays else 'overlays'} in {args.out}/"]
    written += [f"{option} {path}" for option, path in (("JSON", args.json), ("report", args.html)) if path]
    print(f"explained {len(files)} images: {', '.join(written)}", file=sys.stderr)
    return 0


def write_outputs(args: argparse.Namespace, files: Sequence[Path], results: Results) -> None:
    """Overlays, grids, the JSON areas and the HTML report, each written whole (temporary file, then rename)."""
    explanation = results.explanation
    maps = {"rollout": explanation.rollout, "attribution": results.attribution}
    methods = [m for m in METHODS if args.method in (m, "both")]
    captions = explanation.captions()
    for method in methods:
        if not args.no_overlays:
            for stem, image, grid_map, caption in zip(
                output_stems(files), explanation.images, maps[method], captions, strict=True
            ):
                label = method if results.target is None else f"{method} of {explanation.class_name(results.target)}"
                panel = render_panel(image, grid_map, f"{caption} · {label}", alpha=args.alpha, size=224)
                write_atomic(args.out / f"{stem}_{method}.png", png_bytes(panel))
        shown = slice(0, GRID_IMAGES)
        first = replace(explanation, images=explanation.images[shown], probs=explanation.probs[shown],
                        preds=explanation.preds[shown], rollout=explanation.rollout[shown])  # fmt: skip
        grid = render_grid(first, maps[method][shown], ncols=min(4, len(files)), title=method, alpha=args.alpha)
        write_atomic(args.out / f"{method}_grid.png", png_bytes(grid))
    if args.json is not None and results.faithfulness is not None:
        scores = results.faithfulness
        summary = {key: scores[key] for key in ("deletion_auc", "insertion_auc", "num_images", "steps", "baseline")}
        summary |= {key: scores[key] for key in ("fractions", "deletion_curve", "insertion_curve")}
        write_atomic(args.json, (json.dumps(summary, indent=2) + "\n").encode())
    if args.html is not None:
        html = render_report(files, results, title=f"{args.checkpoint.name}: {len(files)} images", alpha=args.alpha)
        write_atomic(args.html, html.encode())
