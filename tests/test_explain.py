"""vit.explain against references built here: manual softmax(QKᵀ/√d) from each block's own weights, window
patterns from loops over grid coordinates, rollout by explicit loops and written-out numbers, ViT's attention
distance by hand (matplotlib's jet and the overlays: test_overlay.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import vit
import vit.layers.attention as attention_module
from vit import VisionTransformer
from vit.explain import (
    attention_distance,
    attention_entropy,
    attention_rollout,
    attention_statistics,
    capture_attention,
    detect_collapse,
    rollout_map,
)

CONFIG = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=5, mlp_ratio=2.0)
# Blocks: 0 = window (no shift), 1 = window shifted by 2, 2 = global.
WINDOW = dict(CONFIG, img_size=32, patch_size=4, window_size=4, shift_windows=True, global_attn_indexes=(2,))


@pytest.fixture
def make_model(random_vit):
    """A tiny ViT (:data:`CONFIG`) with random attention (conftest's ``random_vit``)."""
    return lambda **overrides: random_vit(**{**CONFIG, **overrides})


@pytest.fixture
def window_model(random_vit):
    """A tiny ViT with window, shifted-window and global blocks (:data:`WINDOW`)."""
    return lambda **overrides: random_vit(**{**WINDOW, **overrides})


def images_for(model: VisionTransformer, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, *model.patch_embed.img_size)


def explicit_window_pattern(rows: int, cols: int, w: int, shift: int | None, prefix: int) -> torch.Tensor:
    """(N, N) allowed pattern by loops: same window r//w, c//w, or with a shift the same band (r - s + w)//w."""
    n = prefix + rows * cols
    allowed = torch.ones(n, n, dtype=torch.bool)
    if shift is None:  # global block
        return allowed
    for r1 in range(rows):
        for c1 in range(cols):
            for r2 in range(rows):
                for c2 in range(cols):
                    if shift == 0:
                        same = r1 // w == r2 // w and c1 // w == c2 // w
                    else:
                        same = (r1 - shift + w) // w == (r2 - shift + w) // w and (c1 - shift + w) // w == (
                            c2 - shift + w
                        ) // w
                    allowed[prefix + r1 * cols + c1, prefix + r2 * cols + c2] = same
    return allowed


def manual_attention(model: VisionTransformer, images: torch.Tensor, patterns: list[torch.Tensor]) -> list:
    """softmax(QKᵀ/√d) per block from qkv weights split by hand, block inputs from running the model by hand."""
    model.eval()
    reference = []
    with torch.no_grad():
        x = model._pos_embed(model.patch_embed(images))
        for block, allowed in zip(model.blocks, patterns, strict=True):
            B, N, C = x.shape
            heads = block.attn.num_heads
            d = C // heads
            qkv = block.norm1(x) @ block.attn.qkv.weight.T + block.attn.qkv.bias  # (B, N, 3C): q | k | v
            q = qkv[..., :C].reshape(B, N, heads, d).transpose(1, 2)  # (B, heads, N, d)
            k = qkv[..., C : 2 * C].reshape(B, N, heads, d).transpose(1, 2)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
            scores = scores.masked_fill(~allowed, float("-inf"))
            reference.append(scores.softmax(dim=-1))
            x = block(x)
    return reference


def model_state(model: nn.Module) -> dict:
    return {
        "training": {name: m.training for name, m in model.named_modules()},
        "fused": {name: m.fused_attn for name, m in model.named_modules() if hasattr(m, "fused_attn")},
        "params": {k: v.clone() for k, v in model.state_dict().items()},
    }


def assert_state_equal(model: nn.Module, before: dict) -> None:
    after = model_state(model)
    assert after["training"] == before["training"]
    assert after["fused"] == before["fused"]
    assert after["params"].keys() == before["params"].keys()
    for key, value in before["params"].items():
        assert torch.equal(after["params"][key], value), key
    for name, m in model.named_modules():
        assert not m._forward_pre_hooks and not m._forward_hooks, f"hook left on {name or 'model'}"


