"""Chefer et al. attribution: the rule on a hand-written example, parity with an independent per-image loop."""

from __future__ import annotations

import pytest
import torch

from vit import VisionTransformer
from vit.explain.attribution import attention_attribution, relevance_from_gradients


def test_two_blocks_by_hand():
    # N = 3 tokens (class, p1, p2), two heads. Block 1, head 0: ∇A ⊙ A = [[1, -1, 0], [0, 1, 0], [0, 0, -1]],
    # positive part [[1, 0, 0], [0, 1, 0], [0, 0, 0]]; head 1: [[0, 1, 2], 0, 0]. Mean: [[.5, .5, 1], [0, .5, 0], 0].
    a1 = torch.tensor([[[0.5, 0.5, 0], [0, 1, 0], [0, 0, 1]], [[0, 0.5, 0.5], [0.5, 0.5, 0], [0, 0.5, 0.5]]])
    g1 = torch.tensor([[[2.0, -2, 1], [0, 1, 0], [0, 0, -1]], [[0, 2, 4], [0, 0, 0], [0, 0, 0]]])
    # Block 2: the heads' products at [0, 1] are +1 and -1; the positive part is taken before the mean, so 0.5.
    a2 = torch.tensor([[0.0, 1, 0], [0, 1, 0], [0, 0, 1]]).expand(2, 3, 3)
    g2 = torch.zeros(2, 3, 3)
    g2[0, 0, 1], g2[1, 0, 1] = 1.0, -1.0
    # R1 = I + Ā1 = [[1.5, .5, 1], [0, 1.5, 0], [0, 0, 1]];  R2 = R1 + Ā2 R1, Ā2 R1 = [[0, .75, 0], 0, 0].
    # Class row [1.5, 1.25, 1] -> patches [1.25, 1]; patch rows [[1.5, 0], [0, 1]] -> mean [0.75, 0.5].
    attentions, gradients = [a1[None], a2[None]], [g1[None], g2[None]]
    token = relevance_from_gradients(attentions, gradients, num_prefix_tokens=1, pool="token")
    torch.testing.assert_close(token, torch.tensor([[1.25, 1.0]]))
    avg = relevance_from_gradients(attentions, gradients, num_prefix_tokens=1, pool="avg")
    torch.testing.assert_close(avg, torch.tensor([[0.75, 0.5]]))


def test_relevance_rejects_bad_arguments():
    a = torch.rand(1, 2, 3, 3)
    with pytest.raises(ValueError, match="one gradient per attention"):
        relevance_from_gradients([a], [])
    with pytest.raises(ValueError, match="must match"):
        relevance_from_gradients([a], [torch.rand(1, 2, 4, 4)])
    with pytest.raises(ValueError, match="needs a class token"):
        relevance_from_gradients([a], [a], num_prefix_tokens=0, pool="token")


