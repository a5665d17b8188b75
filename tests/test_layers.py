"""Layers against references: convolution, explicit attention, sine-cosine formulas, interpolation."""

from __future__ import annotations

import math

import pytest
import timm.layers
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed
from torch import nn

from vit.layers import (
    Attention,
    AttentionBase,
    AttentionPoolLatent,
    Block,
    CrossAttention,
    PatchEmbed,
    build_sincos_2d_pos_embed,
    resample_pos_embed,
)


@pytest.mark.parametrize(("img_size", "patch_size"), [(32, 4), ((48, 32), 8), ((30, 40), (6, 10))])
def test_patch_embed_equals_strided_convolution(img_size, patch_size):
    embed = PatchEmbed(img_size, patch_size, in_chans=3, embed_dim=16)
    x = torch.randn(2, 3, *embed.img_size)
    reference = F.conv2d(x, embed.proj.weight, embed.proj.bias, stride=embed.patch_size).flatten(2).transpose(1, 2)
    out = embed(x)
    assert out.shape == (2, embed.num_patches, 16)
    assert embed.grid_size == (embed.img_size[0] // embed.patch_size[0], embed.img_size[1] // embed.patch_size[1])
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)


def test_patch_embed_rejects_indivisible_size_naming_both_numbers():
    with pytest.raises(ValueError, match=r"30.*not divisible.*16"):
        PatchEmbed(img_size=30, patch_size=16)
    with pytest.raises(ValueError, match=r"width 40 is not divisible by patch width 16"):
        PatchEmbed(img_size=(32, 40), patch_size=16)


def test_patch_embed_rejects_wrong_input_size():
    embed = PatchEmbed(32, 4, embed_dim=8)
    with pytest.raises(ValueError, match=r"\(64, 64\).*\(32, 32\)"):
        embed(torch.randn(1, 3, 64, 64))


def _stem_reference(embed: PatchEmbed, x: torch.Tensor) -> torch.Tensor:
    """Xiao et al.'s stem written out: (3x3 stride-2 conv, BatchNorm, ReLU) per halving, then a 1x1 conv."""
    for layer in embed.stem:
        conv, bn = layer.conv, layer.bn
        x = F.conv2d(x, conv.weight, None, stride=2, padding=1)
        x = F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, training=False, eps=bn.eps)
        x = F.relu(x)
    x = F.conv2d(x, embed.proj.weight, embed.proj.bias)
    return x.flatten(2).transpose(1, 2)


