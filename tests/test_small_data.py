"""The variants for small data against references written here: locality self-attention (an explicit loop over heads
with the diagonal at -inf and the scores times the learned scale), shifted patch tokens (shifts built with torch.roll
and zeroed wrap-around, patches cut with F.unfold), sequence pooling (its formula); the model's switches, its state
dict with each off, and the explanation methods on each."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer as TimmViT

import vit
from vit.explain import attention_attribution, attention_rollout, capture_attention, rollout_map
from vit.layers import (
    LocalityAttention,
    LocalityWindowAttention,
    SequencePool,
    ShiftedPatchEmbed,
    shifted_copies,
    window_attention_mask,
)

SMALL = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=5)
VARIANTS = {
    "locality": dict(locality_attention=True),
    "locality-window": dict(locality_attention=True, window_size=2, shift_windows=True, global_attn_indexes=(1,)),
    "shifted-patches": dict(shifted_patches=True),
    "shifted-patches-stem": dict(shifted_patches=True, conv_stem=True),
    "seqpool": dict(global_pool="seqpool", class_token=False),
    "all": dict(locality_attention=True, shifted_patches=True, global_pool="seqpool", class_token=False),
}


def _model(**kwargs) -> vit.VisionTransformer:
    torch.manual_seed(0)
    model = vit.VisionTransformer(**{**SMALL, **kwargs})
    with torch.no_grad():  # away from the initial value, different per head, so that a wrong scale shows
        for name, p in model.named_parameters():
            if name.endswith("logit_scale"):
                p.uniform_(0.1, 0.6)
    return model


# ---- locality self-attention -------------------------------------------------------------------------------------
def _lsa_reference(attn, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per head: scores q kᵀ times the head's learned scale, the diagonal at -inf, softmax, weighted values."""
    B, N, C = x.shape
    h, d = attn.num_heads, attn.head_dim
    q, k, v = F.linear(x, attn.qkv.weight, attn.qkv.bias).chunk(3, dim=-1)
    outs = []
    for i in range(h):
        qi, ki, vi = (t[..., i * d : (i + 1) * d] for t in (q, k, v))
        scores = torch.einsum("bnd,bmd->bnm", qi, ki) * attn.logit_scale[i]
        for n in range(N):
            scores[:, n, n] = float("-inf")
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        outs.append(scores.softmax(-1) @ vi)
    return F.linear(torch.cat(outs, dim=-1), attn.proj.weight, attn.proj.bias)


def _lsa(cls=LocalityAttention, **kwargs):
    torch.manual_seed(0)
    attn = cls(24, num_heads=3, qkv_bias=True, **kwargs).eval()
    with torch.no_grad():
        attn.logit_scale.copy_(torch.tensor([0.05, 0.3, 1.2]))
    return attn


@pytest.mark.parametrize("fused", [True, False])
def test_locality_attention_matches_the_loop_reference(fused):
    attn = _lsa(fused_attn=fused)
    x = torch.randn(2, 10, 24)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), _lsa_reference(attn, x), atol=1e-5, rtol=1e-5)
        keep = torch.rand(10, 10) > 0.3
        keep[:, 0] = True  # every row keeps a key besides its own
        torch.testing.assert_close(attn(x, attn_mask=keep), _lsa_reference(attn, x, keep), atol=1e-5, rtol=1e-5)
        additive = torch.zeros(10, 10).masked_fill(~keep, float("-inf"))
        torch.testing.assert_close(attn(x, attn_mask=additive), attn(x, attn_mask=keep), atol=1e-6, rtol=1e-5)
        weights = attn.attention_weights(x)
    assert weights.diagonal(dim1=-2, dim2=-1).abs().max() == 0
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 10))


def test_locality_attention_fused_and_explicit_agree_and_train_the_scale():
    attn = _lsa(qk_norm=True)
    x = torch.randn(3, 17, 24)
    fused = attn(x)
    attn.fused_attn = False
    explicit = attn(x)
    torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=1e-5)
    explicit.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in attn.parameters())
    assert attn.logit_scale.shape == (3,)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(("grid", "w", "shift", "prefix"), [((4, 4), 2, 0, 1), ((6, 6), 4, 2, 0), ((5, 6), 3, 1, 2)])
