"""The code of docs/models.md's "Using an export outside the project" runs as written, on a fresh ``vit export --onnx``
of a window-attention model (this package's, opened in timm through its registry) and of a global one (timm's own
architecture): ONNX Runtime with the preprocessing of ``config.json`` classifies as the project's ``Predictor`` does,
and timm's ``local-dir:`` builds a model with the exported model's logits."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import vit
from vit import ImageClassifier
from vit.checkpoints import METADATA_KEY, inference_metadata
from vit.export import export

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Using an export outside the project"
BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
TINY = {"embed_dim": 32, "depth": 2, "num_heads": 2}
CASES = {
    "window": ("vit_tiny_window_patch4_32", {**TINY, "window_size": 2, "global_attn_indexes": [1], "class_token": False,
                                              "global_pool": "avg"}),
    "global": ("vit_tiny_patch4_32", TINY),
}  # fmt: skip


def section_blocks() -> list[str]:
    """The python blocks of the section, in order: the ONNX Runtime snippet, then the timm one."""
    text = (ROOT / "docs" / "models.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return [m.group("code") for m in BLOCK.finditer(text[start : end if end > 0 else None])]


def run_block(index: int) -> dict:
    namespace: dict = {"__name__": "docs_models_export"}
    exec(compile(section_blocks()[index], f"docs/models.md ({SECTION[3:]}, block {index})", "exec"), namespace)
    return namespace


@pytest.fixture(params=list(CASES))
def exported(request, tmp_path, monkeypatch, one_thread) -> ImageClassifier:
    """A 10-class, 16 px model of the case exported with ONNX to ``my_vit/`` and a digit PNG in ``my_digits/``, in the
    working directory, as the README's quick start leaves them."""
    from PIL import Image
    from sklearn.datasets import load_digits

    preset, overrides = CASES[request.param]
    torch.manual_seed(0)
    module = ImageClassifier(preset, num_classes=10, img_size=16, model_overrides=overrides)
    with torch.no_grad():  # a model whose classes differ: the class read back is the snippet's, not a tie
        for p in module.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    names = [str(i) for i in range(10)]
    checkpoint[METADATA_KEY] = inference_metadata(module.model, module.hparams, names, (0.31,) * 3, (0.38,) * 3)
    torch.save(checkpoint, tmp_path / "m.ckpt")
    export(tmp_path / "m.ckpt", tmp_path / "my_vit", onnx=True)
    (tmp_path / "my_digits").mkdir()
    digit = (load_digits().images[0] * 255 / 16).astype("uint8")
    Image.fromarray(digit).save(tmp_path / "my_digits" / "0.png")
    monkeypatch.chdir(tmp_path)
    return module


def test_the_onnx_runtime_snippet_prepares_and_classifies_as_the_project_does(exported, capsys):
    pytest.importorskip("onnxruntime")
    namespace = run_block(0)
    predictor = vit.Predictor("my_vit")
    x = namespace["x"]
    assert x.shape == (1, 3, 16, 16) and x.dtype == np.float32
    reference = predictor.preprocess(["my_digits/0.png"]).numpy()  # the eval transform the model was trained with
    assert np.abs(x - reference).max() < 0.15 and np.abs(x - reference).mean() < 0.02
    with torch.no_grad():
        logits = exported.model.eval()(torch.from_numpy(x)).numpy()
    assert np.abs(namespace["logits"] - logits).max() < 1e-4
    label, prob = capsys.readouterr().out.split()
    assert label == predictor(["my_digits/0.png"])[0].label
    assert float(prob) == pytest.approx(float(torch.softmax(torch.from_numpy(logits), -1).max()), abs=1e-5)


def test_the_timm_snippet_opens_the_export_with_its_logits(exported, capsys):
    namespace = run_block(1)
    model, config = namespace["model"], namespace["config"]
    assert config["input_size"] == (3, 16, 16) and config["mean"] == pytest.approx((0.31,) * 3)
    window = set(exported.model.attention_kinds()) != {"global"}
    assert type(model).__module__.startswith("vit." if window else "timm.")  # timm's own class for global attention
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), exported.model.eval()(x), atol=1e-5, rtol=0)
    assert "torch.Size([2, 10])" in capsys.readouterr().out


def test_a_weights_file_opens_by_the_name_and_arguments_of_its_config(exported):
    import json

    import timm

    config = json.loads(Path("my_vit/config.json").read_text())
    vit.models.register_timm_models()
    file = {**config["pretrained_cfg"], "file": "my_vit/model.safetensors"}
    model = timm.create_model(
        config["architecture"], pretrained=True, pretrained_cfg_overlay=file, **config["model_args"]
    )
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), exported.model.eval()(x), atol=1e-5, rtol=0)
    if config["architecture"].startswith("vit_pkg_"):  # without a file: no weights to give, said, not random ones
        with pytest.raises(ValueError, match="has no weights in timm's registry"):
            timm.create_model(config["architecture"], pretrained=True)
