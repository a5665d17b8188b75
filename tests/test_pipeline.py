"""explain / explain_images against the separate pieces they replace: model(images), capture_attention +
attention_rollout, attention_statistics, detect_collapse, the method registry and the benchmark; one forward pass for
predictions and statistics; the model left as it was."""

from __future__ import annotations

import math

import pytest
import torch

from vit.explain import (
    Explanation,
    attention_attribution,
    attention_rollout,
    attention_statistics,
    benchmark_methods,
    capture_attention,
    detect_collapse,
    explain,
    explain_images,
    explain_map,
)
from vit.normalize import DIGITS_MEAN, DIGITS_STD, normalize

CONFIG = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=5, mlp_ratio=2.0)


@pytest.fixture
def make_model(random_vit):
    """A tiny ViT (:data:`CONFIG`) with random attention (conftest's ``random_vit``)."""
    return lambda **overrides: random_vit(**{**CONFIG, **overrides})


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
def test_explanation_equals_the_separate_pieces(make_model, overrides, pool):
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


def test_one_forward_pass_and_the_model_left_as_it_was(make_model):
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


def test_normalised_float_input_gives_the_same_and_is_displayed_unnormalised(make_model):
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
        maps={"rollout": torch.zeros(2, 2, 2)},
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


def test_without_statistics_and_real_stats(make_model):
    model = make_model()
    ex = explain_images(model, pixels(), mean=DIGITS_MEAN, std=DIGITS_STD, statistics=False)
    assert ex.entropy is None and ex.distance is None and ex.collapse == {} and ex.metrics() == {}
    ex = explain_images(model, pixels(), mean=DIGITS_MEAN, std=DIGITS_STD)
    assert set(ex.metrics()) == {f"attn/{kind}/block_{i}" for kind in ("entropy", "distance") for i in (0, 1)} | {
        "attn/collapsed_blocks"
    }
    assert all(0 < value <= math.log(17) for key, value in ex.metrics().items() if "entropy" in key)


def test_bad_input(make_model):
    model = make_model()
    with pytest.raises(ValueError, match="mean and std"):
        explain_images(model, pixels(), mean=None, std=None)
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        explain_images(model, pixels()[0], mean=DIGITS_MEAN, std=DIGITS_STD)
    with pytest.raises(ValueError, match="one label per image"):
        explain_images(model, pixels(), labels=[1], mean=DIGITS_MEAN, std=DIGITS_STD)


def test_concat_of_batches_equals_one_explanation_of_all_images(make_model):
    model = make_model(reg_tokens=1)
    images = torch.randint(0, 256, (7, 3, 16, 16), generator=torch.Generator().manual_seed(2), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 3, 4, 0, 1])
    whole = explain_images(model, images, labels=labels, mean=DIGITS_MEAN, std=DIGITS_STD)
    parts = [
        explain_images(model, images[s], labels=labels[s], mean=DIGITS_MEAN, std=DIGITS_STD)
        for s in (slice(0, 2), slice(2, 7))  # unequal batches: the means must weigh them by size
    ]
    joined = Explanation.concat(parts)
    for name in ("images", "labels", "probs", "preds", "rollout", "entropy", "distance"):
        torch.testing.assert_close(getattr(joined, name), getattr(whole, name), msg=name)
    for mine, theirs in zip(joined.attentions, whole.attentions, strict=True):
        torch.testing.assert_close(mine, theirs)
    assert sorted(joined.collapse) == sorted(whole.collapse) == [0, 1]
    for i, report in whole.collapse.items():
        merged = joined.collapse[i]
        assert merged.num_images == 7 and merged.collapsed == report.collapsed
        torch.testing.assert_close(merged.normalized_entropy, report.normalized_entropy)
        torch.testing.assert_close(merged.argmax_agreement, report.argmax_agreement)
        assert torch.equal(merged.argmax_counts, report.argmax_counts) and torch.equal(merged.mask, report.mask)
    parts[0].attentions = []
    assert Explanation.concat(parts).attentions == []  # kept only when every part kept them
    with pytest.raises(ValueError, match="no explanations"):
        Explanation.concat([])
    without_labels = explain_images(model, images[:2], mean=DIGITS_MEAN, std=DIGITS_STD)
    with pytest.raises(ValueError, match="with and without statistics or labels"):
        Explanation.concat([parts[1], without_labels])


def one_hot_rows(batch: int, heads: int, n: int, key: int) -> torch.Tensor:
    attn = torch.zeros(batch, heads, n, n)
    attn[..., key] = 1.0
    return attn


def test_collapse_merged_over_batches_is_the_collapse_of_all_images():
    # Batch 1 (2 images): every query of both heads looks at key 0, a one-hot collapse. Batch 2 (1 image): head 0
    # uniform over the 4 keys, head 1 puts 0.3 / 0.7 on keys 0 / 1. Over all images head 1 is neither uniform nor
    # one-hot, so the block is healthy: the first batch alone would have called it collapsed.
    first = one_hot_rows(2, 2, 4, key=0)
    second = torch.zeros(1, 2, 4, 4)
    second[:, 0] = 0.25
    second[:, 1, :, :2] = torch.tensor([0.3, 0.7])
    reports = [detect_collapse(first), detect_collapse(second)]
    assert reports[0].collapsed
    merged = type(reports[0]).merge(reports)
    whole = detect_collapse(torch.cat([first, second]))
    assert not merged.collapsed and not whole.collapsed
    # Head 0: uniform rows tie, their argmax is key 0 too; head 1: 8 of 12 rows on key 0.
    torch.testing.assert_close(merged.argmax_agreement, torch.tensor([1.0, 2 / 3]))
    torch.testing.assert_close(merged.argmax_agreement, whole.argmax_agreement)
    # Normalised by log 4: keys 1-3 are allowed through the second batch. Head 0: (0 + 0 + 1) / 3.
    h1 = -(0.3 * math.log(0.3) + 0.7 * math.log(0.7)) / math.log(4) / 3
    torch.testing.assert_close(merged.normalized_entropy, torch.tensor([1 / 3, h1]))
    torch.testing.assert_close(merged.normalized_entropy, whole.normalized_entropy)
    assert torch.equal(merged.mask, torch.ones(4, 4, dtype=torch.bool))
    assert merged.one_hot.tolist() == whole.one_hot.tolist() == [True, False]
    assert merged.num_images == 3
    with pytest.raises(ValueError, match="cannot merge"):
        type(reports[0]).merge([reports[0], detect_collapse(first, uniform_threshold=0.9)])


