"""The MAP head (global_pool="map"): timm parity, capture, rollout and attribution read at the latent query."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from timm.models.vision_transformer import VisionTransformer as TimmViT

import vit
from vit.callbacks import AttentionRolloutLogger
from vit.explain import (
    attention_attribution,
    attention_rollout,
    capture_attention,
    explain_images,
    head_pool,
    relevance_from_gradients,
    render_panels,
    rollout_grid,
    rollout_map,
)

SMALL = {"patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 4, "num_classes": 7, "class_token": False}


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(
    "config",
    [
        {"img_size": 32, "reg_tokens": 2},  # register tokens (not attended to by the latent, as in timm)
        {"img_size": (24, 40), "qk_norm": True},  # another, non-square image size
        {"img_size": 32, "reg_tokens": 1, "no_embed_class": True, "depth": 3, "mlp_ratio": 2.0},
    ],
)
def test_timm_map_state_dict_loads_strictly_and_logits_match(config, fused):
    torch.manual_seed(0)
    kwargs = {**SMALL, **config, "global_pool": "map"}
    theirs = TimmViT(**kwargs).eval()
    ours = vit.VisionTransformer(**kwargs, fused_attn=fused).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    x = torch.randn(2, 3, *ours.patch_embed.img_size)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.forward_head(ours.forward_features(x), pre_logits=True), theirs.forward_head(
            theirs.forward_features(x), pre_logits=True), atol=1e-5, rtol=1e-5)  # fmt: skip


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(
    "local", [{"window_size": 4, "shift_windows": True}, {"window_size": 3, "window_type": "sliding"}]
)
def test_map_head_after_window_or_sliding_blocks_is_timms_head(local, fused):
    # timm has no local blocks: its MAP head, with the same weights, reads the tokens of our window / sliding blocks.
    torch.manual_seed(0)
    kwargs = {**SMALL, "img_size": 32, "reg_tokens": 1, "global_pool": "map"}
    theirs = TimmViT(**kwargs).eval()
    ours = vit.VisionTransformer(**kwargs, **local, global_attn_indexes=(1,), fused_attn=fused).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = ours.forward_features(x)
        torch.testing.assert_close(ours(x), theirs.forward_head(tokens), atol=1e-5, rtol=1e-5)


def test_map_arguments():
    with pytest.raises(ValueError, match="latent_len must be >= 1"):
        vit.VisionTransformer(**SMALL, img_size=16, global_pool="map", latent_len=0)
    model = vit.VisionTransformer(**SMALL, img_size=16, global_pool="map", latent_len=3)
    assert model.attn_pool.latent.shape == (1, 3, 32) and head_pool(model) == "map"
    model.reset_classifier(4, global_pool="avg")
    assert model.attn_pool is None and model(torch.randn(1, 3, 16, 16)).shape == (1, 4)
    with pytest.raises(ValueError, match="global_pool='map' needs the attention-pooling head"):
        model.reset_classifier(4, global_pool="map")


def test_rollout_through_the_map_head_by_hand():
    # One register token + 2 patches, one head. R = Â2 Â1 (Â = (A + I) / 2): patch rows [.1875, .625, .1875] and
    # [0, .1875, .8125]. The head's two heads over the patches: [1, 0] and [.5, .5], mean [.75, .25];
    # map = [.75, .25] @ [[.625, .1875], [.1875, .8125]] = [.515625, .34375] (no identity for the latent).
    a1 = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.0, 0.0, 1.0]])
    a2 = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.5, 0.5]])
    pool = torch.tensor([[[[1.0, 0.0]], [[0.5, 0.5]]]])  # (B=1, heads=2, latent_len=1, patches=2)
    layers = [a1[None, None], a2[None, None]]
    got = attention_rollout(layers, num_prefix_tokens=1, pool="map", pool_attention=pool)
    torch.testing.assert_close(got, torch.tensor([[0.515625, 0.34375]]))
    # Two latents are averaged: a second latent [0, 1] on both heads gives ([.75, .25] + [0, 1]) / 2 = [.375, .625].
    two = torch.cat([pool, torch.tensor([[[[0.0, 1.0]], [[0.0, 1.0]]]])], dim=2)
    expected = torch.tensor([0.375, 0.625]) @ torch.tensor([[0.625, 0.1875], [0.1875, 0.8125]])
    torch.testing.assert_close(attention_rollout(layers, 1, pool="map", pool_attention=two), expected[None])
    with pytest.raises(ValueError, match="pool='map' needs the pooling head's attention"):
        attention_rollout(layers, 1, pool="map")
    with pytest.raises(ValueError, match=r"pool_attention must have shape \(1, heads, latent_len, 2\)"):
        attention_rollout(layers, 1, pool="map", pool_attention=torch.ones(1, 2, 1, 3))


def test_attribution_through_the_map_head_by_hand():
    # The two blocks of test_attribution.test_two_blocks_by_hand: R = [[1.5, 1.25, 1], [0, 1.5, 0], [0, 0, 1]],
    # patch block [[1.5, 0], [0, 1]]. Head: A_p heads [.5, .5] and [.25, .75], ∇A_p [2, -1] and [-1, 2]:
    # products [1, -.5] and [-.25, 1.5], positive parts [1, 0] and [0, 1.5], mean [.5, .75];
    # r = [.5, .75] @ [[1.5, 0], [0, 1]] = [.75, .75].
    a1 = torch.tensor([[[0.5, 0.5, 0], [0, 1, 0], [0, 0, 1]], [[0, 0.5, 0.5], [0.5, 0.5, 0], [0, 0.5, 0.5]]])
    g1 = torch.tensor([[[2.0, -2, 1], [0, 1, 0], [0, 0, -1]], [[0, 2, 4], [0, 0, 0], [0, 0, 0]]])
    a2 = torch.tensor([[0.0, 1, 0], [0, 1, 0], [0, 0, 1]]).expand(2, 3, 3)
    g2 = torch.zeros(2, 3, 3)
    g2[0, 0, 1], g2[1, 0, 1] = 1.0, -1.0
    pool = torch.tensor([[[[0.5, 0.5]], [[0.25, 0.75]]]])
    pool_grad = torch.tensor([[[[2.0, -1.0]], [[-1.0, 2.0]]]])
    got = relevance_from_gradients(
        [a1[None], a2[None]], [g1[None], g2[None]], 1, pool="map", pool_attention=pool, pool_gradient=pool_grad
    )
    torch.testing.assert_close(got, torch.tensor([[0.75, 0.75]]))
    with pytest.raises(ValueError, match="pool_gradient"):
        relevance_from_gradients([a1[None]], [g1[None]], 1, pool="map", pool_attention=pool)


def _map_model(**kwargs) -> vit.VisionTransformer:
    torch.manual_seed(0)
    return vit.VisionTransformer(**{**SMALL, "img_size": 16, "reg_tokens": 1, "global_pool": "map", **kwargs}).eval()


def test_capture_records_the_heads_cross_attention():
    model = _map_model(latent_len=2)
    x = torch.randn(3, 3, 16, 16)
    record = capture_attention(model, x)
    assert len(record) == 2 and record[0].shape == (3, 4, 17, 17)
    with torch.no_grad():
        expected = model.attn_pool.attention_weights(model.forward_features(x)[:, 1:])
    assert record.pool.shape == (3, 4, 2, 16)
    torch.testing.assert_close(record.pool, expected)
    torch.testing.assert_close(record.pool.sum(-1), torch.ones(3, 4, 2))
    # rollout_map reads the record's head attention; a model without the head records none.
    direct = attention_rollout(list(record), 1, pool="map", pool_attention=record.pool).reshape(3, 4, 4)
    torch.testing.assert_close(rollout_map(model, x), direct)
    torch.testing.assert_close(rollout_grid(model, record), direct)
    plain = vit.VisionTransformer(**{**SMALL, "img_size": 16, "global_pool": "avg"})
    assert capture_attention(plain, x).pool is None


def test_explain_images_statistics_and_panels_of_a_map_model():
    model = _map_model()
    images = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    explanation = explain_images(model, images, mean=(0.5,) * 3, std=(0.25,) * 3, labels=[1, 2])
    assert explanation.pool_attention.shape == (2, 4, 1, 16)
    entropy = -(explanation.pool_attention * explanation.pool_attention.log()).sum(-1).mean(dim=(0, 2))
    torch.testing.assert_close(explanation.pool_entropy, entropy)
    metrics = explanation.metrics()
    assert metrics["attn/entropy/pool"] == pytest.approx(float(entropy.mean()), rel=1e-5)
    assert {"attn/entropy/block_0", "attn/distance/block_1"} <= set(metrics)
    record = capture_attention(model, (images.float() / 255 - 0.5) / 0.25)
    expected = attention_rollout(list(record), 1, pool="map", pool_attention=record.pool).reshape(2, 4, 4)
    torch.testing.assert_close(explanation.rollout, expected, atol=1e-6, rtol=1e-5)
    panels = render_panels(explanation)
    assert len(panels) == 2 and all(p.ndim == 3 and p.dtype == np.uint8 for p in panels)


def test_attribution_of_a_map_model_batched_equals_per_image():
    model = _map_model()
    x = torch.randn(3, 3, 16, 16)
    batched = attention_attribution(model, x, target=[0, 3, 6])
    singles = torch.cat([attention_attribution(model, x[i : i + 1], target=t) for i, t in enumerate([0, 3, 6])])
    torch.testing.assert_close(batched, singles, atol=1e-6, rtol=1e-4)
    assert batched.shape == (3, 4, 4) and (batched >= 0).all() and batched.sum() > 0


def test_training_time_rollout_logger_on_a_map_model(tmp_path, tiny_classifier, cpu_trainer, digits):
    module = tiny_classifier(model_overrides={"class_token": False, "global_pool": "map"}, lr=3e-3, seed=0)
    logger = AttentionRolloutLogger(num_images=2, every_n_epochs=1, attribution=True)
    trainer = cpu_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, callbacks=[logger])
    trainer.fit(module, digits())
    for name in ("epoch_000.png", "attribution_epoch_000.png"):
        with Image.open(tmp_path / "rollout" / name) as grid:
            assert grid.mode == "RGB" and grid.width >= 2 * 160


def test_flop_count_of_the_map_head_by_hand():
    # The head on 16 patch tokens of width 32 (MLP 128), one latent: q 2·32·32, kv 2·16·32·64, scores and weighted sum
    # 2·16·32 each, proj 2·32·32, MLP 2·32·128 twice. The avg-pooled model has the same blocks and classifier.
    from vit.models.flops import forward_flops

    head = 2 * 32 * 32 + 2 * 16 * 32 * 64 + 2 * (2 * 16 * 32) + 2 * 32 * 32 + 2 * (2 * 32 * 128)
    avg = vit.VisionTransformer(**{**SMALL, "img_size": 16, "reg_tokens": 1, "global_pool": "avg"})
    assert forward_flops(_map_model(), (3, 16, 16)) - forward_flops(avg, (3, 16, 16)) == head