# --------------------------------------------------------------------------------------------------- capture


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("reg_tokens", [0, 2])
def test_capture_equals_manual_softmax_global(make_model, fused, reg_tokens):
    model = make_model(fused_attn=fused, reg_tokens=reg_tokens)
    images = images_for(model, 3)
    n = model.num_prefix_tokens + model.patch_embed.num_patches
    reference = manual_attention(model, images, [torch.ones(n, n, dtype=torch.bool)] * 3)
    captured = capture_attention(model, images)
    assert len(captured) == 3
    for got, want in zip(captured, reference, strict=True):
        assert got.shape == (3, 2, n, n)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got.sum(-1), torch.ones(3, 2, n))
    assert captured[0].std() > 0.01  # not near-uniform, so the comparison means something


@pytest.mark.parametrize(
    ("img_size", "reg_tokens", "class_token"),
    [((32, 32), 0, True), ((24, 40), 1, True), ((32, 32), 1, False)],  # (24, 40): 6 x 10 grid, padded windows
)
def test_capture_equals_manual_softmax_window(window_model, img_size, reg_tokens, class_token):
    pool = "token" if class_token else "avg"
    model = window_model(img_size=img_size, reg_tokens=reg_tokens, class_token=class_token, global_pool=pool)
    rows, cols = img_size[0] // 4, img_size[1] // 4
    prefix = int(class_token) + reg_tokens
    patterns = [explicit_window_pattern(rows, cols, 4, shift, prefix) for shift in (0, 2, None)]
    assert [blk.attn.shift if hasattr(blk.attn, "shift") else None for blk in model.blocks] == [0, 2, None]
    images = images_for(model)
    reference = manual_attention(model, images, patterns)
    captured = capture_attention(model, images)
    for got, want, allowed in zip(captured, reference, patterns, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        assert torch.all(got[:, :, ~allowed] == 0)
        torch.testing.assert_close(got.sum(-1), torch.ones(got.shape[:-1]))
    # The window output that training computes (fused, windows in the batch) agrees with the dense matrix.
    block = model.blocks[1]
    with torch.no_grad():
        x = block.norm1(model.blocks[0](model._pos_embed(model.patch_embed(images))))
        v = block.attn.split_qkv(block.attn.qkv(x))[2]  # (B, heads, N, d)
        dense = (captured[1] @ v).transpose(1, 2).reshape(x.shape)
        torch.testing.assert_close(block.attn(x), block.attn.proj(dense), atol=1e-5, rtol=1e-4)


def test_capture_in_train_mode_restores_every_flag_and_leaves_nothing_behind(make_model):
    model = make_model(attn_drop_rate=0.3, drop_path_rate=0.5, proj_drop_rate=0.3)
    model.train()
    model.blocks[1].eval()  # mixed flags must come back exactly
    before = model_state(model)
    images = images_for(model)
    captured = capture_attention(model, images)
    assert_state_equal(model, before)
    # Captured in eval mode: deterministic and equal to the eval-mode reference despite dropout / drop path.
    model_eval = make_model(attn_drop_rate=0.3, drop_path_rate=0.5, proj_drop_rate=0.3)
    model_eval.load_state_dict(model.state_dict())
    n = captured[0].shape[-1]
    reference = manual_attention(model_eval, images, [torch.ones(n, n, dtype=torch.bool)] * 3)
    for got, want in zip(captured, reference, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_capture_costs_nothing_afterwards_training_stays_fused(window_model, monkeypatch):
    model = window_model()
    capture_attention(model, images_for(model))

    def explicit_path_used(*args, **kwargs):
        raise AssertionError("the explicit softmax path ran: fused kernels were not used")

    monkeypatch.setattr(attention_module, "attention_softmax", explicit_path_used)
    model.train()
    model(images_for(model)).sum().backward()  # fused path only, no hooks


def test_capture_cleans_up_when_forward_raises(make_model):
    model = make_model()
    model.train()
    before = model_state(model)
    with pytest.raises(ValueError, match="img_size"):
        capture_attention(model, torch.randn(1, 3, 16, 16))
    assert_state_equal(model, before)


@pytest.mark.gpu
def test_capture_on_cuda_under_bf16_autocast_matches_float32(window_model):
    model = window_model(reg_tokens=1).cuda()
    images = images_for(model).cuda()
    before = model_state(model)
    reference = capture_attention(model, images)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        captured = capture_attention(model, images)
    assert_state_equal(model, before)
    for got, want in zip(captured, reference, strict=True):
        assert got.is_cuda
        torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=0)
        torch.testing.assert_close(got.float().sum(-1), torch.ones_like(want[..., 0]), atol=1e-2, rtol=0)
    maps = rollout_map(model, images)
    assert maps.shape == (2, 8, 8) and maps.is_cuda and torch.isfinite(maps).all()


class LoopedBlocks(nn.Module):
    """A model with ``blocks`` as an ``nn.ModuleList`` and no ``forward_features``."""

    def __init__(self, vit_model: VisionTransformer) -> None:
        super().__init__()
        self.vit_model = vit_model
        self.blocks = nn.ModuleList(list(vit_model.blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.vit_model._pos_embed(self.vit_model.patch_embed(x))
        for block in self.blocks:
            x = block(x)
        return x


def test_capture_accepts_module_list_blocks(make_model):
    model = make_model()
    images = images_for(model)
    for got, want in zip(capture_attention(LoopedBlocks(model), images), capture_attention(model, images), strict=True):
        torch.testing.assert_close(got, want)


def test_capture_rejects_model_without_attention_weights():
    with pytest.raises(ValueError, match="blocks"):
        capture_attention(nn.Linear(3, 3), torch.randn(1, 3))
    model = nn.Module()
    model.blocks = nn.Sequential(nn.Linear(3, 3))
    with pytest.raises(ValueError, match=r"blocks\[0\].*attention_weights"):
        capture_attention(model, torch.randn(1, 3))


# --------------------------------------------------------------------------------------------------- rollout


def loop_rollout(layers: list[np.ndarray], prefix: int, fusion: str, ratio: float, pool: str) -> np.ndarray:
    """Rollout of one sample by explicit loops; ``layers`` are (heads, N, N)."""
    n = layers[0].shape[-1]
    rollout = np.eye(n)
    for attn in layers:
        fused = np.zeros((n, n))
        for i in range(n):
            for j in range(n):
                values = [attn[h, i, j] for h in range(attn.shape[0])]
                fused[i, j] = {"mean": sum(values) / len(values), "max": max(values), "min": min(values)}[fusion]
        candidates = sorted((fused[i, j], i, j) for i in range(n) for j in range(prefix, n))  # patch columns
        for _, i, j in candidates[: int(ratio * len(candidates))]:
            fused[i, j] = 0.0
        a_hat = fused + np.eye(n)
        for i in range(n):
            a_hat[i] = a_hat[i] / a_hat[i].sum()
        rollout = a_hat @ rollout
    if pool == "token":
        return rollout[0, prefix:]
    return rollout[prefix:, prefix:].mean(axis=0)


def test_rollout_two_layers_written_out():
    # One head, class token + 2 patches. Â = (A + I) / 2 since rows sum to 1.
    a1 = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.0, 0.0, 1.0]])
    a2 = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.5, 0.5]])
    layers = [a1[None, None], a2[None, None]]
    # R = Â2 Â1; class row = [0.375, 0.5, 0.125]; patch rows [0.1875, 0.625, 0.1875] and [0, 0.1875, 0.8125].
    torch.testing.assert_close(attention_rollout(layers), torch.tensor([[0.5, 0.125]]))
    torch.testing.assert_close(attention_rollout(layers, pool="avg"), torch.tensor([[0.40625, 0.5]]))


