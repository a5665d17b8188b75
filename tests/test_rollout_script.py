"""scripts/rollout.py from the command line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from PIL import Image

import vit
from vit import ImageClassifier, ImageDataModule
from vit.data import build_transforms, load_rgb

ROOT = Path(__file__).resolve().parents[1]
CIFAR_MINI = ROOT.parent / "shared" / "data" / "cifar10-mini" / "test"
SWEEPS = sorted((ROOT / "configs" / "sweeps").glob("*.yaml"))


def load_script(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` (in this process: a fresh interpreter would spend its time importing torch)."""
    spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run_script(capsys):
    """``run_script("rollout.py", *args)``: the script's ``main(args)`` with its exit status and printed output."""

    def run(name: str, *args) -> Result:
        capsys.readouterr()
        code = load_script(name.removesuffix(".py")).main([str(a) for a in args])
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return run


# ------------------------------------------------------------------------------------------------- rollout.py
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A Lightning checkpoint of a tiny digits model after a few steps."""
    folder = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    data = ImageDataModule(dataset="digits", img_size=32, batch_size=16, num_workers=0)
    trainer = pl.Trainer(
        default_root_dir=folder,
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = ImageClassifier(
        "vit_tiny_patch4_32", num_classes=10, img_size=32, model_overrides={"depth": 2, "embed_dim": 32, "num_heads": 2}
    )
    trainer.fit(module, data)
    trainer.save_checkpoint(folder / "tiny.ckpt")
    return folder / "tiny.ckpt"


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


def test_rollout_script_writes_overlays_and_prints_predictions(checkpoint, tmp_path, run_script):
    files = image_files(tmp_path)
    result = run_script("rollout.py", checkpoint, *files, "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr

    # Predictions as the model makes them in this process, with the digits' normalisation and class names.
    module = ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu")
    data = ImageDataModule(dataset="digits", img_size=32)
    transform = build_transforms(data.preset, 32, False, data.mean, data.std, "none")
    batch = torch.stack([transform(image=load_rgb(f))["image"] for f in files])
    probs = module.eval_model.eval()(batch).softmax(-1)
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3
    for line, file, p in zip(lines, files, probs, strict=True):
        path, name, prob = line.split()
        assert path == str(file)
        assert name == data.class_names[int(p.argmax())]
        assert float(prob) == pytest.approx(p.max().item(), abs=1e-3)
        stem = f"{file.parent.name}_{file.stem}" if CIFAR_MINI.is_dir() else file.stem  # cat/0970.jpg, ship/0970.jpg
        with Image.open(tmp_path / "out" / f"{stem}_rollout.png") as overlay:
            assert overlay.mode == "RGB" and overlay.size == (224, 224)  # 32 px upscaled 7x
    with Image.open(tmp_path / "out" / "rollout_grid.png") as grid:
        assert grid.width > 3 * 224


def test_rollout_script_plain_weights_need_a_model_name(tmp_path, run_script):
    weights = tmp_path / "weights.pth"
    torch.save(vit.create_model("vit_tiny_patch4_32").state_dict(), weights)
    files = image_files(tmp_path)[:1]
    result = run_script("rollout.py", weights, *files, "--out", tmp_path)
    assert result.returncode == 2 and "--model PRESET" in result.stderr
    result = run_script("rollout.py", weights, *files, "--out", tmp_path, "--model", "vit_tiny_patch4_32")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == str(files[0]) and (tmp_path / f"{files[0].stem}_rollout.png").is_file()


def test_rollout_script_bad_input(checkpoint, tmp_path, run_script):
    image = image_files(tmp_path)[0]
    result = run_script("rollout.py", tmp_path / "missing.ckpt", image)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: checkpoint {tmp_path / 'missing.ckpt'} not found: pass the .ckpt written by scripts/fit.py "
        "(e.g. last.ckpt)"
    )
    (tmp_path / "empty").mkdir()
    result = run_script("rollout.py", checkpoint, tmp_path / "empty")
    assert (
        result.returncode == 2 and result.stderr.startswith("error: no image files (.jpg") and "empty" in result.stderr
    )
    (tmp_path / "broken.png").write_text("not an image")
    result = run_script("rollout.py", checkpoint, tmp_path / "broken.png")
    assert result.returncode == 2 and result.stderr.startswith(f"error: cannot read image {tmp_path / 'broken.png'}")
