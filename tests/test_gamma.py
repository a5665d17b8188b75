"""LRP's gamma rule against zennit's (a library nobody here wrote), inside a ViT (conservation, the value kept), and
choosing it by measurement: :func:`vit.explain.tune_gamma` and the training callback's options."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vit.callbacks import ExplanationLogger
from vit.explain import benchmark_methods, lrp, tune_gamma
from vit.explain.lrp import relevance_rules
from vit.explain.tuning import TOLERANCE


def zennit_relevance(net: nn.Module, x: torch.Tensor, target: int, gamma: float, embed_gamma: float) -> torch.Tensor:
    """zennit's generalised gamma rule on every Linear and Conv2d, the relevance starting as the target's logit."""
    composites = pytest.importorskip("zennit.composites", reason="zennit (the dev extra) is not installed")
    from zennit.attribution import Gradient
    from zennit.rules import Gamma

    composite = composites.LayerMapComposite([(nn.Linear, Gamma(gamma)), (nn.Conv2d, Gamma(embed_gamma))])
    start = torch.zeros(len(x), 3, dtype=x.dtype)
    start[:, target] = net(x)[:, target].detach()
    with Gradient(net, composite) as attributor:
        _, relevance = attributor(x, start)
    return relevance


def ours(net: nn.Module, x: torch.Tensor, target: int, gamma: float, embed_gamma: float) -> torch.Tensor:
    x = x.clone().requires_grad_(True)
    with relevance_rules(net, "cp", gamma=gamma, embed_gamma=embed_gamma):
        (grad,) = torch.autograd.grad(net(x)[:, target].sum(), x)
    return x.detach() * grad


@pytest.mark.parametrize(("gamma", "embed_gamma"), [(0.25, 0.25), (1.0, 0.1), (0.05, 100.0)])
def test_the_gamma_rule_equals_zennits(gamma, embed_gamma):
    """Signed inputs and outputs of both signs through convolutions (with and without bias), ReLU and linear layers:
    zennit's Gamma(gamma), relevance per input element, to float64 rounding."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 6, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(6, 8, 2, stride=2, bias=False), nn.Flatten(),
        nn.Linear(8 * 2 * 2, 16), nn.ReLU(), nn.Linear(16, 3),
    ).double()  # fmt: skip
    x = torch.randn(5, 3, 8, 8, dtype=torch.float64)
    for target in (0, 2):
        expected = zennit_relevance(net, x, target, gamma, embed_gamma)
        assert float(expected.abs().max()) > 1e-3
        torch.testing.assert_close(ours(net, x, target, gamma, embed_gamma), expected, rtol=1e-9, atol=1e-12)


def test_gamma_zero_is_the_rules_of_the_papers_and_keeps_the_logits(random_vit):
    model = random_vit(img_size=24, patch_size=4, embed_dim=24, depth=2, num_heads=2, num_classes=5, conv_stem=True)
    model = model.double().eval()
    images = torch.randn(3, 3, 24, 24, dtype=torch.float64)
    plain = lrp(model, images, target=[0, 1, 2])
    zero = lrp(model, images, target=[0, 1, 2], gamma=0.0, embed_gamma=0.0)
    assert torch.equal(plain.pixels, zero.pixels)
    for gamma, embed_gamma in ((0.25, None), (0.0, 1.0), (1.0, 0.0)):
        tuned = lrp(model, images, target=[0, 1, 2], gamma=gamma, embed_gamma=embed_gamma)
        assert torch.equal(tuned.logits, plain.logits)  # the rule changes the backward pass only
        assert float((tuned.pixels - plain.pixels).abs().max()) > 1e-3 * float(plain.pixels.abs().max())
    assert not any(module._forward_hooks for module in model.modules())
    assert all(p.grad is None for p in model.parameters())


def test_the_gamma_rule_conserves_relevance_in_a_vit_without_biases(random_vit):
    """With biases, tokens and position embeddings at zero, each gamma layer passes on all it receives (but the
    stabiliser's 1e-6), and CP-LRP's other rules conserve too: the pixels sum to the logit."""
    model = random_vit(img_size=24, patch_size=4, embed_dim=24, depth=2, num_heads=2, num_classes=5)
    model = model.double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name in ("cls_token", "reg_token", "pos_embed"):
                p.zero_()
    images = torch.randn(3, 3, 24, 24, dtype=torch.float64)
    result = lrp(model, images, variant="cp", gamma=0.5, embed_gamma=2.0)
    logit = result.logits.gather(1, result.target[:, None])[:, 0]
    torch.testing.assert_close(result.pixels.sum((1, 2)), logit, rtol=1e-4, atol=1e-8)


