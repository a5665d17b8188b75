"""VisionTransformer and presets: shapes, gradients, fused/manual parity, timm parity, weight loading."""

from __future__ import annotations

import logging

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer as TimmViT

import vit
from vit.layers import Attention, LinearAttention, NeighborhoodAttention, WindowAttention
from vit.models import IncompatibleCheckpointError, UnsafeCheckpointError, model_config
from vit.models.flops import forward_flops
from vit.models.vision_transformer import block_attention_kinds


def _input(model: vit.VisionTransformer, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, *model.patch_embed.img_size)


@pytest.mark.slow
@pytest.mark.parametrize("name", vit.list_models())
def test_preset_forward_backward(name):
    model = vit.create_model(name, num_classes=7)
    x = _input(model)
    logits = model(x)
    assert logits.shape == (2, 7)
    assert torch.isfinite(logits).all()
    logits.logsumexp(-1).sum().backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert no_grad == []


@pytest.mark.slow
@pytest.mark.parametrize("name", vit.list_models())
def test_preset_fused_and_manual_paths_agree(name):
    model = vit.create_model(name).eval()
    x = _input(model, batch=1)
    with torch.no_grad():
        fused = model(x)
        for block in model.blocks:
            block.attn.fused_attn = False
        manual = model(x)
    torch.testing.assert_close(manual, fused, atol=1e-5, rtol=1e-5)


def test_conv_stem_model_trains_and_counts_the_stem_flops():
    kwargs = {"embed_dim": 96, "depth": 2, "num_heads": 3, "class_token": False, "global_pool": "avg"}
    plain = vit.create_model("vit_tiny_patch4_32", num_classes=10, **kwargs)
    stem = vit.create_model("vit_tiny_patch4_32", num_classes=10, conv_stem=True, **kwargs)
    stem(_input(stem)).logsumexp(-1).sum().backward()
    no_grad = [n for n, p in stem.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert no_grad == [] and any(n.startswith("patch_embed.stem.") for n, _ in stem.named_parameters())
    # The stem's convolutions replace the patchify one; multiply-adds by hand (3x3 convs to 16x16x48 and 8x8x96, a
    # 1x1 conv 96 -> 96 on the 8x8 grid) against one 4x4x3 -> 96 product per patch.
    stem_macs = 16 * 16 * 48 * 3 * 3 * 3 + 8 * 8 * 96 * 3 * 3 * 48 + 8 * 8 * 96 * 96
    patchify_macs = 8 * 8 * 96 * 4 * 4 * 3
    extra = forward_flops(stem, (3, 32, 32)) - forward_flops(plain, (3, 32, 32))
    assert extra == 2 * (stem_macs - patchify_macs)


def test_list_models_and_unknown_name():
    names = vit.list_models()
    for expected in [
        "vit_tiny_patch16_224",
        "vit_small_patch16_224",
        "vit_base_patch16_224",
        "vit_tiny_patch4_32",
        "vit_small_patch4_32",
        "vit_small_window_patch16_224",
        "vit_tiny_window_patch4_32",
        "vit_small_sliding_patch16_224",
        "vit_tiny_sliding_patch4_32",
        "vit_tiny_linear_patch4_32",
        "vit_small_map_patch16_224",
        "vit_tiny_map_patch4_32",
    ]:
        assert expected in names
    with pytest.raises(ValueError, match=r"unknown model 'vit_huge'.*vit_base_patch16_224"):
        vit.create_model("vit_huge")
    with pytest.raises(ValueError, match="bad override.*not_an_arg"):
        vit.create_model("vit_tiny_patch4_32", not_an_arg=1)


def test_cifar_presets_have_64_patch_tokens():
    for name in ("vit_tiny_patch4_32", "vit_small_patch4_32"):
        model = vit.create_model(name)
        assert model.patch_embed.num_patches == 64
        assert model.patch_embed.img_size == (32, 32)


def _timm_pair(name: str, **overrides):
    config = model_config(name, **overrides)
    reference = TimmViT(**config).eval()
    ours = vit.VisionTransformer(**config).eval()
    return ours, reference


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224", "vit_small_map_patch16_224"]
)
def test_timm_weights_load_strictly_and_logits_match(name):
    ours, reference = _timm_pair(name)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in reference.state_dict().items()}
    ours.load_state_dict(reference.state_dict(), strict=True)
    x = _input(ours)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), atol=1e-5, rtol=1e-5)


