"""Explain a trained model's predictions: attention-rollout overlays for image files, on the CPU.

    python scripts/rollout.py CHECKPOINT IMAGE_OR_FOLDER [...] [--out rollout] [--head-fusion max --discard-ratio 0.9]

CHECKPOINT is a Lightning ``.ckpt`` written by ``scripts/fit.py`` (the model, image size, normalisation and class
names come from it), or plain weights (``.pth``/``.safetensors``, timm's included) with ``--model PRESET``
(ImageNet normalisation, ``--img-size``, class indices as names). For every image it writes
``<out>/<image name>_rollout.png`` (plus ``rollout_grid.png`` of all) and prints the predicted class with its
probability.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import torch
from PIL import Image
from torch import nn

from vit.explain import HeadFusion, make_grid, overlay_heatmap, rollout_map, unnormalize


class InputError(Exception):
    """Bad input: a message for the user, exit status 2."""


@dataclass
class Explainer:
    """A network with the preprocessing it was trained with."""

    model: nn.Module
    img_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    preset: str
    class_names: list[str] | None


def load_explainer(checkpoint: Path, model_name: str | None, img_size: int | None) -> Explainer:
    """Load a Lightning checkpoint of :class:`vit.ImageClassifier`, or plain weights into preset ``model_name``."""
    from vit.data import IMAGENET_MEAN, IMAGENET_STD
    from vit.models import create_model, load_file, load_pretrained

    if not checkpoint.is_file():
        raise InputError(
            f"checkpoint {checkpoint} not found: pass the .ckpt written by scripts/fit.py (e.g. last.ckpt)"
        )
    try:
        raw = load_file(checkpoint)
    except Exception as err:
        raise InputError(f"cannot read checkpoint {checkpoint}: {type(err).__name__}: {err}") from None
    if isinstance(raw, dict) and "hyper_parameters" in raw and model_name is None:
        return _from_lightning(checkpoint, raw)
    if model_name is None:
        raise InputError(
            f"{checkpoint} holds plain weights, not a Lightning checkpoint of vit.ImageClassifier: "
            "say which model they belong to with --model PRESET (see vit.list_models())"
        )
    try:
        model = create_model(model_name, **({"img_size": img_size} if img_size else {}))
        load_pretrained(model, str(checkpoint))
    except Exception as err:
        raise InputError(f"cannot load {checkpoint} into {model_name}: {type(err).__name__}: {err}") from None
    size = model.patch_embed.img_size[0]
    return Explainer(model.eval(), size, IMAGENET_MEAN, IMAGENET_STD, "imagenet", None)


def _from_lightning(checkpoint: Path, raw: dict) -> Explainer:
    from vit import ImageClassifier
    from vit.data import IMAGENET_MEAN, IMAGENET_STD, ImageDataModule

    try:
        module = ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True)
    except Exception as err:
        raise InputError(f"cannot rebuild the model of {checkpoint}: {type(err).__name__}: {err}") from None
    model = module.eval_model.eval()  # the EMA weights when the run kept an EMA
    img_size = model.patch_embed.img_size[0]
    data = dict(raw.get("datamodule_hyper_parameters") or {})
    data.pop("_class_path", None)
    data.pop("_instantiator", None)
    mean, std, preset, names = IMAGENET_MEAN, IMAGENET_STD, "imagenet", None
    try:  # the data module knows the normalisation and the class names (a folder dataset needs its folder)
        datamodule = ImageDataModule(**data)
        mean, std, preset = datamodule.mean, datamodule.std, datamodule.preset
        names = datamodule.class_names
    except Exception as err:
        print(
            f"note: data settings of the run not usable here ({type(err).__name__}: {err}); "
            "using ImageNet normalisation and class indices",
            file=sys.stderr,
        )
    if names is not None and len(names) != getattr(model, "num_classes", len(names)):
        names = None
    return Explainer(model, img_size, tuple(mean), tuple(std), preset, names)


def find_images(inputs: list[str]) -> list[Path]:
    """Image files named on the command line, and those directly or deeper inside named folders, sorted."""
    from vit.data import IMG_EXTENSIONS

    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMG_EXTENSIONS and p.is_file())
            if not found:
                raise InputError(f"no image files ({', '.join(IMG_EXTENSIONS)}) in folder {path}")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"image {path} not found")
    if not files:
        raise InputError("no images given: pass image files or folders after the checkpoint")
    return files


def output_names(files: list[Path]) -> list[str]:
    """``<stem>_rollout.png`` per file; ``<folder>_<stem>`` where stems repeat (``cat/0970.jpg``, ``dog/0970.jpg``)."""
    stems = [file.stem for file in files]
    names = [f"{file.parent.name}_{file.stem}" if stems.count(file.stem) > 1 else file.stem for file in files]
    names = [f"{name}_{i}" if names.count(name) > 1 else name for i, name in enumerate(names)]
    return [f"{name}_rollout.png" for name in names]


def explain(explainer: Explainer, files: list[Path], out: Path, head_fusion: str, discard_ratio: float, alpha: float):
    """Write one overlay per image and a grid of all, return ``[(file, class name, probability)]``."""
    from vit.data import build_transforms, load_rgb

    transform = build_transforms(explainer.preset, explainer.img_size, False, explainer.mean, explainer.std, "none")
    images = []
    for file in files:
        try:
            images.append(transform(image=load_rgb(file))["image"])
        except Exception as err:
            raise InputError(f"cannot read image {file}: {type(err).__name__}: {err}") from None
    batch = torch.stack(images)
    with torch.no_grad():
        probs = explainer.model(batch).softmax(dim=-1)
    maps = rollout_map(explainer.model, batch, head_fusion=head_fusion, discard_ratio=discard_ratio)
    display = unnormalize(batch, explainer.mean, explainer.std).clamp(0, 1)
    scale = max(1, 224 // explainer.img_size)  # small inputs are upscaled so that the map stays readable
    if scale > 1:
        display = torch.nn.functional.interpolate(display, scale_factor=scale, mode="bilinear", align_corners=False)
    out.mkdir(parents=True, exist_ok=True)
    results, panels, captions = [], [], []
    confidence, predicted = probs.max(dim=-1)
    names = output_names(files)
    for file, image, grid_map, p, c, target in zip(
        files, display, maps, confidence.tolist(), predicted.tolist(), names, strict=True
    ):
        name = explainer.class_names[c] if explainer.class_names else str(c)
        panel = overlay_heatmap(image, grid_map, alpha=alpha)
        Image.fromarray(panel).save(out / target)
        results.append((file, name, p))
        panels.append(panel)
        captions.append(f"{file.parent.name}/{file.name}\n{name} ({p:.0%})")
    Image.fromarray(make_grid(panels, ncols=min(4, len(panels)), captions=captions)).save(out / "rollout_grid.png")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("checkpoint", type=Path, help="Lightning .ckpt of scripts/fit.py, or weights with --model")
    parser.add_argument("images", nargs="+", help="image files and/or folders (searched recursively)")
    parser.add_argument("--out", type=Path, default=Path("rollout"), help="output folder (default: rollout)")
    parser.add_argument("--model", default=None, help="preset name for plain weights (.pth/.safetensors)")
    parser.add_argument("--img-size", type=int, default=None, help="input size for plain weights (default: preset's)")
    parser.add_argument("--head-fusion", choices=get_args(HeadFusion), default="mean", help="fuse heads by")
    parser.add_argument("--discard-ratio", type=float, default=0.0, help="drop this fraction of weakest links, [0, 1)")
    parser.add_argument("--alpha", type=float, default=0.5, help="heatmap opacity in [0, 1]")
    args = parser.parse_args(argv)
    if not 0.0 <= args.discard_ratio < 1.0:
        parser.error(f"--discard-ratio must be in [0, 1), got {args.discard_ratio}")
    if not 0.0 <= args.alpha <= 1.0:
        parser.error(f"--alpha must be in [0, 1], got {args.alpha}")
    try:
        files = find_images(args.images)
        explainer = load_explainer(args.checkpoint, args.model, args.img_size)
        results = explain(explainer, files, args.out, args.head_fusion, args.discard_ratio, args.alpha)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    width = max(len(str(file)) for file, _, _ in results)
    for file, name, p in results:
        print(f"{str(file):<{width}}  {name}  {p:.3f}")
    print(f"wrote {len(results)} overlays and rollout_grid.png to {args.out}/", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
