"""CrossAttention and AttentionPoolLatent: an explicit reference with loops, key masks, fused/explicit parity, timm."""

from __future__ import annotations

import math

import pytest
import torch
from timm.layers import AttentionPoolLatent as TimmAttentionPoolLatent

from vit.layers import AttentionPoolLatent, CrossAttention


@torch.no_grad()
def reference(layer: CrossAttention, queries: torch.Tensor, context: torch.Tensor, key_mask=None) -> torch.Tensor:
    """Per head, per query: softmax over the allowed keys of q·k/√d, weighted sum of the values, then proj."""
    B, S, C = context.shape
    L = queries.shape[1]
    H, d = layer.num_heads, C // layer.num_heads
    q = queries @ layer.q.weight.T + layer.q.bias
    kv = context @ layer.kv.weight.T + layer.kv.bias
    k, v = kv[..., :C], kv[..., C:]
    out = torch.zeros(B, L, C, dtype=context.dtype)
    for b in range(B):
        for h in range(H):
            sl = slice(h * d, (h + 1) * d)
            for i in range(L):
                scores = [float(q[b, i, sl] @ k[b, j, sl]) / math.sqrt(d) for j in range(S)]
                allowed = [j for j in range(S) if key_mask is None or bool(key_mask[b, j])]
                top = max(scores[j] for j in allowed)
                weights = {j: math.exp(scores[j] - top) for j in allowed}
                total = sum(weights.values())
                out[b, i, sl] = sum(w / total * v[b, j, sl] for j, w in weights.items())
    return out @ layer.proj.weight.T + layer.proj.bias


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_cross_attention_matches_reference(fused, masked):
    torch.manual_seed(0)
    layer = CrossAttention(12, num_heads=3, fused_attn=fused).double().eval()
    queries, context = torch.randn(2, 3, 12).double(), torch.randn(2, 5, 12).double()
    key_mask = torch.tensor([[True, False, True, True, False], [False, False, False, False, True]]) if masked else None
    out = layer(queries, context, key_mask)
    torch.testing.assert_close(out, reference(layer, queries, context, key_mask), rtol=1e-9, atol=1e-10)
    attn = layer.attention_weights(queries, context, key_mask)
    assert attn.shape == (2, 3, 3, 5)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 3, 3, dtype=torch.float64))
    if masked:
        assert (attn[~key_mask[:, None, None, :].expand_as(attn)] == 0).all()
    torch.testing.assert_close(layer.apply_weights(attn, context), out, rtol=1e-9, atol=1e-10)


def test_learned_queries_broadcast_over_the_batch():
    layer = CrossAttention(8, num_heads=2).eval()
    latent, context = torch.randn(1, 2, 8), torch.randn(3, 4, 8)
    assert layer(latent, context).shape == (3, 2, 8)
    torch.testing.assert_close(layer(latent, context)[1], layer(latent, context[1:2])[0])
    with pytest.raises(ValueError, match=r"key_mask must have shape \(B, S\)"):
        layer(latent, context, torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="not divisible"):
        CrossAttention(10, num_heads=3)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_attention_pool_matches_timm(fused, qk_norm):
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm
    theirs = TimmAttentionPoolLatent(32, num_heads=4, mlp_ratio=2.0, qk_norm=qk_norm, norm_layer=norm).eval()
    ours = AttentionPoolLatent(32, num_heads=4, mlp_ratio=2.0, qk_norm=qk_norm, norm_layer=norm, fused_attn=fused)
    ours.eval().load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(3, 10, 32)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=1e-5)
    assert ours.attention_weights(x).shape == (3, 4, 1, 10)


def test_several_latents_are_averaged_and_each_gets_a_gradient():
    torch.manual_seed(0)
    pool = AttentionPoolLatent(16, num_heads=2, latent_len=3)
    x = torch.randn(2, 6, 16)
    latents = pool.apply_weights(pool.attention_weights(x), x)  # (B, 3, C)
    expected = (latents + pool.mlp(pool.norm(latents))).mean(dim=1)
    torch.testing.assert_close(pool(x), expected)
    pool(x).sum().backward()
    assert (pool.latent.grad.abs().sum(dim=-1) > 0).all()
    with pytest.raises(ValueError, match="latent_len must be >= 1"):
        AttentionPoolLatent(16, latent_len=0)