@pytest.mark.parametrize(
    ("fusion", "expected"), [("mean", [0.15, 0.15]), ("max", [0.125, 0.5 / 2.4]), ("min", [0.1875, 0.0625])]
)
def test_rollout_head_fusion_written_out(fusion, expected):
    h1 = [[0.2, 0.3, 0.5], [0.1, 0.7, 0.2], [0.4, 0.35, 0.25]]
    h2 = [[0.6, 0.3, 0.1], [0.3, 0.3, 0.4], [0.2, 0.2, 0.6]]
    attn = torch.tensor([[h1, h2]])  # (1, 2, 3, 3); class row fused: mean [.4,.3,.3], max [.6,.3,.5], min [.2,.3,.1]
    torch.testing.assert_close(attention_rollout([attn], head_fusion=fusion), torch.tensor([expected]))


def test_rollout_discard_written_out_never_touches_class_column():
    attn = torch.tensor([[[[0.2, 0.3, 0.5], [0.1, 0.7, 0.2], [0.4, 0.35, 0.25]]]])
    # 6 patch-column entries; ratio 0.5 zeroes the 3 smallest (0.2, 0.25, 0.3), not the class column's 0.1.
    # A' + I = [[1.2, 0, 0.5], [0.1, 1.7, 0], [0.4, 0.35, 1]], class row / 1.7.
    got = attention_rollout([attn], discard_ratio=0.5)
    torch.testing.assert_close(got, torch.tensor([[0.0, 0.5 / 1.7]]))