def test_timm_parity_with_registers_avg_pool_layer_scale_qk_norm():
    ours, reference = _timm_pair(
        "vit_tiny_patch4_32", reg_tokens=4, class_token=False, global_pool="avg", init_values=1e-2, qk_norm=True
    )
    assert "reg_token" in ours.state_dict() and "fc_norm.weight" in ours.state_dict()
    ours.load_state_dict(reference.state_dict(), strict=True)
    x = _input(ours)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            ours.forward_head(ours.forward_features(x), pre_logits=True),
            reference.forward_head(reference.forward_features(x), pre_logits=True),
            atol=1e-5,
            rtol=1e-5,
        )


def test_timm_parity_with_sincos_table_copied_into_learned_pos_embed():
    ours = vit.create_model("vit_tiny_patch4_32", pos_embed="sincos").eval()
    assert "pos_embed" not in dict(ours.named_parameters())
    assert "pos_embed" not in ours.state_dict()
    reference = TimmViT(**model_config("vit_tiny_patch4_32", no_embed_class=True)).eval()
    state = reference.state_dict()
    state.pop("pos_embed")
    ours.load_state_dict(state, strict=True)
    with torch.no_grad():
        reference.pos_embed.copy_(ours.pos_embed)
    x = _input(ours)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), atol=1e-5, rtol=1e-5)


def test_pos_embed_none_and_learned_shapes():
    assert vit.create_model("vit_tiny_patch4_32", pos_embed="none").pos_embed is None
    model = vit.create_model("vit_tiny_patch4_32", reg_tokens=2)
    assert model.pos_embed.shape == (1, 1 + 2 + 64, 192)
    assert model.num_prefix_tokens == 3


def test_init_follows_vit_deit():
    model = vit.create_model("vit_small_patch16_224")
    fc1 = torch.cat([b.mlp.fc1.weight.flatten() for b in model.blocks])
    assert abs(fc1.std().item() - 0.02) < 0.002  # truncated normal, std 0.02 (truncation at ±2 is ~100 std)
    assert fc1.abs().max() <= 2.0
    assert all(torch.all(b.attn.qkv.bias == 0) for b in model.blocks)
    assert torch.all(model.norm.weight == 1) and torch.all(model.norm.bias == 0)
    assert model.cls_token.abs().max() < 1e-4
    assert abs(model.pos_embed.std().item() - 0.02) < 0.002


def test_stochastic_depth_increases_linearly():
    model = vit.create_model("vit_tiny_patch4_32", drop_path_rate=0.3, depth=4)
    rates = [0.0] + [b.drop_path1.drop_prob for b in model.blocks[1:]]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert isinstance(model.blocks[0].drop_path1, torch.nn.Identity)


def test_patch_dropout_matches_timm_in_training_and_keeps_every_patch_in_eval():
    ours, reference = _timm_pair("vit_tiny_patch4_32", depth=2, patch_drop_rate=0.5, reg_tokens=1)
    ours.load_state_dict(reference.state_dict(), strict=True)
    seen = []
    ours.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[1]))
    x = _input(ours)
    ours.train(), reference.train()
    torch.manual_seed(3)
    logits = ours(x)
    torch.manual_seed(3)  # the same random choice of patches
    torch.testing.assert_close(logits, reference(x), atol=1e-5, rtol=1e-5)
    ours.eval(), reference.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), atol=1e-5, rtol=1e-5)
    assert seen == [2 + 32, 2 + 64]  # class + register token, then half of the 8 x 8 patches / all of them