def test_explain_in_batches_equals_explain_at_once(make_model):
    model = make_model(reg_tokens=1)
    images = torch.randint(0, 256, (5, 3, 16, 16), generator=torch.Generator().manual_seed(3), dtype=torch.uint8)
    kwargs = dict(mean=DIGITS_MEAN, std=DIGITS_STD, block=0, faithfulness=True, steps=4, target=2)
    methods = ["rollout", "attribution"]
    small, whole = explain(model, images, methods, batch_size=2, **kwargs), explain(model, images, methods, **kwargs)
    at_once = explain_images(model, images, mean=DIGITS_MEAN, std=DIGITS_STD)
    torch.testing.assert_close(small.rollout, at_once.rollout)
    torch.testing.assert_close(small.entropy, at_once.entropy)
    assert small.attentions == [] and small.block == 0 and small.target == 2 and list(small.maps) == methods
    # Head maps: each head's class-token row of block 0 over the 4 x 4 patches.
    torch.testing.assert_close(small.head_maps, at_once.attentions[0][:, :, 0, 2:].reshape(5, 2, 4, 4))
    torch.testing.assert_close(small.maps["attribution"], whole.maps["attribution"])
    inputs = normalize(images, DIGITS_MEAN, DIGITS_STD)
    torch.testing.assert_close(small.maps["attribution"], attention_attribution(model, inputs, target=2))
    assert small.faithfulness["deletion_auc"] == pytest.approx(whole.faithfulness["deletion_auc"])
    assert set(small.faithfulness["deletion_auc"]) == {"rollout", "attribution", "random"}
    # The benchmark's own figures, called directly with the same settings.
    bench = benchmark_methods(model, inputs, torch.full((5,), 2), methods, steps=4, target="label", batch_size=2)
    assert small.benchmark.to_dict()["scores"].keys() == bench.to_dict()["scores"].keys()
    for name in (*methods, "random"):
        assert small.faithfulness["deletion_auc"][name] == pytest.approx(bench.scores[name].deletion_auc)
    assert small.benchmark.target == "class 2" and small.benchmark.accuracy is None
    only_rollout = explain(model, images, ["rollout"], mean=DIGITS_MEAN, std=DIGITS_STD)
    assert list(only_rollout.maps) == ["rollout"] and only_rollout.faithfulness is None and only_rollout.block == 1
    with pytest.raises(ValueError, match="block 2 out of range: the model has 2 blocks"):
        explain(model, images, mean=DIGITS_MEAN, std=DIGITS_STD, block=2)
    with pytest.raises(ValueError, match="target 5 out of range: the model has 5 classes"):
        explain(model, images, mean=DIGITS_MEAN, std=DIGITS_STD, target=5)
    with pytest.raises(ValueError, match="unknown explanation method 'shap'"):
        explain(model, images, ["shap"], mean=DIGITS_MEAN, std=DIGITS_STD)


def test_every_map_comes_from_the_registry_also_inside_inference_mode(make_model):
    """The training callback calls explain inside the validation loop's inference mode: gradients must still flow,
    and each map must equal the registry's own, aliases resolved and kept in the order asked."""
    model = make_model()
    images = torch.randint(0, 256, (4, 3, 16, 16), generator=torch.Generator().manual_seed(5), dtype=torch.uint8)
    inputs = normalize(images, DIGITS_MEAN, DIGITS_STD)
    with torch.inference_mode():
        ex = explain(model, images, ["cp", "attnlrp", "rollout", "cp_lrp"], mean=DIGITS_MEAN, std=DIGITS_STD,
                     discard_ratio=0.5, head_fusion="max")  # fmt: skip
    assert list(ex.maps) == ["cp_lrp", "attnlrp", "rollout"]
    torch.testing.assert_close(ex.maps["attnlrp"], explain_map(model, inputs, "attnlrp").patches)
    torch.testing.assert_close(ex.maps["cp_lrp"], explain_map(model, inputs, "cp_lrp").patches)
    rollout = explain_map(model, inputs, "rollout", head_fusion="max", discard_ratio=0.5).patches
    torch.testing.assert_close(ex.maps["rollout"], rollout)
    assert all(p.grad is None for p in model.parameters())


def test_the_public_names_load_on_first_use():
    """``vit.explain`` lists its names once (the TYPE_CHECKING imports; ``__all__`` written out equal to them for the
    API docs), imports nothing heavy itself, and every name resolves to the object of its module."""
    import subprocess
    import sys

    import vit.explain as package

    assert sorted(package.__all__) == sorted(package._WHERE)
    for name in package.__all__:
        assert getattr(package, name) is not None
    assert package.lrp.__name__ == "lrp" and package.faithfulness.__name__ == "faithfulness"  # functions, not modules
    code = "import sys, vit.explain; print(sorted(m for m in ('torch', 'numpy', 'lightning') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