def random_attention(batch: int, heads: int, n: int, layers: int, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [(2 * torch.randn(batch, heads, n, n, generator=generator)).softmax(-1) for _ in range(layers)]


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("ratio", [0.0, 0.35])
@pytest.mark.parametrize(("prefix", "pool"), [(1, "token"), (3, "token"), (0, "avg"), (2, "avg")])
def test_rollout_matches_loops_batched_equals_per_sample(fusion, ratio, prefix, pool):
    layers = random_attention(3, 2, prefix + 6, 3)
    got = attention_rollout(layers, prefix, fusion, ratio, pool)
    assert got.shape == (3, 6)
    for b in range(3):
        want = loop_rollout([a[b].double().numpy() for a in layers], prefix, fusion, ratio, pool)
        np.testing.assert_allclose(got[b].numpy(), want, rtol=1e-5, atol=1e-7)
        alone = attention_rollout([a[b : b + 1] for a in layers], prefix, fusion, ratio, pool)
        torch.testing.assert_close(alone[0], got[b])


@pytest.mark.parametrize(
    ("build", "pool"),
    [
        (dict(CONFIG, reg_tokens=2), "token"),  # class + 2 registers
        (dict(CONFIG, img_size=(32, 48)), "token"),  # 4 x 6 grid
        (dict(CONFIG, class_token=False, global_pool="avg", reg_tokens=1), "avg"),
        (dict(WINDOW, img_size=(24, 40), reg_tokens=1), "token"),  # padded 6 x 10 grid
    ],
    ids=["registers", "non_square", "avg_pool", "window_padded"],
)
def test_rollout_map_on_models(random_vit, build, pool):
    model = random_vit(**build)
    images = images_for(model, 2)
    rows, cols = model.patch_embed.grid_size
    got = rollout_map(model, images, head_fusion="max", discard_ratio=0.2)
    assert got.shape == (2, rows, cols)
    captured = capture_attention(model, images)
    for b in range(2):
        want = loop_rollout([a[b].double().numpy() for a in captured], model.num_prefix_tokens, "max", 0.2, pool)
        np.testing.assert_allclose(got[b].numpy(), want.reshape(rows, cols), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(head_fusion="median"), "head_fusion"),
        (dict(discard_ratio=1.0), "discard_ratio"),
        (dict(discard_ratio=-0.1), "discard_ratio"),
        (dict(pool="cls"), "pool"),
        (dict(num_prefix_tokens=0), "class token"),
    ],
)
def test_rollout_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        attention_rollout(random_attention(1, 1, 5, 1), **kwargs)


def test_rollout_rejects_bad_shapes():
    with pytest.raises(ValueError, match="empty"):
        attention_rollout([])
    with pytest.raises(ValueError, match=r"attentions\[1\]"):
        attention_rollout(random_attention(1, 1, 5, 1) + random_attention(1, 1, 6, 1))


# ------------------------------------------------------------------------------------------------ statistics


def test_entropy_uniform_is_log_n_one_hot_is_zero():
    n = 7
    uniform = torch.full((2, 3, n, n), 1.0 / n)
    torch.testing.assert_close(attention_entropy(uniform), torch.full((3,), math.log(n)))
    one_hot = torch.eye(n).expand(2, 3, n, n)
    torch.testing.assert_close(attention_entropy(one_hot), torch.zeros(3))


def test_distance_self_attention_is_zero_and_known_pattern_in_pixels():
    grid, patch, prefix = (2, 3), (8, 4), 1  # non-square patches: centres 8 px apart vertically, 4 px across
    n = prefix + 6
    self_only = torch.eye(n).expand(1, 2, n, n)
    torch.testing.assert_close(attention_distance(self_only, grid, patch, prefix), torch.zeros(2))
    # Every patch query puts 0.5 on the class token and 0.5 on patch (0, 0).
    attn = torch.zeros(1, 1, n, n)
    attn[..., :, 0] = 0.5
    attn[..., :, prefix] += 0.5
    # distances from (r, c) to (0, 0): 0, 4, 8 | 8, sqrt(8² + 4²), sqrt(8² + 8²)
    expected = (0 + 4 + 8 + 8 + math.sqrt(80) + math.sqrt(128)) / 6
    torch.testing.assert_close(attention_distance(attn, grid, patch, prefix), torch.tensor([expected]))
    torch.testing.assert_close(
        attention_distance(attn, grid, patch, prefix, renormalize=False), torch.tensor([expected / 2])
    )


