"""AttnLRP and CP-LRP: the rules against a hand-written ViT with the rules spelled out, conservation, a model worked
by hand, every attention kind and pooling, and the model left exactly as it was (against lxt, the authors' library:
test_lrp_lxt.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vit import VisionTransformer
from vit.explain import lrp
from vit.explain.lrp import relevance_rules
from vit.kernels import neighborhood as neighborhood_kernel
from vit.layers import LinearAttention, NeighborhoodAttention

# ---- an independent ViT, written from the state dict, with each rule written out -------------------------------


def scaled(x: torch.Tensor, s: float) -> torch.Tensor:
    """Value ``x``, gradient times ``s``."""
    return x * s + (x * (1 - s)).detach()


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    c = x - x.mean(-1, keepdim=True)
    std = (c.pow(2).mean(-1, keepdim=True) + eps).sqrt().detach()  # the identity rule: std is a constant
    return c / std * w + b


def identity_rule(x: torch.Tensor, y: torch.Tensor, offset: float = 0.0) -> torch.Tensor:
    """Value ``y``; gradient ``(y - offset) / x``: the constant ``offset`` is a bias."""
    return x * ((y - offset) / x).detach() + offset


def attend(q, k, v, variant, mask=None, feature_map=None, eps=1e-6, logit_scale=None):
    """(B, h, L, d) queries over (B, h, S, d) keys: softmax or linear attention under the rule of ``variant``;
    ``logit_scale (h,)``: locality self-attention (learned scale per head, the diagonal out)."""
    if variant == "cp":
        q, k = q.detach(), k.detach()
    if feature_map is not None:  # linear attention: φ by the identity rule, D constant, 1/3 to each factor
        phi = (lambda t: identity_rule(t, F.elu(t) + 1, 1.0)) if feature_map == "elu" else torch.relu
        fq, fk = phi(q), phi(k)
        if variant == "attnlrp":
            fq, fk, v = scaled(fq, 1 / 3), scaled(fk, 1 / 3), scaled(v, 1 / 3)
        den = (fq @ fk.sum(-2, keepdim=True).transpose(-2, -1) + eps).detach()
        return fq @ (fk.transpose(-2, -1) @ v) / den
    if variant == "attnlrp":
        q, k, v = scaled(q, 0.25), scaled(k, 0.25), scaled(v, 0.5)
    scale = q.shape[-1] ** -0.5 if logit_scale is None else logit_scale[:, None, None]
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if logit_scale is not None:
        scores = scores.masked_fill(torch.eye(scores.shape[-1], dtype=torch.bool), float("-inf"))
    return scores.softmax(-1) @ v


def reference_logits(model: VisionTransformer, x: torch.Tensor, variant: str) -> torch.Tensor:
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    B = x.shape[0]
    H, P, C = model.blocks[0].attn.num_heads, model.num_prefix_tokens, model.embed_dim
    eps = model.blocks[0].norm1.eps
    if hasattr(model.patch_embed, "shift"):  # shifted patch tokens: the image and its four diagonal shifts
        s = model.patch_embed.patch_size[0] // 2
        padded = F.pad(x, (s, s, s, s))
        x = torch.cat(
            [x] + [padded[..., r : r + x.shape[2], c : c + x.shape[3]] for r in (0, 2 * s) for c in (0, 2 * s)], 1
        )
    if model.patch_embed.stem is not None:
        t = F.conv2d(model.patch_embed.stem(x), sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"])
    elif "patch_embed.patch_norm.weight" in sd:
        ps = model.patch_embed.patch_size
        t = F.unfold(x, ps, stride=ps).transpose(1, 2)  # (B, patches, 5C * ph * pw)
        t = layer_norm(t, sd["patch_embed.patch_norm.weight"], sd["patch_embed.patch_norm.bias"], 1e-5)
        t = (t @ sd["patch_embed.proj.weight"].flatten(1).T + sd["patch_embed.proj.bias"]).transpose(1, 2)
    else:
        ps = model.patch_embed.patch_size
        t = F.conv2d(x, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=ps)
    t = t.flatten(2).transpose(1, 2)
    prefix = [sd[n].expand(B, -1, -1) for n in ("cls_token", "reg_token") if n in sd]
    t = torch.cat([*prefix, t + sd["pos_embed"]], 1) if model.no_embed_class else torch.cat([*prefix, t], 1)
    if not model.no_embed_class and "pos_embed" in sd:
        t = t + sd["pos_embed"]

    def heads(z):  # (B, N, C) -> (B, h, N, d)
        return z.view(B, -1, H, C // H).transpose(1, 2)

    def qk_norm(z, name):
        return layer_norm(z, sd[name + ".weight"], sd[name + ".bias"], eps) if name + ".weight" in sd else z

    def mlp(z, pre):
        hidden = z @ sd[pre + "fc1.weight"].T + sd[pre + "fc1.bias"]
        return identity_rule(hidden, F.gelu(hidden)) @ sd[pre + "fc2.weight"].T + sd[pre + "fc2.bias"]

    for i, block in enumerate(model.blocks):
        pre = f"blocks.{i}."
        h = layer_norm(t, sd[pre + "norm1.weight"], sd[pre + "norm1.bias"], eps)
        q, k, v = (h @ sd[pre + "attn.qkv.weight"].T + sd[pre + "attn.qkv.bias"]).chunk(3, -1)
        q, k = qk_norm(heads(q), pre + "attn.q_norm"), qk_norm(heads(k), pre + "attn.k_norm")
        mask = block.attn.dense_mask() if hasattr(block.attn, "dense_mask") else None
        fm = block.attn.feature_map if isinstance(block.attn, LinearAttention) else None
        scale = sd.get(pre + "attn.logit_scale")
        o = attend(q, k, heads(v), variant, mask, fm, logit_scale=scale).transpose(1, 2).reshape(B, -1, C)
        ls1, ls2 = sd.get(pre + "ls1.gamma", 1.0), sd.get(pre + "ls2.gamma", 1.0)  # layer scale
        t = t + ls1 * (o @ sd[pre + "attn.proj.weight"].T + sd[pre + "attn.proj.bias"])
        t = t + ls2 * mlp(layer_norm(t, sd[pre + "norm2.weight"], sd[pre + "norm2.bias"], eps), pre + "mlp.")
    if "norm.weight" in sd:
        t = layer_norm(t, sd["norm.weight"], sd["norm.bias"], eps)
    if model.global_pool == "map":
        pre = "attn_pool."
        lat = sd[pre + "latent"].expand(B, -1, -1)
        q = heads(lat @ sd[pre + "q.weight"].T + sd[pre + "q.bias"])
        k, v = (t[:, P:] @ sd[pre + "kv.weight"].T + sd[pre + "kv.bias"]).chunk(2, -1)
        o = attend(q, heads(k), heads(v), variant).transpose(1, 2).reshape(B, -1, C)
        z = o @ sd[pre + "proj.weight"].T + sd[pre + "proj.bias"]
        z = z + mlp(layer_norm(z, sd[pre + "norm.weight"], sd[pre + "norm.bias"], eps), pre + "mlp.")
        pooled = z.mean(1)
    elif model.global_pool == "seqpool":  # the tokens' weights are a factor: half (AttnLRP) or constant (CP)
        tokens = t[:, P:]
        scores = (tokens.detach() if variant == "cp" else tokens) @ sd["attn_pool.score.weight"].T
        pooled = scores.softmax(1).transpose(1, 2) @ tokens
        pooled = scaled(pooled[:, 0], 0.5) if variant == "attnlrp" else pooled[:, 0]
    elif model.global_pool == "avg":
        pooled = t[:, P:].mean(1)
    else:
        pooled = t[:, 0]
    if "fc_norm.weight" in sd:
        pooled = layer_norm(pooled, sd["fc_norm.weight"], sd["fc_norm.bias"], eps)
    return pooled @ sd["head.weight"].T + sd["head.bias"]


def reference_relevance(model, images, target, variant):
    x = images.clone().requires_grad_(True)
    logits = reference_logits(model, x, variant)
    (grad,) = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), x)
    return (x * grad).sum(1).detach(), logits.detach()


SMALL = dict(img_size=24, patch_size=4, embed_dim=24, depth=2, num_heads=2, num_classes=5)
KINDS = {
    "global-token": dict(),
    "global-avg-no-cls": dict(class_token=False, global_pool="avg"),
    "registers-qknorm-nocls-embed": dict(reg_tokens=2, qk_norm=True, no_embed_class=True),
    "window-shifted": dict(window_size=3, shift_windows=True, reg_tokens=1),
    "sliding": dict(window_size=3, window_type="sliding"),
    "sliding-dilated-explicit": dict(window_size=3, window_type="sliding", window_dilation=2, fused_attn=False),
    "linear-elu": dict(linear_attention=True, global_attn_indexes=(1,)),
    "linear-relu": dict(linear_attention=True, linear_feature_map="relu"),
    "map": dict(global_pool="map", class_token=False, latent_len=2),
    "map-explicit": dict(global_pool="map", reg_tokens=1, fused_attn=False),
    "conv-stem-layerscale": dict(conv_stem=True, init_values=0.5),
    "locality": dict(locality_attention=True, reg_tokens=1),
    "locality-window-explicit": dict(locality_attention=True, window_size=3, shift_windows=True, fused_attn=False),
    "shifted-patches": dict(shifted_patches=True),
    "shifted-patches-conv-stem": dict(shifted_patches=True, conv_stem=True),
    "seqpool": dict(global_pool="seqpool", class_token=False),
}


def build(random_vit, **kwargs):
    model = random_vit(**{**SMALL, **kwargs}).double().eval()
    for module in model.modules():  # a BatchNorm with its own statistics: eval mode really is affine
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)
    return model


@pytest.mark.parametrize("variant", ["attnlrp", "cp"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_rules_match_a_hand_written_vit(random_vit, kind, variant):
    model = build(random_vit, **KINDS[kind])
    images = torch.randn(2, 3, 24, 24, dtype=torch.float64)
    result = lrp(model, images, target=[1, 3], variant=variant)
    expected, ref_logits = reference_relevance(model, images, torch.tensor([1, 3]), variant)
    torch.testing.assert_close(result.logits, ref_logits, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(result.pixels, expected, rtol=1e-7, atol=1e-9)
    assert float(result.pixels.abs().max()) > 1e-3  # a real signal, not zeros on both sides
    torch.testing.assert_close(result.patches.sum((1, 2)), expected.sum((1, 2)))
    assert result.patches.shape == (2, 6, 6) and result.target.tolist() == [1, 3]


def test_the_two_variants_differ(random_vit):
    model = build(random_vit)
    images = torch.randn(2, 3, 24, 24, dtype=torch.float64)
    a, c = lrp(model, images, variant="attnlrp"), lrp(model, images, variant="cp")
    assert (a.pixels - c.pixels).abs().max() > 1e-4 * a.pixels.abs().max()


@pytest.mark.skipif(not neighborhood_kernel.ready(), reason="the CPU neighbourhood kernel cannot be built here")
@pytest.mark.parametrize("variant", ["attnlrp", "cp"])
def test_sliding_cpu_kernel_path_in_float32(random_vit, variant, monkeypatch):
    model = build(random_vit, window_size=3, window_type="sliding", reg_tokens=1)
    calls = []
    original = NeighborhoodAttention.forward_kernel
    monkeypatch.setattr(
        NeighborhoodAttention, "forward_kernel", lambda self, *a, **k: calls.append(1) or original(self, *a, **k)
    )
    images = torch.randn(2, 3, 24, 24, dtype=torch.float64)
    expected, _ = reference_relevance(model, images, torch.tensor([0, 2]), variant)
    result = lrp(model.float(), images.float(), target=[0, 2], variant=variant)
    assert calls, "the float32 CPU forward did not take the kernel path"
    torch.testing.assert_close(result.pixels.double(), expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))


@pytest.mark.parametrize("kind", ["global-token", "linear-relu", "map"])
def test_conservation_without_biases(random_vit, kind):
    """With every bias, token, position embedding and LayerNorm shift at zero the model is positively homogeneous
    under the rules (softmax weights constant in CP-LRP; linear attention's trilinear product under AttnLRP), so the
    relevance sums exactly to the logit."""
    model = build(random_vit, **KINDS[kind])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name in ("cls_token", "reg_token", "pos_embed"):
                p.zero_()
    images = torch.randn(3, 3, 24, 24, dtype=torch.float64)
    variants = ["cp", "attnlrp"] if kind == "linear-relu" else ["cp"]
    for variant in variants:
        result = lrp(model, images, variant=variant)
        logit = result.logits.gather(1, result.target[:, None])[:, 0]
        torch.testing.assert_close(result.pixels.sum((1, 2)), logit, rtol=1e-9, atol=1e-10)


def test_relevance_worked_by_hand():
    """Blocks that add nothing (zero output projections): logit = wᵀ γ ⊙ centre(m)/σ + const with m the mean patch
    embedding; with σ constant the relevance of a pixel is its value times w's path back through the embedding."""
    torch.manual_seed(0)
    model = VisionTransformer(
        img_size=8, patch_size=4, in_chans=2, embed_dim=6, depth=1, num_heads=2, num_classes=3,
        class_token=False, global_pool="avg", pos_embed="none",
    ).double().eval()  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
        for layer in (model.blocks[0].attn.proj, model.blocks[0].mlp.fc2):
            layer.weight.zero_()
            layer.bias.zero_()
    images = torch.randn(2, 2, 8, 8, dtype=torch.float64)
    x = images.numpy()
    W = model.patch_embed.proj.weight.detach().numpy().reshape(6, -1)  # (C, 2 * 4 * 4)
    b = model.patch_embed.proj.bias.detach().numpy()
    gamma, eps = model.fc_norm.weight.detach().numpy(), model.fc_norm.eps
    head = model.head.weight.detach().numpy()
    patches = x.reshape(2, 2, 2, 4, 2, 4).transpose(0, 2, 4, 1, 3, 5).reshape(2, 4, 32)  # (B, patch, pixels)
    m = (patches @ W.T + b).mean(1)  # (B, C)
    sigma = np.sqrt(m.var(1, keepdims=True) + eps)
    for variant in ("attnlrp", "cp"):
        result = lrp(model, images, target=2, variant=variant)
        g = head[2] * gamma / sigma  # (B, C): gradient at the centred mean
        g = g - g.mean(1, keepdims=True)  # the centring's adjoint
        relevance = patches * (g @ W)[:, None, :] / 4  # (B, patch, pixels)
        expected = relevance.reshape(2, 2, 2, 2, 4, 4).transpose(0, 3, 1, 4, 2, 5).reshape(2, 2, 8, 8).sum(1)
        np.testing.assert_allclose(result.pixels.numpy(), expected, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(result.patches.numpy(), relevance.sum(2).reshape(2, 2, 2), rtol=1e-10)


def test_a_batch_equals_its_images_one_by_one(random_vit):
    model = build(random_vit, window_size=3, window_type="sliding", reg_tokens=1)
    images = torch.randn(3, 3, 24, 24, dtype=torch.float64)
    batch = lrp(model, images, target=[4, 0, 2])
    for i, t in enumerate([4, 0, 2]):
        single = lrp(model, images[i : i + 1], target=t)
        torch.testing.assert_close(batch.pixels[i : i + 1], single.pixels, rtol=1e-10, atol=1e-12)


def test_target_none_explains_the_prediction(random_vit):
    model = build(random_vit)
    images = torch.randn(3, 3, 24, 24, dtype=torch.float64)
    result = lrp(model, images)
    assert result.target.tolist() == model(images).argmax(1).tolist()
    with pytest.raises(ValueError, match="out of range"):
        lrp(model, images, target=7)
    with pytest.raises(ValueError, match="variant must be one of"):
        lrp(model, images, variant="lrp-eps")


def test_identity_rule_is_finite_at_zero():
    """A GELU input of exactly 0 (a zero image through bias-free layers) gives a zero, finite gradient."""
    model = VisionTransformer(**SMALL, qkv_bias=False).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    result = lrp(model, torch.zeros(1, 3, 24, 24, dtype=torch.float64), target=0)
    assert torch.isfinite(result.pixels).all()


def snapshot(model):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        {n: m.training for n, m in model.named_modules()},
        {n: p.requires_grad for n, p in model.named_parameters()},
    )


def test_model_left_exactly_as_it_was(random_vit):
    model = build(random_vit, global_pool="map", reg_tokens=1, linear_attention=True, global_attn_indexes=(0,))
    model.train()
    model.blocks[1].eval()
    model.blocks[0].attn.qkv.weight.requires_grad_(False)
    before = snapshot(model)
    lrp(model, torch.randn(2, 3, 24, 24, dtype=torch.float64), variant="attnlrp")
    lrp(model, torch.randn(2, 3, 24, 24, dtype=torch.float64), variant="cp")
    state, flags, grads = snapshot(model)
    assert flags == before[1] and grads == before[2]
    for key, value in before[0].items():
        assert torch.equal(state[key], value), key
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks and not module._backward_hooks
    assert all(p.grad is None for p in model.parameters())


def test_hooks_removed_on_error_and_no_stacking(random_vit):
    model = build(random_vit)
    with pytest.raises(ValueError, match="out of range"):
        lrp(model, torch.randn(1, 3, 24, 24, dtype=torch.float64), target=99)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    with relevance_rules(model), pytest.raises(RuntimeError, match="already being explained"):
        lrp(model, torch.randn(1, 3, 24, 24, dtype=torch.float64))
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_two_models_in_two_threads(random_vit):
    models = [build(random_vit), build(random_vit, linear_attention=True)]
    images = torch.randn(2, 3, 24, 24, dtype=torch.float64)
    alone = [lrp(m, images).pixels for m in models]
    together: dict[int, torch.Tensor] = {}

    def run(i):
        for _ in range(3):
            together[i] = lrp(models[i], images).pixels

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        torch.testing.assert_close(together[i], alone[i], rtol=0, atol=0)


@pytest.mark.parametrize("mlp", ["GluMlp", "SwiGLUPacked", "SwiGLU", "GatedMlp"])
def test_a_gated_mlp_is_refused_by_name(random_vit, mlp):
    import timm.layers

    from vit.layers import Block

    model = build(random_vit)
    gated = Block(model.embed_dim, num_heads=2, qkv_bias=True, mlp_layer=getattr(timm.layers, mlp)).double()
    model.blocks[1] = gated
    images = torch.randn(1, 3, 24, 24, dtype=torch.float64)
    kind = "GluMlp" if mlp == "SwiGLUPacked" else mlp  # timm's SwiGLUPacked is a GluMlp
    with pytest.raises(ValueError, match=rf"^blocks\.1\.mlp is a {kind}, a gated MLP .* use a Block with timm's Mlp"):
        lrp(model, images)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    with pytest.raises(ValueError, match=rf"blocks\.1\.mlp is a {kind}"):
        lrp(model, images, variant="cp")


def test_dynamic_img_pad_sums_the_padded_grid(random_vit):
    """A 26x26 input on 8x8 patches: the model pads it to 32x32 with zeros, so its relevance is that of the image
    padded by hand (the padding has no relevance: it is zero), and the patch sums cover the 4x4 padded grid."""
    model = build(random_vit, img_size=24, patch_size=8, dynamic_img_size=True, dynamic_img_pad=True)
    images = torch.randn(2, 3, 26, 26, dtype=torch.float64)
    padded = F.pad(images, (0, 6, 0, 6))
    for variant in ("attnlrp", "cp"):
        got, want = lrp(model, images, variant=variant), lrp(model, padded, variant=variant)
        torch.testing.assert_close(got.logits, want.logits)
        torch.testing.assert_close(got.pixels, want.pixels[:, :26, :26])
        assert want.pixels[:, 26:].abs().max() == 0 and want.pixels[:, :, 26:].abs().max() == 0
        assert got.patches.shape == (2, 4, 4)
        torch.testing.assert_close(got.patches, want.patches)
        by_loop = torch.stack([want.pixels[:, 8 * r : 8 * r + 8, 8 * c : 8 * c + 8].sum((1, 2)) for r in range(4)
                               for c in range(4)], 1).reshape(2, 4, 4)  # fmt: skip
        torch.testing.assert_close(got.patches, by_loop)


def test_dynamic_img_size_at_another_size_matches_the_reference(random_vit):
    model = build(random_vit, img_size=24, patch_size=8, dynamic_img_size=True)
    images = torch.randn(2, 3, 40, 32, dtype=torch.float64)
    result = lrp(model, images)
    torch.testing.assert_close(result.logits, model(images))
    assert result.patches.shape == (2, 5, 4)
    torch.testing.assert_close(result.patches.sum((1, 2)), result.pixels.sum((1, 2)))
    torch.testing.assert_close(result.patches[:, 4, 3], result.pixels[:, 32:40, 24:32].sum((1, 2)))