def reference_attribution(model: VisionTransformer, image: torch.Tensor, target: int) -> torch.Tensor:
    """One image: ∂y/∂A as the Jacobian of the logit w.r.t. an offset added to every block's A, then the rule with
    loops over blocks and heads. The forward pass is written out here; A comes from ``attention_weights``."""
    P = model.num_prefix_tokens
    blocks = list(model.blocks)

    def logit(*offsets: torch.Tensor) -> torch.Tensor:
        x = model._pos_embed(model.patch_embed(image[None]))
        for block, offset in zip(blocks, offsets, strict=True):
            h = block.norm1(x)
            N, C = h.shape[1], h.shape[2]
            heads = block.attn.num_heads
            weights = block.attn.attention_weights(h)[0] + offset  # (heads, N, N)
            v = block.attn.qkv(h)[0, :, 2 * C :].reshape(N, heads, C // heads).transpose(0, 1)  # (heads, N, hd)
            mixed = torch.cat([weights[i] @ v[i] for i in range(heads)], dim=1)  # (N, C), heads side by side
            x = x + block.ls1(block.attn.proj(mixed[None]))
            x = x + block.ls2(block.mlp(block.norm2(x)))
        return model.forward_head(model.norm(x))[0, target]

    with torch.no_grad():
        weights, x = [], model._pos_embed(model.patch_embed(image[None]))
        for block in blocks:
            weights.append(block.attn.attention_weights(block.norm1(x))[0])
            x = block(x)
    gradients = torch.autograd.functional.jacobian(logit, tuple(torch.zeros_like(w) for w in weights))
    N = weights[0].shape[-1]
    R = torch.eye(N, dtype=torch.float64)
    for A, G in zip(weights, gradients, strict=True):
        heads = A.shape[0]
        fused = sum(torch.clamp(G[i] * A[i], min=0) for i in range(heads)) / heads
        R = R + fused @ R
    row = R[0, P:] if model.global_pool == "token" else R[P:, P:].mean(dim=0)
    rows, cols = model.patch_embed.grid_size
    return row.reshape(rows, cols)


CASES = {
    "global": dict(img_size=16, patch_size=4),
    "window-registers-nonsquare": dict(
        img_size=(12, 20), patch_size=4, reg_tokens=2, window_size=2, shift_windows=True, depth=3
    ),
    "avg-no-class-token": dict(img_size=(8, 12), patch_size=4, class_token=False, global_pool="avg", window_size=2),
    "sliding": dict(img_size=(12, 16), patch_size=4, window_size=3, window_type="sliding"),
}


def make_model(case: str, seed: int = 0, **extra) -> VisionTransformer:
    torch.manual_seed(seed)
    kwargs = dict(num_classes=5, embed_dim=16, depth=2, num_heads=2) | CASES[case] | extra
    model = VisionTransformer(**kwargs).double().eval()
    with torch.no_grad():  # larger than the 0.02 init, so that attention is far from uniform
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_matches_independent_per_image_loop(case):
    model = make_model(case)
    rows, cols = model.patch_embed.grid_size
    images = torch.randn(3, 3, rows * 4, cols * 4, dtype=torch.float64)
    targets = [1, 4, 0]
    maps = attention_attribution(model, images, target=targets)
    assert maps.shape == (3, rows, cols) and maps.dtype == torch.float64
    for image, target, got in zip(images, targets, maps, strict=True):
        torch.testing.assert_close(got, reference_attribution(model, image, target), rtol=1e-9, atol=1e-12)
    # The maps differ between classes (a class-agnostic method would give one map).
    assert not torch.allclose(attention_attribution(model, images, target=[2, 2, 2]), maps)


@pytest.mark.parametrize("fused", [True, False])
def test_batched_equals_per_image_and_default_target_is_prediction(fused):
    model = make_model("window-registers-nonsquare", fused_attn=fused)
    images = torch.randn(4, 3, 12, 20, dtype=torch.float64)
    preds = model(images).argmax(-1)
    batched = attention_attribution(model, images)
    torch.testing.assert_close(batched, attention_attribution(model, images, target=preds))
    one_by_one = torch.cat([attention_attribution(model, image[None]) for image in images])
    torch.testing.assert_close(batched, one_by_one, rtol=1e-10, atol=1e-12)


def test_float32_model_and_frozen_parameters():
    model = make_model("global").float()
    model.requires_grad_(False)
    images = torch.randn(2, 3, 16, 16)
    maps = attention_attribution(model, images, target=torch.tensor([3, 3]))
    assert maps.dtype == torch.float32 and torch.isfinite(maps).all() and maps.sum() > 0
    expected = reference_attribution(model.double(), images[0].double(), 3)
    torch.testing.assert_close(maps[0].double(), expected, rtol=1e-4, atol=1e-6)


def test_leaves_model_untouched():
    model = make_model("window-registers-nonsquare").train()
    model.blocks[1].eval()
    model.blocks[0].attn.fused_attn = False
    flags = {name: m.training for name, m in model.named_modules()}
    fused = [block.attn.fused_attn for block in model.blocks]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    attention_attribution(model, torch.randn(2, 3, 12, 20, dtype=torch.float64))
    assert {name: m.training for name, m in model.named_modules()} == flags
    assert [block.attn.fused_attn for block in model.blocks] == fused
    assert all(p.grad is None for p in model.parameters())
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k


def test_bad_targets():
    model = make_model("global")
    images = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"target class 5 out of range: the model has 5 classes \(0..4\)"):
        attention_attribution(model, images, target=[0, 5])
    with pytest.raises(ValueError, match="target class -1 out of range"):
        attention_attribution(model, images, target=[-1, 0])
    with pytest.raises(ValueError, match="3 class indices for 2 images"):
        attention_attribution(model, images, target=[0, 1, 2])
    assert all(not m._forward_hooks for m in model.modules())


def test_refuses_dense_weights_that_do_not_match_the_output():
    model = make_model("global")
    attn = model.blocks[1].attn
    attn.attention_weights = lambda x, mask=None: torch.full(
        (x.shape[0], attn.num_heads, x.shape[1], x.shape[1]), 1.0 / x.shape[1], dtype=x.dtype
    )
    with pytest.raises(RuntimeError, match=r"blocks\[1\]\.attn: its dense attention_weights do not reproduce"):
        attention_attribution(model, torch.randn(1, 3, 16, 16, dtype=torch.float64))
    assert all(not m._forward_hooks for m in model.modules())