@pytest.mark.parametrize("bad", [-0.1, float("inf"), float("nan"), "0.1"])
def test_a_bad_gamma_is_refused(random_vit, bad):
    model = random_vit(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=3)
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        lrp(model, torch.randn(1, 3, 16, 16), gamma=bad)
    with pytest.raises(ValueError, match="embed_gamma must be a finite number >= 0"):
        lrp(model, torch.randn(1, 3, 16, 16), embed_gamma=bad)


@pytest.fixture(scope="module")
def trained(trained_batch):
    """The session's tiny digits model and 12 of its validation images with their labels."""
    model, images, labels = trained_batch
    return model, images[:12], labels[:12]


def test_tune_gamma_measures_every_candidate_and_keeps_the_best(trained):
    """Gammas first (convolutions at 0), then the convolutions' values with the best gamma; each candidate's SRG is
    the method benchmark's for the same options, and the choice follows the tolerance rule."""
    model, images, labels = trained
    tuning = tune_gamma(model, images, labels, removals=("mean", "drop"), gammas=(0.25, 0.0), embed_gammas=(1.0,),
                        steps=3)  # fmt: skip
    pairs = [(c.gamma, c.embed_gamma) for c in tuning.candidates]
    assert pairs[:2] == [(0.0, 0.0), (0.25, 0.0)] and len(pairs) == 3 and pairs[2][1] == 1.0
    for candidate in tuning.candidates:
        options = {"attnlrp": {"gamma": candidate.gamma, "embed_gamma": candidate.embed_gamma}}
        for removal in ("mean", "drop"):
            bench = benchmark_methods(model, images, labels, ["attnlrp"], removal, steps=3, options=options)
            assert candidate.srg[removal] == pytest.approx(bench.scores["attnlrp"].srg, abs=1e-6)
        assert candidate.mean_srg == pytest.approx(sum(candidate.srg.values()) / 2)
    first = tuning.candidates[1] if tuning.candidates[1].mean_srg > tuning.candidates[0].mean_srg + TOLERANCE else (
        tuning.candidates[0])  # fmt: skip
    assert tuning.candidates[2].gamma == first.gamma
    expected = tuning.candidates[2] if tuning.candidates[2].mean_srg > first.mean_srg + TOLERANCE else first
    assert tuning.chosen is expected
    assert tuning.options() == {"gamma": expected.gamma, "embed_gamma": expected.embed_gamma}
    assert tuning.default is tuning.candidates[0]
    assert "<- chosen" in tuning.table().splitlines()[1 + tuning.candidates.index(expected)]


def test_a_gain_within_noise_keeps_the_default(trained):
    """A convolution gamma of 1e-9 draws the same maps as 0 up to rounding: whatever the sign of the difference in
    the last digits, the default stays."""
    model, images, labels = trained
    tuning = tune_gamma(model, images, labels, removals=("mean",), gammas=(), embed_gammas=(1e-9,), steps=3)
    assert [(c.gamma, c.embed_gamma) for c in tuning.candidates] == [(0.0, 0.0), (0.0, 1e-9)]
    assert tuning.options() == {"gamma": 0.0, "embed_gamma": 0.0}


def test_tune_gamma_refuses_what_it_cannot_measure(trained, random_vit):
    model, images, labels = trained
    with pytest.raises(ValueError, match="only attnlrp and cp_lrp have a gamma rule to tune, got 'rollout'"):
        tune_gamma(model, images, method="rollout")
    with pytest.raises(ValueError, match="target='label' needs labels"):
        tune_gamma(model, images, target="label")
    with pytest.raises(ValueError, match="gamma values must be finite and >= 0"):
        tune_gamma(model, images, gammas=(-1.0,))
    window = random_vit(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=3, window_size=2)
    with pytest.raises(ValueError, match="token drop does not apply to this model"):
        tune_gamma(window, torch.randn(2, 3, 16, 16), removals=("drop",))


def test_the_training_callback_draws_with_the_tuned_options(trained):
    """``method_options`` reach the callback's maps: its AttnLRP map is lrp's with the same gamma, not the default."""
    with pytest.raises(ValueError, match="nope"):
        ExplanationLogger(method_options={"nope": {"gamma": 0.1}})
    model, images, _ = trained
    options = {"gamma": 0.25, "embed_gamma": 1.0}
    logger = ExplanationLogger(num_images=4, method_options={"attnlrp": options}, statistics=False, attribution=False)
    logger.images = images[:4]
    drawn = logger._explain(model, epoch=0, score=False).maps["attnlrp"]
    torch.testing.assert_close(drawn, lrp(model, images[:4], **options).patches.float())
    assert float((drawn - lrp(model, images[:4]).patches.float()).abs().max()) > 1e-4
