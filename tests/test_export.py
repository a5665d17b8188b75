"""``vit export``: timm's Hub layout that ``timm.create_model("local-dir:DIR")`` opens with our logits, window and
sliding models that ``vit.load`` opens, ONNX checked with ONNX Runtime, EMA weights, and bad input refused whole."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import timm
import torch

import vit
from vit import ImageClassifier
from vit.checkpoints import METADATA_KEY, inference_metadata
from vit.export import main as export_main
from vit.main import main as vit_main

TINY = {"embed_dim": 32, "depth": 2, "num_heads": 2}


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def save_checkpoint(path: Path, preset: str, ema: bool = False, **overrides) -> ImageClassifier:
    torch.manual_seed(0)
    module = ImageClassifier(preset, num_classes=5, model_overrides=overrides, ema_decay=0.9 if ema else None)
    if ema:
        with torch.no_grad():
            for p in module.model_ema.module.parameters():
                p.add_(0.01 * torch.randn_like(p))
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    names = ["cat", "dog", "ship", "frog", "bird"]
    checkpoint[METADATA_KEY] = inference_metadata(module.model, module.hparams, names, (0.5,) * 3, (0.25,) * 3)
    torch.save(checkpoint, path)
    return module


TIMM_CASES = {
    "tiny_preset": ("vit_tiny_patch4_32", TINY),
    "small_preset": ("vit_small_patch4_32", {"depth": 1}),
    "custom": (
        "vit_tiny_patch4_32",
        {**TINY, "reg_tokens": 2, "global_pool": "avg", "init_values": 0.1, "qk_norm": True, "mlp_ratio": 3.0},
    ),
}


@pytest.mark.parametrize("case", list(TIMM_CASES))
def test_timm_local_dir_builds_the_same_network(case, tmp_path):
    preset, overrides = TIMM_CASES[case]
    module = save_checkpoint(tmp_path / "m.ckpt", preset, **overrides)
    assert export_main(["--ckpt_path", str(tmp_path / "m.ckpt"), "--out", str(tmp_path / "hub")]) == 0
    assert sorted(p.name for p in (tmp_path / "hub").iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    assert config["architecture"].startswith("vit_") and config["num_classes"] == 5
    assert config["num_features"] == module.model.num_features and config["global_pool"] == module.model.global_pool
    assert config["pretrained_cfg"]["label_names"] == ["cat", "dog", "ship", "frog", "bird"]
    theirs = timm.create_model(f"local-dir:{tmp_path / 'hub'}", pretrained=True).eval()
    assert type(theirs).__module__.startswith("timm.")
    cfg = theirs.pretrained_cfg
    assert tuple(cfg["mean"]) == (0.5,) * 3 and tuple(cfg["input_size"]) == (3, 32, 32)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        assert (theirs(x) - module.model.eval()(x)).abs().max() <= 1e-5


ONNX_CASES = {
    "global": ("vit_tiny_patch4_32", TINY),
    "block_window": ("vit_tiny_window_patch4_32", {**TINY, "global_attn_indexes": [1]}),
    "sliding": ("vit_tiny_sliding_patch4_32", {**TINY, "global_attn_indexes": [1]}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(ONNX_CASES))
def test_onnx_runtime_matches_pytorch_and_vit_load_opens_the_folder(case, tmp_path, capsys):
    onnxruntime = pytest.importorskip("onnxruntime")
    preset, overrides = ONNX_CASES[case]
    module = save_checkpoint(tmp_path / "m.ckpt", preset, **overrides)
    assert export_main(["--ckpt_path", str(tmp_path / "m.ckpt"), "--out", str(tmp_path / "hub"), "--onnx"]) == 0
    assert sorted(p.name for p in (tmp_path / "hub").iterdir()) == ["config.json", "model.onnx", "model.safetensors"]
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    local = config["architecture"].startswith("vit_pkg_")  # timm has no local attention: our preset, registered
    assert local == (case != "global") and (not local or config["architecture"] == f"vit_pkg_{preset[4:]}")
    session = onnxruntime.InferenceSession(str(tmp_path / "hub" / "model.onnx"), providers=["CPUExecutionProvider"])
    loaded = vit.load(tmp_path / "hub")
    for batch in (1, 3, 7):
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            expected = module.model.eval()(x)
            assert torch.equal(loaded(x), expected)
        got = torch.from_numpy(session.run(["logits"], {"images": x.numpy()})[0])
        assert got.shape == (batch, 5) and (got - expected).abs().max() <= 1e-4
    assert "max |dlogit|" in capsys.readouterr().out


def test_ema_exports_the_averaged_weights(tmp_path):
    module = save_checkpoint(tmp_path / "m.ckpt", "vit_tiny_patch4_32", ema=True, **TINY)
    export_main(["--ckpt_path", str(tmp_path / "m.ckpt"), "--out", str(tmp_path / "ema"), "--ema"])
    export_main(["--ckpt_path", str(tmp_path / "m.ckpt"), "--out", str(tmp_path / "plain")])
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(vit.load(tmp_path / "ema")(x), module.model_ema.module.eval()(x))
        assert torch.equal(vit.load(tmp_path / "plain")(x), module.model.eval()(x))


def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    save_checkpoint(tmp_path / "m.ckpt", "vit_tiny_patch4_32", **TINY)
    (tmp_path / "notes.ckpt").write_text("hello")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    cases = [
        (["--ckpt_path", str(tmp_path / "notes.ckpt"), "--out", str(tmp_path / "a")], "not a PyTorch checkpoint"),
        (["--ckpt_path", str(tmp_path / "m.ckpt"), "--out", str(tmp_path / "full")], "not an empty folder"),
        (["--ckpt_path", str(tmp_path / "m.ckpt"), "--out", str(tmp_path / "b"), "--ema"], "no EMA weights"),
        (["--ckpt_path", str(tmp_path / "m.ckpt"), "--out", str(tmp_path / "c"), "--onx"], "did you mean --onnx"),
    ]
    for argv, message in cases:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            vit_main(["export", *argv])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
        assert message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "m.ckpt", "notes.ckpt"]  # no half-written folder
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_the_folder_and_its_files_get_the_permissions_cp_would_give(umask, tmp_path):
    save_checkpoint(tmp_path / "m.ckpt", "vit_tiny_patch4_32", **TINY)
    old = os.umask(umask)
    try:
        export_main(["--ckpt_path", str(tmp_path / "m.ckpt"), "--out", str(tmp_path / "exported")])
        (tmp_path / "copied").mkdir()  # the reference: what the system gives a new folder and file under the umask
        (tmp_path / "copied" / "file").write_bytes(b"")
    finally:
        os.umask(old)
    mode = stat.S_IMODE
    assert mode((tmp_path / "exported").stat().st_mode) == mode((tmp_path / "copied").stat().st_mode)
    files = sorted(p.name for p in (tmp_path / "exported").iterdir())
    assert files == ["config.json", "model.safetensors"]
    for name in files:
        assert mode((tmp_path / "exported" / name).stat().st_mode) == mode((tmp_path / "copied/file").stat().st_mode)
