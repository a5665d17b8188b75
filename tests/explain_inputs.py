"""The inputs of the ``vit explain`` tests: three images (real CIFAR-10 photographs when the tests have them), the
model and its inputs built as a user would, and the check of a one-line error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit import ImageClassifier, ImageDataModule
from vit.data import build_transforms, load_rgb

ROOT = Path(__file__).resolve().parents[1]
CIFAR_MINI = ROOT.parent / "shared" / "data" / "cifar10-mini" / "test"


def image_files(folder: Path) -> list[Path]:
    """Three real CIFAR-10 photographs when ../shared has them, else three PNGs drawn here."""
    if CIFAR_MINI.is_dir():
        return [sorted((CIFAR_MINI / name).glob("*.jpg"))[0] for name in ("cat", "ship", "truck")]
    rng = np.random.default_rng(0)
    files = []
    for i in range(3):
        files.append(folder / f"drawn_{i}.png")
        Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(files[-1])
    return files


def model_inputs(checkpoint: Path, files: list[Path]):
    """The model and its normalised inputs, built here the way a user would."""
    module = ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu")
    data = ImageDataModule(dataset="digits", img_size=32)
    transform = build_transforms(data.preset, 32, False, data.mean, data.std, "none")
    return module.eval_model.eval(), torch.stack([transform(image=load_rgb(f))["image"] for f in files]), data


def one_error_line(result, start: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(start), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr and result.stdout == ""
