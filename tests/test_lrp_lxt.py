"""CP-LRP against lxt, the AttnLRP authors' library, on torchvision's VisionTransformer carrying the same weights as
one of ours."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from vit import VisionTransformer
from vit.explain import lrp

# ---- CP-LRP against lxt, the AttnLRP authors' library, on torchvision's VisionTransformer with the same weights ------

LXT_SCRIPT = r"""
import importlib.util, sys, types
from pathlib import Path
import torch
from torchvision.models import vision_transformer

# lxt's package __init__ imports its language models (transformers); its rules for torchvision's ViT need only the
# two modules loaded here, as lxt.efficient.core.monkey_patch would apply them.
root = Path(importlib.util.find_spec("lxt").submodule_search_locations[0]) / "efficient"
for name, path in (("lxt.efficient", root), ("lxt.efficient.models", root / "models")):
    package = types.ModuleType(name)
    package.__path__ = [str(path)]
    sys.modules[name] = package
from lxt.efficient.models.vit_torch import cp_LRP

for target, patch in cp_LRP.items():
    assert patch(target), target
state, images, target, config = torch.load(sys.argv[1])
model = vision_transformer.VisionTransformer(**config).double().eval()
model.load_state_dict(state)
x = images.clone().requires_grad_(True)
logits = model(x)
logits.gather(1, target[:, None]).sum().backward()
torch.save(((x * x.grad).sum(1).detach(), logits.detach()), sys.argv[2])
"""


def test_cp_lrp_equals_lxt_on_torchvisions_vit(tmp_path):
    """lxt's efficient CP-LRP rules (its map for torchvision's ViT; lxt has no AttnLRP map for it) patch torch's
    classes process-wide, so they run in a subprocess; our CP-LRP on a VisionTransformer carrying the same weights
    gives the same pixel relevance."""
    pytest.importorskip("lxt", reason='lxt is installed without its dependencies: pip install --no-deps "lxt>=2.1"')
    from torchvision.models import vision_transformer

    config = dict(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=5)
    torch.manual_seed(0)
    theirs_model = vision_transformer.VisionTransformer(**config).double().eval()
    with torch.no_grad():  # torchvision starts the head and class token at zero: give them values
        for p in theirs_model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    state = theirs_model.state_dict()
    ours = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0,
                             num_classes=5, qkv_bias=True).double().eval()  # fmt: skip
    mapped = {"cls_token": state["class_token"], "pos_embed": state["encoder.pos_embedding"],
              "patch_embed.proj.weight": state["conv_proj.weight"], "patch_embed.proj.bias": state["conv_proj.bias"],
              "norm.weight": state["encoder.ln.weight"], "norm.bias": state["encoder.ln.bias"],
              "head.weight": state["heads.head.weight"], "head.bias": state["heads.head.bias"]}  # fmt: skip
    for i in range(2):
        theirs, pre = f"encoder.layers.encoder_layer_{i}.", f"blocks.{i}."
        for a, b in (("ln_1", "norm1"), ("self_attention.in_proj", "attn.qkv"), ("self_attention.out_proj",
                     "attn.proj"), ("ln_2", "norm2"), ("mlp.0", "mlp.fc1"), ("mlp.3", "mlp.fc2")):  # fmt: skip
            for kind in ("weight", "bias"):
                mapped[f"{pre}{b}.{kind}"] = state[f"{theirs}{a}.{kind}"] if a != "self_attention.in_proj" else (
                    state[f"{theirs}self_attention.in_proj_{kind}"])  # fmt: skip
    ours.load_state_dict(mapped, strict=True)
    images, target = torch.randn(3, 3, 32, 32, dtype=torch.float64), torch.tensor([0, 2, 4])
    torch.save((state, images, target, config), tmp_path / "in.pt")
    subprocess.run([sys.executable, "-c", LXT_SCRIPT, tmp_path / "in.pt", tmp_path / "out.pt"], check=True)
    expected, logits = torch.load(tmp_path / "out.pt")
    result = lrp(ours, images, target=target, variant="cp")
    torch.testing.assert_close(result.logits, logits, rtol=1e-10, atol=1e-10)  # the same model
    assert float(expected.abs().max()) > 1e-3
    torch.testing.assert_close(result.pixels, expected, rtol=1e-7, atol=1e-9)  # lxt's LayerNorm rounds otherwise