def test_locality_window_attention_is_lsa_masked_by_the_window_pattern(grid, w, shift, prefix, fused):
    # window_attention_mask is checked against a loop reference in test_window_attention.py
    attn = _lsa(LocalityWindowAttention, grid_size=grid, window_size=w, shift=shift, num_prefix_tokens=prefix,
                fused_attn=fused)  # fmt: skip
    x = torch.randn(2, prefix + grid[0] * grid[1], 24)
    pattern = window_attention_mask(grid, w, shift, prefix)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), _lsa_reference(attn, x, pattern), atol=1e-5, rtol=1e-5)
        weights = attn.attention_weights(x)
    assert weights.diagonal(dim1=-2, dim2=-1).abs().max() == 0 and not weights[..., ~pattern].any()


def test_locality_window_refuses_a_lone_patch_without_prefix_tokens():
    with pytest.raises(ValueError, match="leaves a window of one patch in the 5x5 grid"):
        LocalityWindowAttention(24, 3, grid_size=(5, 5), window_size=2, num_prefix_tokens=0)
    attn = LocalityWindowAttention(24, 3, grid_size=(4, 4), window_size=2, num_prefix_tokens=0)
    with pytest.raises(ValueError, match="window of one patch in the 3x3 grid"):
        attn(torch.randn(1, 9, 24), grid_size=(3, 3))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(window_size=3, window_type="sliding"), "locality_attention is not supported with window_type='sliding'"),
        (dict(linear_attention=True), "locality_attention is not supported with linear_attention"),
    ],
)
def test_locality_attention_refuses_sliding_and_linear_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        vit.VisionTransformer(**SMALL, locality_attention=True, **kwargs)
    assert "\n" not in str(error.value)


def test_switches_off_keep_timms_state_dict_and_on_add_only_their_parameters():
    timm_keys = list(TimmViT(**SMALL).state_dict())
    assert list(vit.VisionTransformer(**SMALL).state_dict()) == timm_keys
    lsa = vit.VisionTransformer(**SMALL, locality_attention=True).state_dict()
    assert set(lsa) - set(timm_keys) == {"blocks.0.attn.logit_scale", "blocks.1.attn.logit_scale"}
    assert set(timm_keys) <= set(lsa)
    spt = vit.VisionTransformer(**SMALL, shifted_patches=True).state_dict()
    assert set(spt) - set(timm_keys) == {"patch_embed.patch_norm.weight", "patch_embed.patch_norm.bias"}
    assert spt["patch_embed.proj.weight"].shape == (32, 15, 4, 4)
    seq = vit.VisionTransformer(**SMALL, global_pool="seqpool").state_dict()
    assert set(seq) - set(timm_keys) == {"attn_pool.score.weight"}
    # timm's weights load into the variants, the new parameters at their initial values
    theirs = TimmViT(**SMALL).state_dict()
    model = vit.VisionTransformer(**SMALL, locality_attention=True, global_pool="seqpool")
    result = model.load_state_dict(theirs, strict=False)
    assert not result.unexpected_keys and all("logit_scale" in k or "score" in k for k in result.missing_keys)