def test_forward_head_and_reset_classifier():
    model = vit.create_model("vit_tiny_patch4_32", depth=2).eval()
    x = _input(model)
    features = model.forward_head(model.forward_features(x), pre_logits=True)
    assert features.shape == (2, 192)
    model.reset_classifier(3)
    assert model.num_classes == 3 and model(x).shape == (2, 3)
    model.reset_classifier(0)
    assert model(x).shape == (2, 192)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(embed_dim=100, num_heads=3), r"embed_dim 100 is not divisible by num_heads 3"),
        (dict(img_size=30), r"30 is not divisible by patch height 4"),
        (dict(class_token=False), r"global_pool='token' needs class_token=True"),
        (dict(global_pool="max"), r"global_pool"),
        (dict(pos_embed="rope"), r"pos_embed"),
        (dict(reg_tokens=-1), r"reg_tokens"),
        (dict(patch_drop_rate=1.0), r"patch_drop_rate must be in \[0, 1\), got 1.0"),
        (dict(patch_drop_rate=0.5, window_size=4), r"patch_drop_rate 0.5 needs global attention in every block"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        vit.create_model("vit_tiny_patch4_32", **kwargs)


# --- load_pretrained -------------------------------------------------------------------------------------


LAYERS = {"global": Attention, "window": WindowAttention, "sliding": NeighborhoodAttention, "linear": LinearAttention}


@pytest.mark.parametrize(
    "overrides, kinds",
    [
        ({}, ["global"] * 4),
        ({"window_size": 4, "global_attn_indexes": (2,)}, ["window", "window", "global", "window"]),
        (
            {"window_size": 4, "shift_windows": True, "global_attn_indexes": (1,)},
            ["window", "global", "window", "window"],
        ),
        ({"window_size": 4, "global_attn_indexes": (0, 1, 2, 3)}, ["global"] * 4),
        ({"window_size": 3, "window_type": "sliding"}, ["sliding"] * 4),
        (
            {"window_size": 3, "window_type": "sliding", "window_dilation": 2, "global_attn_indexes": (0, 3)},
            ["global", "sliding", "sliding", "global"],
        ),
        ({"linear_attention": True, "global_attn_indexes": (1,)}, ["linear", "global", "linear", "linear"]),
        ({"linear_attention": True, "linear_feature_map": "relu"}, ["linear"] * 4),
    ],
)
def test_attention_kinds_name_each_block_by_its_layer(tiny_vit, overrides, kinds):
    model = tiny_vit(depth=4, **overrides)
    assert model.attention_kinds() == kinds
    assert [type(block.attn) for block in model.blocks] == [LAYERS[kind] for kind in kinds]
    assert block_attention_kinds({**tiny_vit.config(depth=4), **overrides}) == kinds  # the same, before building


@pytest.mark.parametrize(
    "name, local",
    [
        ("vit_tiny_patch4_32", "global"),
        ("vit_tiny_window_patch4_32", "window"),
        ("vit_tiny_sliding_patch4_32", "sliding"),
        ("vit_tiny_linear_patch4_32", "linear"),
    ],
)
def test_attention_kinds_of_the_presets(tiny_vit, name, local):
    model = tiny_vit(name, depth=12)  # every third block global in the local presets
    assert model.attention_kinds() == ([local, local, "global"] * 4 if local != "global" else ["global"] * 12)
    assert [type(block.attn) for block in model.blocks] == [LAYERS[kind] for kind in model.attention_kinds()]
    assert block_attention_kinds(model_config(name)) == model.attention_kinds()


def test_attention_kinds_follow_pruned_blocks(tiny_vit):
    model = tiny_vit("vit_tiny_window_patch4_32", depth=12)
    model.prune_intermediate_layers(indices=[3])  # blocks 0 to 3 kept
    assert model.attention_kinds() == ["window", "window", "global", "window"]


def test_load_pretrained_from_timm_files(tmp_path):
    reference = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
    torch.save(reference.state_dict(), tmp_path / "w.pth")
    save_file(reference.state_dict(), str(tmp_path / "w.safetensors"))
    x = torch.randn(1, 3, 224, 224)
    for name in ("w.pth", "w.safetensors"):
        ours = vit.load_pretrained(vit.create_model("vit_tiny_patch16_224").eval(), tmp_path / name)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), reference(x), atol=1e-5, rtol=1e-5)


