"""scripts/rollout.py, the old name of scripts/explain.py --method rollout (vit.explain.command.rollout_main)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vit
from vit.data import IMAGENET_MEAN, IMAGENET_STD, build_transforms, load_rgb
from vit.explain.command import rollout_main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def rollout(capsys):
    def run(*args):
        capsys.readouterr()
        code = rollout_main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture
def weights(tmp_path) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "weights.pth"
    torch.save(vit.create_model("vit_tiny_patch4_32").state_dict(), path)
    return path


def drawn(folder: Path, n: int = 2) -> list[Path]:
    rng = np.random.default_rng(0)
    files = []
    for i in range(n):
        files.append(folder / "pictures" / f"drawn_{i}.png")
        files[-1].parent.mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(files[-1])
    return files


def test_old_options_write_rollout_overlays_into_rollout(weights, tmp_path, rollout, monkeypatch):
    files = drawn(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ("--model", "vit_tiny_patch4_32", "--head-fusion", "max", "--discard-ratio", "0.5", "--alpha", "0.4")
    code, out, err = rollout(weights, tmp_path / "pictures", *args)
    assert code == 0, err
    # The default output folder is still ./rollout, with the old file names and no attribution.
    assert sorted(p.name for p in (tmp_path / "rollout").iterdir()) == [
        "drawn_0_rollout.png",
        "drawn_1_rollout.png",
        "rollout_grid.png",
    ]
    model = vit.create_model("vit_tiny_patch4_32")
    model.load_state_dict(torch.load(weights))
    transform = build_transforms("imagenet", 32, False, IMAGENET_MEAN, IMAGENET_STD, "none")
    probs = model.eval()(torch.stack([transform(image=load_rgb(f))["image"] for f in files])).softmax(-1)
    for line, file, p in zip(out.strip().splitlines(), files, probs, strict=True):
        path, name, prob = line.split()
        assert (path, name) == (str(file), str(int(p.argmax())))
        assert float(prob) == pytest.approx(p.max().item(), abs=1e-3)


def test_bad_input(weights, tmp_path, rollout):
    image = drawn(tmp_path, 1)[0]
    code, _, err = rollout(tmp_path / "missing.ckpt", image, "--out", tmp_path / "o")
    assert code == 2
    assert err.strip() == (
        f"error: checkpoint {tmp_path / 'missing.ckpt'} not found: pass the .ckpt written by `vit fit` (e.g. last.ckpt)"
    )
    code, _, err = rollout(weights, image, "--out", tmp_path / "o")
    assert code == 2 and "--model PRESET" in err and not (tmp_path / "o").exists()
    with pytest.raises(SystemExit) as stop:
        rollout(weights, image, "--discard-ratio", "1.5")
    assert stop.value.code == 2