def test_attention_statistics_per_block_and_head():
    n = 1 + 4
    layers = [torch.full((2, 3, n, n), 1.0 / n), torch.eye(n).expand(2, 3, n, n)]
    stats = attention_statistics(layers, grid_size=2, patch_size=16, num_prefix_tokens=1)
    torch.testing.assert_close(stats["entropy"], torch.tensor([[math.log(n)] * 3, [0.0] * 3]))
    # Uniform over 4 patches of a 2x2 grid with 16 px patches: distances per query 0, 16, 16, 16·√2.
    uniform_distance = (2 * 16 + 16 * math.sqrt(2)) / 4
    torch.testing.assert_close(stats["distance"], torch.tensor([[uniform_distance] * 3, [0.0] * 3]))
    torch.testing.assert_close(stats["mean_entropy"], torch.tensor([math.log(n), 0.0]))
    torch.testing.assert_close(stats["mean_distance"], torch.tensor([uniform_distance, 0.0]))


def test_collapse_flags_uniform_and_one_hot_not_random():
    n = 17
    uniform = detect_collapse(torch.full((2, 3, n, n), 1.0 / n))
    assert uniform.collapsed and uniform.uniform.all() and not uniform.one_hot.any()
    one_hot = detect_collapse(torch.eye(n).expand(2, 3, n, n))
    assert one_hot.collapsed and one_hot.one_hot.all()
    healthy = detect_collapse(torch.randn(4, 3, n, n).softmax(-1))
    assert not healthy.collapsed and not healthy.uniform.any() and not healthy.one_hot.any()
    # Every query's strongest key is key 0 while the rows stay spread out: collapsed by argmax agreement.
    sink = 0.5 * torch.rand(4, 3, n, n).softmax(-1)
    sink[..., 0] += 0.5
    report = detect_collapse(sink)
    assert report.collapsed and report.one_hot.all() and (report.normalized_entropy > 0.5).all()
    assert not detect_collapse(sink, argmax_agreement=None).collapsed
    # One healthy head keeps the block healthy.
    mixed = torch.cat([torch.full((4, 2, n, n), 1.0 / n), torch.randn(4, 1, n, n).softmax(-1)], dim=1)
    report = detect_collapse(mixed)
    assert not report.collapsed and report.uniform.tolist() == [True, True, False]
    assert "healthy" in report.describe()


def test_collapse_uses_window_pattern():
    allowed = explicit_window_pattern(4, 4, 2, 0, 1)
    uniform_in_windows = allowed.float() / allowed.sum(-1, keepdim=True)
    attn = uniform_in_windows.expand(2, 2, 17, 17)
    assert detect_collapse(attn).uniform.all()  # pattern inferred from the zeros
    assert detect_collapse(attn, mask=allowed).uniform.all()
    assert not detect_collapse(attn, mask=torch.ones(17, 17, dtype=torch.bool)).uniform.any()


def test_collapse_flags_untrained_model_as_uniform():
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=5)
    report = detect_collapse(capture_attention(model, torch.randn(2, 3, 32, 32))[0])
    assert report.collapsed and report.uniform.all()


def test_collapse_rejects_bad_thresholds():
    with pytest.raises(ValueError, match="one_hot_threshold"):
        detect_collapse(torch.full((1, 1, 3, 3), 1 / 3), one_hot_threshold=0.9, uniform_threshold=0.5)


def test_rollout_explains_the_rows_the_classifier_reads():
    """A class-token model that average-pools its patches: rollout (like attribution) follows the patch rows."""
    from vit.explain import head_pool

    model = vit.create_model("vit_tiny_patch4_32", depth=2, embed_dim=32, num_heads=2, global_pool="avg").eval()
    images = torch.randn(2, 3, 32, 32)
    attentions = capture_attention(model, images)
    assert head_pool(model) == "avg" and model.has_class_token
    expected = attention_rollout(attentions, num_prefix_tokens=1, pool="avg").reshape(2, 8, 8)
    torch.testing.assert_close(rollout_map(model, images), expected)
    token_model = vit.create_model("vit_tiny_patch4_32", depth=2, embed_dim=32, num_heads=2).eval()
    assert head_pool(token_model) == "token"