def test_load_pretrained_from_lightning_style_checkpoint(tmp_path):
    source = vit.create_model("vit_tiny_patch4_32", depth=2)
    checkpoint = {"epoch": 3, "state_dict": {f"model.{k}": v for k, v in source.state_dict().items()}}
    torch.save(checkpoint, tmp_path / "last.ckpt")
    target = vit.load_pretrained(vit.create_model("vit_tiny_patch4_32", depth=2), tmp_path / "last.ckpt")
    for k, v in source.state_dict().items():
        assert torch.equal(target.state_dict()[k], v)


def test_load_pretrained_prefers_the_ema_weights_of_a_checkpoint(tmp_path):
    raw = vit.create_model("vit_tiny_patch4_32", depth=1)
    ema = vit.create_model("vit_tiny_patch4_32", depth=1)
    state = {f"model.{k}": v for k, v in raw.state_dict().items()}
    state.update({f"model_ema.module.{k}": v for k, v in ema.state_dict().items()})
    torch.save({"state_dict": state}, tmp_path / "ema.ckpt")
    target = vit.load_pretrained(vit.create_model("vit_tiny_patch4_32", depth=1), tmp_path / "ema.ckpt")
    assert torch.equal(target.blocks[0].attn.qkv.weight, ema.blocks[0].attn.qkv.weight)
    assert not torch.equal(target.blocks[0].attn.qkv.weight, raw.blocks[0].attn.qkv.weight)


def test_load_pretrained_resamples_grid_and_drops_head(caplog):
    source = vit.create_model("vit_tiny_patch16_224", depth=2, num_classes=1000)
    target = vit.create_model("vit_tiny_patch16_224", depth=2, img_size=384, num_classes=10)
    head_before = target.head.weight.clone()
    with caplog.at_level(logging.INFO, logger="vit.checkpoints.pretrained"):
        vit.load_pretrained(target, source.state_dict())
    assert "dropped the checkpoint's head (1000 classes)" in caplog.text
    assert torch.equal(target.head.weight, head_before)
    assert target.pos_embed.shape == (1, 1 + 24 * 24, 192)
    torch.testing.assert_close(target.pos_embed[:, :1], source.pos_embed[:, :1])
    torch.testing.assert_close(target.blocks[1].mlp.fc2.weight, source.blocks[1].mlp.fc2.weight)
    assert target(torch.randn(1, 3, 384, 384)).shape == (1, 10)


def test_load_pretrained_lists_missing_unexpected_and_misshaped_keys():
    source = vit.create_model("vit_tiny_patch4_32", depth=3).state_dict()
    source["extra.weight"] = torch.zeros(2)
    target = vit.create_model("vit_small_patch4_32", depth=2)
    with pytest.raises(IncompatibleCheckpointError) as err:
        vit.load_pretrained(target, source)
    message = str(err.value)
    assert "unexpected key(s): blocks.2." in message and "extra.weight" in message
    assert "mis-shaped" in message and "blocks.0.attn.proj.bias: checkpoint (192,) vs model (384,)" in message
    missing = vit.create_model("vit_tiny_patch4_32", depth=2).state_dict()
    missing.pop("norm.weight")
    with pytest.raises(IncompatibleCheckpointError, match=r"1 missing key\(s\): norm.weight"):
        vit.load_pretrained(vit.create_model("vit_tiny_patch4_32", depth=2), missing)


