"""The sanity check (cascading randomisation) and the importance of heads (mean ablation), against references written
here independently: scipy's Spearman correlation, a method that ignores the model, and one head ablated at a time."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import spearmanr

from vit.explain import methods as registry
from vit.explain.heads import head_importance
from vit.explain.methods import Method, MethodMap
from vit.explain.sanity import INSENSITIVE, sanity_check, spearman, stages

CONFIG = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=5)


def test_spearman_equals_scipys_per_row():
    generator = torch.Generator().manual_seed(0)
    a, b = torch.rand(4, 16, generator=generator), torch.rand(4, 16, generator=generator)
    b[1] = a[1] * 3 + 1  # the same ranking
    a[2, :8] = 0.5  # ties: average ranks
    expected = [spearmanr(x.numpy(), y.numpy()).statistic for x, y in zip(a, b, strict=True)]
    torch.testing.assert_close(spearman(a, b), torch.tensor(expected, dtype=torch.float64))
    assert spearman(a, b)[1] == pytest.approx(1.0)


def test_a_method_blind_to_the_model_is_flagged_and_the_model_is_untouched(random_vit, monkeypatch):
    model = random_vit(**CONFIG).eval()

    def brightness(model, images, target=None):  # the image's own patch means: nothing of the model
        return MethodMap(torch.nn.functional.avg_pool2d(images.mean(1, keepdim=True), 4)[:, 0])

    monkeypatch.setitem(registry.METHODS, "brightness", Method("brightness", brightness, "patch brightness", False))
    before = {name: value.clone() for name, value in model.state_dict().items()}
    images = torch.randn(6, 3, 16, 16)
    report = sanity_check(model, images, ["brightness", "attnlrp"], batch_size=4)
    assert [s.stage for s in report.stages["attnlrp"]] == ["head", "block 1", "block 0", "patch embedding"]
    assert [name for name, _ in stages(model)] == ["head", "block 1", "block 0", "patch embedding"]
    blind = report.stages["brightness"]
    assert all(s.spearman == pytest.approx(1.0) and s.ssim == pytest.approx(1.0) for s in blind)
    assert report.insensitive == ["brightness"] and report.stages["attnlrp"][-1].spearman < INSENSITIVE
    for s in report.stages["attnlrp"]:
        assert s.spearman_ci[0] <= s.spearman <= s.spearman_ci[1]
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())
    assert "insensitive: its maps barely change" in report.table()
    with pytest.raises(ValueError, match="at least 2 images"):
        sanity_check(model, images[:1], ["attnlrp"])


def one_head_at_a_time(model, images, labels):
    """The reference: each head ablated in its own forward pass of the plain batch."""
    model.eval()
    outputs = {}
    with torch.no_grad():
        handles = [block.attn.proj.register_forward_pre_hook(lambda m, a, i=i: outputs.__setitem__(i, a[0]))
                   for i, block in enumerate(model.blocks)]  # fmt: skip
        logits = model(images)
        for handle in handles:
            handle.remove()
        classes = logits.argmax(-1)
        drops, accuracy = torch.zeros(len(model.blocks), 2), torch.zeros(len(model.blocks), 2)
        for i, block in enumerate(model.blocks):
            d = block.attn.head_dim
            for h in range(2):
                mean = outputs[i].mean(0)

                def ablate(module, args, h=h, mean=mean, d=d):
                    x = args[0].clone()
                    x[..., h * d : (h + 1) * d] = mean[:, h * d : (h + 1) * d]
                    return (x,)

                handle = block.attn.proj.register_forward_pre_hook(ablate)
                ablated = model(images)
                handle.remove()
                drops[i, h] = (logits.gather(1, classes[:, None]) - ablated.gather(1, classes[:, None])).mean()
                accuracy[i, h] = ((logits.argmax(-1) == labels).float() - (ablated.argmax(-1) == labels).float()).mean()
    return drops, accuracy


def test_mean_ablation_of_every_head_equals_one_head_at_a_time(random_vit):
    model = random_vit(**CONFIG)
    images, labels = torch.randn(7, 3, 16, 16), torch.tensor([0, 1, 2, 3, 4, 0, 1])
    result = head_importance(model, images, labels, batch_size=4)  # chunks of 2 images x 2 heads
    drops, accuracy = one_head_at_a_time(model, images, labels)
    torch.testing.assert_close(result.logit_drop, drops, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(result.accuracy_drop, accuracy)
    ranked = result.ranked()
    assert [drop for *_, drop in ranked] == sorted(drops.flatten().tolist(), reverse=True)
    assert 0.0 <= result.share_of_top(1) <= result.share_of_top(3) <= 1.0
    assert all(not block.attn.proj._forward_pre_hooks for block in model.blocks)  # no hook left behind
    data = result.to_dict()
    assert data["num_images"] == 7 and len(data["logit_drop"]) == 2