# ---- shifted patch tokens ----------------------------------------------------------------------------------------
def _shift_reference(x: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """``out[i, j] = x[i - dy, j - dx]``, zero where that is outside the image: torch.roll, wrap-around zeroed."""
    out = torch.roll(x, shifts=(dy, dx), dims=(2, 3)).clone()
    H, W = x.shape[-2:]
    rows, cols = torch.arange(H), torch.arange(W)
    out[:, :, ((rows - dy) < 0) | ((rows - dy) >= H)] = 0
    out[:, :, :, ((cols - dx) < 0) | ((cols - dx) >= W)] = 0
    return out


def test_shifted_copies_are_the_four_diagonal_half_patch_shifts():
    x = torch.randn(2, 3, 8, 12)
    got = shifted_copies(x, (2, 3))
    views = [x] + [_shift_reference(x, dy, dx) for dy, dx in ((2, 3), (2, -3), (-2, 3), (-2, -3))]
    assert torch.equal(got, torch.cat(views, dim=1))


@pytest.mark.parametrize(("img_size", "patch_size"), [(16, 4), ((12, 16), (4, 2))])
def test_shifted_patch_embed_is_layernormed_flattened_patches_of_five_views(img_size, patch_size):
    torch.manual_seed(0)
    embed = ShiftedPatchEmbed(img_size, patch_size, in_chans=3, embed_dim=16)
    with torch.no_grad():
        embed.patch_norm.weight.uniform_(0.5, 1.5)
        embed.patch_norm.bias.normal_()
    x = torch.randn(2, 3, *embed.img_size)
    (ph, pw), (sh, sw) = embed.patch_size, (embed.patch_size[0] // 2, embed.patch_size[1] // 2)
    views = [x] + [_shift_reference(x, dy, dx) for dy, dx in ((sh, sw), (sh, -sw), (-sh, sw), (-sh, -sw))]
    patches = F.unfold(torch.cat(views, 1), (ph, pw), stride=(ph, pw)).transpose(1, 2)  # (B, L, 15 ph pw)
    normed = F.layer_norm(patches, patches.shape[-1:], embed.patch_norm.weight, embed.patch_norm.bias)
    reference = normed @ embed.proj.weight.flatten(1).T + embed.proj.bias
    assert embed.in_chans == 3 and embed.proj.in_channels == 15
    with torch.no_grad():
        torch.testing.assert_close(embed(x), reference, atol=1e-5, rtol=1e-5)


def test_shifted_patches_with_the_conv_stem_feed_it_the_five_views():
    torch.manual_seed(0)
    embed = ShiftedPatchEmbed(16, 4, in_chans=3, embed_dim=16, conv_stem=True).eval()
    x = torch.randn(2, 3, 16, 16)
    views = torch.cat([x] + [_shift_reference(x, dy, dx) for dy, dx in ((2, 2), (2, -2), (-2, 2), (-2, -2))], 1)
    h = views
    for layer in embed.stem:
        h = F.conv2d(h, layer.conv.weight, None, stride=2, padding=1)
        h = F.relu(F.batch_norm(h, layer.bn.running_mean, layer.bn.running_var, layer.bn.weight, layer.bn.bias,
                                eps=layer.bn.eps))  # fmt: skip
    reference = F.conv2d(h, embed.proj.weight, embed.proj.bias).flatten(2).transpose(1, 2)
    assert isinstance(embed.patch_norm, torch.nn.Identity)  # the stem's BatchNorms normalise instead
    with torch.no_grad():
        torch.testing.assert_close(embed(x), reference, atol=1e-5, rtol=1e-5)


def test_shifted_patches_refuse_a_patch_side_of_one():
    with pytest.raises(ValueError, match=r"needs sides >= 2"):
        ShiftedPatchEmbed(8, (1, 2), embed_dim=8)


# ---- sequence pooling --------------------------------------------------------------------------------------------
def test_sequence_pool_is_the_softmax_weighted_mean():
    torch.manual_seed(0)
    pool = SequencePool(8)
    x = torch.randn(3, 5, 8)
    scores = x @ pool.score.weight[0]  # (B, N); CCT's bias would cancel in the softmax
    weights = scores.exp() / scores.exp().sum(1, keepdim=True)
    expected = (weights[:, :, None] * x).sum(1)
    torch.testing.assert_close(pool(x), expected)
    torch.testing.assert_close(pool.attention_weights(x)[:, 0, 0], weights)
    keep = torch.tensor([True, False, True, True, False]).expand(3, 5)
    masked = (scores.exp() * keep) / (scores.exp() * keep).sum(1, keepdim=True)
    torch.testing.assert_close(pool(x, keep), (masked[:, :, None] * x).sum(1))


def test_seqpool_model_pools_its_patch_tokens_and_refuses_a_pool_it_lacks():
    model = _model(global_pool="seqpool", reg_tokens=2).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        tokens = model.forward_features(x)[:, 3:]  # class token and two registers are not pooled
        w = (tokens @ model.attn_pool.score.weight[0]).softmax(1)
        pooled = (w[:, :, None] * tokens).sum(1)
        torch.testing.assert_close(model(x), model.head(pooled), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="global_pool='map' needs the attention-pooling head"):
        model.reset_classifier(5, global_pool="map")
    model.reset_classifier(3, global_pool="avg")
    assert model.attn_pool is None and model(x).shape == (2, 3)


# ---- the model with every variant --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_forward_backward_and_fused_explicit_parity(name):
    model = _model(**VARIANTS[name]).train()
    x = torch.randn(2, 3, 16, 16)
    out = model(x)
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    out.square().sum().backward()
    silent = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not silent
    model.eval()
    with torch.no_grad():
        fused = model(x)
        for module in model.modules():
            if hasattr(module, "fused_attn"):
                module.fused_attn = False
        torch.testing.assert_close(model(x), fused, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_rollout_and_attribution_cover_every_variant(name):
    model = _model(**VARIANTS[name]).eval()
    x = torch.randn(2, 3, 16, 16)
    record = capture_attention(model, x)
    P = model.num_prefix_tokens
    if "locality_attention" in VARIANTS[name]:
        assert all(a.diagonal(dim1=-2, dim2=-1).abs().max() == 0 for a in record)
    # rollout by hand: (A + I) / 2 (rows sum to 1), multiplied in block order, read at the rows the head reads
    R = torch.eye(record[0].shape[-1]).expand(2, -1, -1)
    for a in record:
        R = ((a.mean(1) + torch.eye(a.shape[-1])) / 2) @ R
    if model.global_pool == "seqpool":
        with torch.no_grad():
            tokens = model.forward_features(x)[:, P:]
        w = (tokens @ model.attn_pool.score.weight[0]).softmax(1)
        torch.testing.assert_close(record.pool[:, 0, 0], w)
        expected = (w[:, None] @ R[:, P:, P:])[:, 0]
    elif model.global_pool == "token":
        expected = R[:, 0, P:]
    else:
        expected = R[:, P:, P:].mean(1)
    torch.testing.assert_close(rollout_map(model, x), expected.reshape(2, 4, 4), atol=1e-6, rtol=1e-5)
    pool = "map" if model.global_pool == "seqpool" else model.global_pool
    torch.testing.assert_close(
        attention_rollout(list(record), P, pool=pool, pool_attention=record.pool), expected, atol=1e-6, rtol=1e-5
    )
    batched = attention_attribution(model, x, target=[0, 3])
    singles = torch.cat([attention_attribution(model, x[i : i + 1], target=t) for i, t in enumerate([0, 3])])
    torch.testing.assert_close(batched, singles, atol=1e-6, rtol=1e-4)
    assert batched.shape == (2, 4, 4) and (batched >= 0).all() and batched.sum() > 0


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variant_is_a_model_override_and_its_arguments_are_recorded(name):
    from vit.checkpoints.metadata import model_args

    module = vit.ImageClassifier("vit_tiny_patch4_32", img_size=16, model_overrides={**VARIANTS[name], "depth": 2})
    args = model_args(module.model, module.hparams)
    assert {k: args[k] for k in VARIANTS[name]} == {
        k: list(v) if isinstance(v, tuple) else v for k, v in VARIANTS[name].items()
    }
    rebuilt = vit.VisionTransformer(**args)
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {
        k: v.shape for k, v in module.model.state_dict().items()
    }


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_traces_with_torch_fx_forward_and_backward(name):
    model = _model(**VARIANTS[name]).train()
    x = torch.randn(2, 3, 16, 16)
    graph = torch.fx.symbolic_trace(model)
    grads = []
    for module in (model, graph):
        model.zero_grad()
        module(x).square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n, grad in grads[0].items():
        torch.testing.assert_close(grads[1][n], grad, atol=1e-6, rtol=1e-4)
    # traced again in eval mode: timm's BatchNormAct2d of the conv stem is traced through, its mode baked in
    graph = torch.fx.symbolic_trace(model.eval())
    with torch.no_grad():
        torch.testing.assert_close(graph(x), model(x), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["all", "locality-window", "shifted-patches-stem"])
def test_variants_export_with_torch_export(name):
    model = _model(**VARIANTS[name]).eval()
    x = torch.randn(2, 3, 16, 16)
    program = torch.export.export(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_no_variant_is_described_as_timms_vision_transformer(name):
    from vit.export import timm_model_args

    assert timm_model_args({**vit.models.vision_transformer._DEFAULTS, **SMALL, **VARIANTS[name]}) is None
    assert timm_model_args({**vit.models.vision_transformer._DEFAULTS, **SMALL, "img_size": [16, 16]}) is not None


@pytest.mark.slow
def test_variants_export_to_onnx():
    pytest.importorskip("onnxruntime")
    from vit.export import export_onnx

    model = _model(**VARIANTS["all"], distilled=True).eval()
    assert export_onnx(model, Path(tempfile.mkdtemp()) / "model.onnx") < 1e-5  # worst |Δlogit| against the model
