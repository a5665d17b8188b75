"""explain_images against the separate pieces it replaces: model(images), capture_attention + attention_rollout,
attention_statistics and detect_collapse; one forward pass; the model left as it was."""

from __future__ import annotations

import math

import pytest
import torch

from vit import VisionTransformer
from vit.explain import (
    Explanation,
    attention_rollout,
    attention_statistics,
    capture_attention,
    detect_collapse,
    explain_images,
)
from vit.normalize import DIGITS_MEAN, DIGITS_STD, normalize


def make_model(**overrides) -> VisionTransformer:
    config = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=5, mlp_ratio=2.0)
    torch.manual_seed(0)
    model = VisionTransformer(**{**config, **overrides})
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)  # random, not near-uniform, attention
    return model


def pixels(batch: int = 3, size: int = 16) -> torch.Tensor:
    return torch.randint(0, 256, (batch, 3, size, size), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)


@pytest.mark.parametrize(
    "overrides, pool",
    [
        ({}, "token"),
        ({"reg_tokens": 2}, "token"),
        ({"class_token": False, "global_pool": "avg"}, "avg"),
        ({"img_size": (16, 24), "window_size": 2, "global_attn_indexes": (1,)}, "token"),
    ],
)
def test_explanation_equals_the_separate_pieces(overrides, pool):
    model = make_model(**overrides)
    images = pixels(size=16)
    if "img_size" in overrides:
        images = torch.randint(0, 256, (3, 3, 16, 24), dtype=torch.uint8)
    inputs = normalize(images, DIGITS_MEAN, DIGITS_STD)
    ex = explain_images(
        model, images, labels=[0, 4, 2], class_names=list("abcde"), mean=DIGITS_MEAN, std=DIGITS_STD, discard_ratio=0.2
    )
    model.eval()
    with torch.no_grad():
        logits = model(inputs)
    torch.testing.assert_close(ex.probs, logits.softmax(dim=-1))
    assert ex.preds.tolist() == logits.argmax(dim=-1).tolist()
    attentions = capture_attention(model, inputs)
    assert len(ex.attentions) == len(attentions)
    for mine, theirs in zip(ex.attentions, attentions, strict=True):
        torch.testing.assert_close(mine, theirs)
    rows, cols = model.patch_embed.grid_size
    expected = attention_rollout(attentions, model.num_prefix_tokens, discard_ratio=0.2, pool=pool)
    torch.testing.assert_close(ex.rollout, expected.reshape(-1, rows, cols))
    stats = attention_statistics(attentions, (rows, cols), model.patch_embed.patch_size, model.num_prefix_tokens)
    torch.testing.assert_close(ex.entropy, stats["entropy"])
    torch.testing.assert_close(ex.distance, stats["distance"])
    for i, attn in enumerate(attentions):
        reference = detect_collapse(attn)
        assert ex.collapse[i].collapsed == reference.collapsed
        torch.testing.assert_close(ex.collapse[i].normalized_entropy, reference.normalized_entropy)
    # uint8 pixels are displayed as they are: no normalise -> unnormalise round trip.
    torch.testing.assert_close(ex.images, images.float() / 255, rtol=0, atol=0)


def test_one_forward_pass_and_the_model_left_as_it_was():
    model = make_model()
    model.train()
    model.blocks[1].eval()  # a mixed state, given back module by module
    flags = {name: m.training for name, m in model.named_modules()}
    calls = []
    handles = [model.patch_embed.register_forward_hook(lambda module, args, output: calls.append("embed"))]
    handles += [model.head.register_forward_hook(lambda module, args, output: calls.append("head"))]
    for block in model.blocks:
        handles.append(block.register_forward_hook(lambda module, args, output: calls.append("block")))
    explain_images(model, pixels(), mean=DIGITS_MEAN, std=DIGITS_STD)
    for handle in handles:
        handle.remove()
    assert calls == ["embed", "block", "block", "head"]  # one pass through the model
    assert {name: m.training for name, m in model.named_modules()} == flags
    assert all(p.grad is None for p in model.parameters())
    assert all(not block.attn._forward_pre_hooks for block in model.blocks)  # no capture hook left
    assert all(block.attn.fused_attn for block in model.blocks)


def test_normalised_float_input_gives_the_same_and_is_displayed_unnormalised():
    model = make_model()
    images = pixels()
    inputs = normalize(images, DIGITS_MEAN, DIGITS_STD)
    from_uint8 = explain_images(model, images, mean=DIGITS_MEAN, std=DIGITS_STD)
    from_float = explain_images(model, inputs, mean=DIGITS_MEAN, std=DIGITS_STD)
    torch.testing.assert_close(from_float.probs, from_uint8.probs)
    torch.testing.assert_close(from_float.rollout, from_uint8.rollout)
    torch.testing.assert_close(from_float.images, from_uint8.images, atol=1e-6, rtol=0)
    # Unknown normalisation: each image stretched to exactly [0, 1].
    stretched = explain_images(model, inputs, mean=None, std=None).images
    assert stretched.amin(dim=(1, 2, 3)).tolist() == [0.0] * 3 and stretched.amax(dim=(1, 2, 3)).tolist() == [1.0] * 3


def test_captions_metrics_and_collapse():
    probs = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.18, 0.32]])
    uniform = torch.full((2, 2, 5, 5), 0.2)  # every head exactly uniform: collapsed
    ex = Explanation(
        images=torch.zeros(2, 3, 16, 12),
        labels=torch.tensor([2, -1]),
        probs=probs,
        preds=probs.argmax(dim=-1),
        attentions=[uniform],
        rollout=torch.zeros(2, 2, 2),
        entropy=torch.tensor([[1.0, 2.0]]),
        distance=torch.tensor([[3.0, 5.0]]),
        collapse={0: detect_collapse(uniform)},
        class_names=["cat", "dog", "ship"],
    )
    assert ex.captions() == ["true ship · pred dog (70 %)", "pred cat (50 %)"]  # label -1: unknown
    assert ex.collapsed_blocks == [0]
    assert ex.max_distance == pytest.approx(20.0)
    assert ex.metrics() == {"attn/entropy/block_0": 1.5, "attn/distance/block_0": 4.0, "attn/collapsed_blocks": 1.0}
    ex.class_names = None
    assert ex.captions()[0] == "true 2 · pred 1 (70 %)"


def test_without_statistics_and_real_stats():
    model = make_model()
    ex = explain_images(model, pixels(), mean=DIGITS_MEAN, std=DIGITS_STD, statistics=False)
    assert ex.entropy is None and ex.distance is None and ex.collapse == {} and ex.metrics() == {}
    ex = explain_images(model, pixels(), mean=DIGITS_MEAN, std=DIGITS_STD)
    assert set(ex.metrics()) == {f"attn/{kind}/block_{i}" for kind in ("entropy", "distance") for i in (0, 1)} | {
        "attn/collapsed_blocks"
    }
    assert all(0 < value <= math.log(17) for key, value in ex.metrics().items() if "entropy" in key)


def test_bad_input():
    model = make_model()
    with pytest.raises(ValueError, match="mean and std"):
        explain_images(model, pixels(), mean=None, std=None)
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        explain_images(model, pixels()[0], mean=DIGITS_MEAN, std=DIGITS_STD)
    with pytest.raises(ValueError, match="one label per image"):
        explain_images(model, pixels(), labels=[1], mean=DIGITS_MEAN, std=DIGITS_STD)