@pytest.mark.parametrize(("patch_size", "embed_dim", "channels"), [(4, 96, [48, 96]), (16, 384, [48, 96, 192, 384])])
def test_conv_stem_is_xiao_et_al(patch_size, embed_dim, channels):
    embed = PatchEmbed(32, patch_size, in_chans=3, embed_dim=embed_dim, conv_stem=True).eval()
    assert [layer.conv.out_channels for layer in embed.stem] == channels  # doubling up to the width (their Table 1)
    with torch.no_grad():  # non-trivial BatchNorm statistics
        for layer in embed.stem:
            layer.bn.running_mean.uniform_(-1, 1)
            layer.bn.running_var.uniform_(0.5, 2)
            layer.bn.weight.uniform_(0.5, 2)
            layer.bn.bias.uniform_(-1, 1)
    x = torch.randn(2, 3, 32, 32)
    out = embed(x)
    assert out.shape == (2, embed.num_patches, embed_dim) and embed.grid_size == (32 // patch_size,) * 2
    torch.testing.assert_close(out, _stem_reference(embed, x), atol=1e-5, rtol=1e-5)


def test_conv_stem_rejects_patch_sizes_it_cannot_halve_to():
    for patch in (3, 6, (4, 8)):
        with pytest.raises(ValueError, match=r"conv_stem needs a square power-of-two patch size"):
            PatchEmbed(24, patch, conv_stem=True)
    with pytest.raises(ValueError, match=r"halves the channels 3 times from embed_dim 4: use embed_dim >= 8"):
        PatchEmbed(32, 16, embed_dim=4, conv_stem=True)


def test_sincos_table_matches_formula():
    table = build_sincos_2d_pos_embed((3, 5), embed_dim=8)
    assert table.shape == (1, 15, 8)
    # embed_dim 8 -> 2 frequencies: omega = [1, 1/100]; row r, column c at index r*5 + c.
    r, c = 2, 3
    omega = torch.tensor([1.0, 1.0 / 100.0])
    expected = torch.cat([(r * omega).sin(), (r * omega).cos(), (c * omega).sin(), (c * omega).cos()])
    torch.testing.assert_close(table[0, r * 5 + c], expected)
    with pytest.raises(ValueError, match="divisible by 4"):
        build_sincos_2d_pos_embed(4, embed_dim=6)


def test_resample_to_same_size_is_identity():
    pos = torch.randn(1, 1 + 49, 16)
    assert torch.equal(resample_pos_embed(pos, (7, 7), num_prefix_tokens=1), pos)


@pytest.mark.parametrize(("old", "new"), [((4, 6), (8, 12)), ((14, 14), (7, 7)), ((8, 8), (12, 10))])
def test_resample_keeps_prefix_and_matches_timm(old, new):
    pos = torch.randn(1, 2 + old[0] * old[1], 8)
    out = resample_pos_embed(pos, new, old_size=old, num_prefix_tokens=2)
    assert out.shape == (1, 2 + new[0] * new[1], 8)
    torch.testing.assert_close(out[:, :2], pos[:, :2])
    expected = resample_abs_pos_embed(pos, new_size=list(new), old_size=list(old), num_prefix_tokens=2)
    torch.testing.assert_close(out, expected)
    # A constant grid stays constant whatever the new size.
    const = torch.ones(1, 1 + 16, 4)
    torch.testing.assert_close(resample_pos_embed(const, (7, 3), num_prefix_tokens=1), torch.ones(1, 22, 4))


def test_resample_rejects_non_square_without_old_size():
    with pytest.raises(ValueError, match="old_size"):
        resample_pos_embed(torch.randn(1, 1 + 12, 4), (4, 4))


def _explicit_attention(attn: Attention, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Textbook multi-head attention from the module's weights, with loops over heads."""
    B, N, C = x.shape
    h, d = attn.num_heads, attn.head_dim
    q, k, v = F.linear(x, attn.qkv.weight, attn.qkv.bias).chunk(3, dim=-1)
    outs = []
    for i in range(h):
        qi, ki, vi = (t[..., i * d : (i + 1) * d] for t in (q, k, v))
        scores = qi @ ki.transpose(1, 2) / math.sqrt(d)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        outs.append(scores.softmax(-1) @ vi)
    return F.linear(torch.cat(outs, dim=-1), attn.proj.weight, attn.proj.bias)


@pytest.mark.parametrize("fused", [True, False])
def test_attention_matches_explicit_reference(fused):
    attn = Attention(dim=24, num_heads=3, qkv_bias=True, fused_attn=fused).eval()
    x = torch.randn(2, 10, 24)
    torch.testing.assert_close(attn(x), _explicit_attention(attn, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_fused_and_manual_paths_agree(qk_norm):
    attn = Attention(dim=32, num_heads=4, qkv_bias=True, qk_norm=qk_norm).eval()
    x = torch.randn(3, 17, 32)
    fused = attn(x)
    attn.fused_attn = False
    torch.testing.assert_close(attn(x), fused, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fused", [True, False])
def test_boolean_mask_gives_masked_keys_exactly_zero_weight(fused):
    attn = Attention(dim=16, num_heads=2, fused_attn=fused).eval()
    x = torch.randn(2, 6, 16)
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[:, 4:] = False  # keys 4 and 5 hidden from everyone
    out = attn(x, attn_mask=mask)
    torch.testing.assert_close(out, _explicit_attention(attn, x, mask), atol=1e-5, rtol=1e-5)
    # Changing hidden keys changes nothing.
    y = x.clone()
    y[:, 4:] = torch.randn(2, 2, 16) * 100
    torch.testing.assert_close(attn(y, attn_mask=mask)[:, :4], out[:, :4], atol=1e-5, rtol=1e-5)
    weights = attn.attention_weights(x, attn_mask=mask)
    assert torch.all(weights[..., 4:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 6))


@pytest.mark.parametrize("fused", [True, False])
def test_additive_mask_matches_boolean_mask(fused):
    attn = Attention(dim=16, num_heads=2, fused_attn=fused).eval()
    x = torch.randn(2, 5, 16)
    keep = torch.rand(5, 5) > 0.4
    keep.fill_diagonal_(True)
    additive = torch.zeros(5, 5).masked_fill(~keep, float("-inf"))
    torch.testing.assert_close(attn(x, attn_mask=additive), attn(x, attn_mask=keep), atol=1e-6, rtol=1e-5)


def test_attention_rejects_bad_head_count():
    with pytest.raises(ValueError, match=r"embed_dim 30 is not divisible by num_heads 4"):
        Attention(dim=30, num_heads=4)


def test_block_is_pre_norm_residual():
    block = Block(dim=16, num_heads=2, init_values=0.5).eval()
    x = torch.randn(2, 5, 16)
    h = x + 0.5 * block.attn(block.norm1(x))
    expected = h + 0.5 * block.mlp(block.norm2(h))
    torch.testing.assert_close(block(x), expected)
    assert torch.all(block.ls1.gamma == 0.5)


def test_self_and_cross_attention_share_the_constructor_and_the_attend_switch():
    """One constructor and one fused/explicit switch; timm's parameter names in timm's order, so a seeded
    initialisation draws the same numbers as layers built one by one in that order."""
    assert Attention.attend is CrossAttention.attend is AttentionBase.attend
    assert Attention.__init__ is AttentionBase.__init__
    for ours, theirs in (
        (
            Attention(16, 2, qkv_bias=True, qk_norm=True),
            timm.layers.Attention(16, num_heads=2, qkv_bias=True, qk_norm=True, norm_layer=nn.LayerNorm),
        ),
        (
            AttentionPoolLatent(16, 2, qk_norm=True),
            timm.layers.AttentionPoolLatent(16, num_heads=2, qk_norm=True, norm_layer=nn.LayerNorm),
        ),
    ):
        assert list(ours.state_dict()) == list(theirs.state_dict())
    torch.manual_seed(0)
    layer = CrossAttention(16, 4, qkv_bias=True)
    torch.manual_seed(0)
    q, kv, proj = nn.Linear(16, 16), nn.Linear(16, 32), nn.Linear(16, 16)
    for name, reference in (("q", q), ("kv", kv), ("proj", proj)):
        torch.testing.assert_close(getattr(layer, name).weight, reference.weight, atol=0, rtol=0)
        torch.testing.assert_close(getattr(layer, name).bias, reference.bias, atol=0, rtol=0)
    assert layer.head_dim == 4 and layer.scale == 0.5 and layer.fused_attn
    with pytest.raises(ValueError, match="embed_dim 16 is not divisible by num_heads 3"):
        CrossAttention(16, 3)


def test_patch_embed_pads_and_keeps_the_grid_as_timm():
    """dynamic_img_pad pads at the bottom and right like timm's PatchEmbed; NHWC keeps the grid."""
    ours = PatchEmbed(32, 8, 3, 16, dynamic_img_size=True, dynamic_img_pad=True, output_fmt="NHWC")
    theirs = timm.layers.PatchEmbed(32, 8, 3, 16, output_fmt="NHWC", strict_img_size=False, dynamic_img_pad=True)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 27, 41)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=0)
    assert ours(x).shape == (2, 4, 6, 16) and ours.dynamic_feat_size((27, 41)) == theirs.dynamic_feat_size((27, 41))
    with pytest.raises(ValueError, match="output_fmt must be 'NLC' or 'NHWC', got 'NCHW'"):
        PatchEmbed(32, 8, output_fmt="NCHW")