class _Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_load_pretrained_refuses_pickles_that_run_code(tmp_path, capsys):
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": _Payload()}, path)  # a real torch.save file whose pickle would run code
    with pytest.raises(UnsafeCheckpointError, match=r"refusing to load .*evil.pth"):
        vit.load_pretrained(vit.create_model("vit_tiny_patch4_32", depth=1), path)
    assert "this must never run" not in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="nothing.pth"):
        vit.load_pretrained(vit.create_model("vit_tiny_patch4_32", depth=1), tmp_path / "nothing.pth")


@pytest.mark.slow
def test_model_layer_imports_without_training_stack():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('lightning', 'pytorch_lightning', 'wandb', 'albumentations'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import vit\n"
        "m = vit.create_model('vit_tiny_window_patch4_32', depth=3, global_attn_indexes=(2,))\n"
        "print(tuple(m(__import__('torch').randn(1, 3, 32, 32)).shape))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(1, 10)"


# Every preset's constructor arguments, written out in full: deriving presets from shared bases must not change
# any of them.
PRESET_ARGUMENTS = {
    "vit_base_patch16_224": dict(depth=12, embed_dim=768, num_heads=12, patch_size=16),
    "vit_small_map_patch16_224": dict(
        class_token=False, depth=12, embed_dim=384, global_pool="map", num_heads=6, patch_size=16
    ),
    "vit_small_patch16_224": dict(depth=12, embed_dim=384, num_heads=6, patch_size=16),
    "vit_small_patch4_32": dict(depth=12, embed_dim=384, img_size=32, num_classes=10, num_heads=6, patch_size=4),
    "vit_small_sliding_patch16_224": dict(
        depth=12,
        embed_dim=384,
        global_attn_indexes=(2, 5, 8, 11),
        num_heads=6,
        patch_size=16,
        window_size=7,
        window_type="sliding",
    ),
    "vit_small_window_patch16_224": dict(
        depth=12, embed_dim=384, global_attn_indexes=(2, 5, 8, 11), num_heads=6, patch_size=16, window_size=7
    ),
    "vit_tiny_linear_patch4_32": dict(
        depth=12,
        embed_dim=192,
        global_attn_indexes=(2, 5, 8, 11),
        img_size=32,
        linear_attention=True,
        num_classes=10,
        num_heads=3,
        patch_size=4,
    ),
    "vit_tiny_map_patch4_32": dict(
        class_token=False,
        depth=12,
        embed_dim=192,
        global_pool="map",
        img_size=32,
        num_classes=10,
        num_heads=3,
        patch_size=4,
    ),
    "vit_tiny_patch16_224": dict(depth=12, embed_dim=192, num_heads=3, patch_size=16),
    "vit_tiny_patch4_32": dict(depth=12, embed_dim=192, img_size=32, num_classes=10, num_heads=3, patch_size=4),
    "vit_tiny_sliding_patch4_32": dict(
        depth=12,
        embed_dim=192,
        global_attn_indexes=(2, 5, 8, 11),
        img_size=32,
        num_classes=10,
        num_heads=3,
        patch_size=4,
        window_size=5,
        window_type="sliding",
    ),
    "vit_tiny_window_patch4_32": dict(
        depth=12,
        embed_dim=192,
        global_attn_indexes=(2, 5, 8, 11),
        img_size=32,
        num_classes=10,
        num_heads=3,
        patch_size=4,
        shift_windows=True,
        window_size=4,
    ),
}


@pytest.mark.parametrize("name", vit.list_models())
def test_presets_keep_their_arguments(name):
    assert model_config(name) == PRESET_ARGUMENTS[name]


def test_every_preset_is_listed():
    assert vit.list_models() == sorted(PRESET_ARGUMENTS)
