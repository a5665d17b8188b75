"""LinearAttention: the formula written out, Attention's parameters, memory linear in tokens, capture."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vit
from vit.bench.memory import peak_bytes
from vit.explain import attention_attribution, attention_statistics, capture_attention
from vit.layers import Attention, LinearAttention


def reference(layer: LinearAttention, x: torch.Tensor, feature_map: str) -> torch.Tensor:
    """out_i = φ(q_i)ᵀ(Σ_j φ(k_j) v_jᵀ) / (φ(q_i)ᵀ Σ_j φ(k_j) + eps), per head, with loops over heads and queries."""
    B, N, C = x.shape
    H = layer.num_heads
    d = C // H
    qkv = x @ layer.qkv.weight.T + (layer.qkv.bias if layer.qkv.bias is not None else 0)
    q, k, v = qkv[..., :C], qkv[..., C : 2 * C], qkv[..., 2 * C :]
    out = torch.zeros(B, N, C, dtype=x.dtype)
    for h in range(H):
        qh, kh, vh = (t[..., h * d : (h + 1) * d] for t in (q, k, v))  # (B, N, d)
        qh, kh = layer.q_norm(qh), layer.k_norm(kh)
        phi = (lambda t: F.elu(t) + 1) if feature_map == "elu" else torch.relu
        fq, fk = phi(qh), phi(kh)
        for b in range(B):
            s = sum(torch.outer(fk[b, j], vh[b, j]) for j in range(N))  # (d, d)
            z = fk[b].sum(dim=0)  # (d,)
            for i in range(N):
                out[b, i, h * d : (h + 1) * d] = (fq[b, i] @ s) / (fq[b, i] @ z + layer.eps)
    return out @ layer.proj.weight.T + layer.proj.bias


@pytest.mark.parametrize("feature_map", ["elu", "relu"])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_forward_and_backward_match_the_formula_in_float64(feature_map, qk_norm):
    torch.manual_seed(0)
    layer = LinearAttention(12, num_heads=3, qkv_bias=True, qk_norm=qk_norm, feature_map=feature_map).double()
    if qk_norm:  # non-trivial norm parameters, so they are really applied
        for norm in (layer.q_norm, layer.k_norm):
            torch.nn.init.normal_(norm.weight)
            torch.nn.init.normal_(norm.bias)
    x = torch.randn(2, 7, 12, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 7, 12, dtype=torch.float64)
    ours = layer(x)
    expected = reference(layer, x, feature_map)
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)
    params = [x, *layer.parameters()]
    got = torch.autograd.grad(ours, params, grad)
    want = torch.autograd.grad(expected, params, grad)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11)
    # The implied matrix reproduces the output and its rows sum to 1 up to eps.
    attn = layer.attention_weights(x)
    v = layer.split_qkv(layer.qkv(x))[2]
    dense = layer.proj((attn @ v).transpose(1, 2).reshape(2, 7, 12))
    torch.testing.assert_close(dense, ours, rtol=1e-10, atol=1e-12)
    assert attn.shape == (2, 3, 7, 7) and (attn >= 0).all()
    # Rows sum to 1 up to eps; with ReLU a query whose features are all zero gets a zero row (and output 0).
    fq = layer.phi(layer.split_qkv(layer.qkv(x))[0])
    expected_sums = (fq.sum(-1) > 0).to(torch.float64)
    torch.testing.assert_close(attn.sum(-1), expected_sums, atol=1e-4, rtol=0)


def test_relu_query_without_features_gives_zero_not_nan():
    layer = LinearAttention(4, num_heads=1, feature_map="relu").double()
    with torch.no_grad():
        layer.qkv.weight.zero_()
        layer.qkv.weight[8:] = torch.eye(4)  # v = x, q = k = 0: φ = 0 everywhere
    out = layer(torch.randn(1, 5, 4, dtype=torch.float64))
    torch.testing.assert_close(out, layer.proj.bias.expand(1, 5, 4))


def test_attention_state_dict_loads_strictly_both_ways():
    softmax = Attention(32, num_heads=4, qkv_bias=True, qk_norm=True)
    linear = LinearAttention(32, num_heads=4, qkv_bias=True, qk_norm=True)
    assert linear.load_state_dict(softmax.state_dict(), strict=True).missing_keys == []
    softmax.load_state_dict(linear.state_dict(), strict=True)
    assert [n for n, _ in linear.named_parameters()] == [n for n, _ in softmax.named_parameters()]


def test_bad_arguments():
    with pytest.raises(ValueError, match="feature_map must be 'elu' or 'relu'"):
        LinearAttention(8, 2, feature_map="softmax")
    with pytest.raises(ValueError, match="attn_drop 0.1 needs an attention matrix"):
        LinearAttention(8, 2, attn_drop=0.1)
    with pytest.raises(ValueError, match="takes no attn_mask"):
        LinearAttention(8, 2)(torch.randn(1, 3, 8), torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="linear_attention and window_size 4"):
        vit.VisionTransformer(img_size=16, patch_size=4, linear_attention=True, window_size=4)


def _peak(layer: torch.nn.Module, tokens: int) -> int:
    x = torch.randn(1, tokens, 32, requires_grad=True)

    def step() -> None:
        layer(x).sum().backward()

    return peak_bytes(step, torch.device("cpu"))


def test_memory_grows_linearly_from_1k_to_4k_tokens():
    # Bytes of every tensor the forward + backward allocates (a dispatch-mode tracker, deterministic): 4x the tokens
    # cost about 4x the memory for linear attention, against about 16x for the explicit softmax (its N x N weights).
    torch.manual_seed(0)
    linear = LinearAttention(32, num_heads=2)
    softmax = Attention(32, num_heads=2, fused_attn=False)
    linear_growth = _peak(linear, 4096) / _peak(linear, 1024)
    softmax_growth = _peak(softmax, 4096) / _peak(softmax, 1024)
    assert 3.5 <= linear_growth <= 4.5, linear_growth
    assert softmax_growth >= 12, softmax_growth
    assert _peak(linear, 4096) < 4096 * 4096 * 4  # less than one float32 N x N matrix in all


def test_model_argument_selects_linear_blocks_outside_global_attn_indexes(tiny_vit):
    model = tiny_vit(
        img_size=16,
        depth=3,
        num_classes=1000,
        linear_attention=True,
        linear_feature_map="relu",
        global_attn_indexes=(1,),
    )
    kinds = [type(block.attn) for block in model.blocks]
    assert kinds == [LinearAttention, Attention, LinearAttention]
    assert model.attention_kinds() == ["linear", "global", "linear"]
    assert model.blocks[0].attn.feature_map == "relu"
    preset = vit.create_model("vit_tiny_linear_patch4_32")
    assert [i for i, b in enumerate(preset.blocks) if not isinstance(b.attn, LinearAttention)] == [2, 5, 8, 11]
    # Same parameters as the softmax preset: its weights load strictly.
    preset.load_state_dict(vit.create_model("vit_tiny_patch4_32").state_dict(), strict=True)


def test_capture_and_statistics_of_a_linear_model(tiny_vit):
    torch.manual_seed(0)
    model = tiny_vit(img_size=16, num_classes=5, linear_attention=True, global_attn_indexes=(1,)).eval()
    x = torch.randn(2, 3, 16, 16)
    attentions = capture_attention(model, x)
    assert [a.shape for a in attentions] == [(2, 2, 17, 17)] * 2
    torch.testing.assert_close(attentions[0].sum(-1), torch.ones(2, 2, 17), atol=1e-4, rtol=0)
    # The captured matrix is the one the block applies: recompute the first block's output from it.
    block = model.blocks[0]
    with torch.no_grad():
        tokens = block.norm1(model._pos_embed(model.patch_embed(x)))
        v = block.attn.split_qkv(block.attn.qkv(tokens))[2]
        dense = block.attn.proj((attentions[0] @ v).transpose(1, 2).reshape(2, 17, 32))
        torch.testing.assert_close(dense, block.attn(tokens), atol=1e-5, rtol=1e-5)
    stats = attention_statistics(attentions, (4, 4), (4, 4), 1)
    assert stats["entropy"].shape == (2, 2) and stats["distance"].shape == (2, 2)
    assert (stats["entropy"] > 0).all() and (stats["entropy"] <= torch.log(torch.tensor(17.0)) + 1e-4).all()
    relevance = attention_attribution(model, x)  # the hook's dense weights reproduce the linear blocks
    assert relevance.shape == (2, 4, 4) and torch.isfinite(relevance).all()


def test_attention_suite_linear_rows_and_checks():
    # The suite's linear rows (--linear_maps), without the window and sliding rows.
    from vit.bench.cli import main

    report = main(
        ["--suite", "attention", "--device", "cpu", "--attn_grids", "4", "6", "--window_sizes", "--sliding_sizes"]
        + ["--linear_maps", "elu", "relu", "--attn_dim", "16", "--attn_heads", "2", "--attn_tokens", "64"]
        + ["--attn_reps", "1"]
    )
    rows = report["attention"]["results"]
    assert [(r["grid"], r["layer"]) for r in rows] == [
        (g, name) for g in (4, 6) for name in ("global", "linear elu", "linear relu")
    ]
    assert all(r["kib_per_token"] > 0 for r in rows)
    names = [c["name"].split(":")[0] for c in report["attention"]["checks"]]
    assert names == ["linear elu", "linear relu"]  # flatness only: no 64x64 grid here


def test_normaliser_is_a_hookable_parameter_free_module():
    """Explanation rules reach the division through ``layer.normalise``: a pre-hook that detaches the denominator
    keeps the output and changes only the gradient; the state dict stays Attention's."""
    torch.manual_seed(0)
    layer = LinearAttention(12, num_heads=3).double()
    assert list(layer.state_dict()) == list(Attention(12, num_heads=3).state_dict())
    x = torch.randn(2, 5, 12, dtype=torch.float64, requires_grad=True)
    out = layer(x)
    (plain,) = torch.autograd.grad(out.sum(), x)
    seen = []

    def detach_denominator(module, args):
        seen.append(args[1].shape)
        return args[0], args[1].detach()

    handle = layer.normalise.register_forward_pre_hook(detach_denominator)
    try:
        hooked = layer(x)
        (detached,) = torch.autograd.grad(hooked.sum(), x)
    finally:
        handle.remove()
    assert seen == [(2, 3, 5, 1)]
    torch.testing.assert_close(hooked, out, rtol=0, atol=0)
    assert not torch.allclose(detached, plain)
