"""Ways of removing a patch: ROAD's imputation against pytorch-grad-cam's, token drop against timm's PatchDropout, the
deletion and least-relevant-first curves against Quantus's region perturbation, and SRG against its definition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vit.explain import faithfulness
from vit.explain.removal import drop_reason, kept_probabilities, road_impute


@pytest.fixture(scope="module")
def photos() -> torch.Tensor:
    """Two 32x32 crops of scikit-learn's sample photographs, as floats in [0, 1]."""
    from sklearn.datasets import load_sample_images

    crops = [torch.from_numpy(image[100:132, 200:232].copy()).permute(2, 0, 1).float() / 255 for image in
             load_sample_images().images]  # fmt: skip
    return torch.stack(crops)


def patch_mask(removed: torch.Tensor, patch: int) -> torch.Tensor:
    return removed.repeat_interleave(patch, dim=1).repeat_interleave(patch, dim=2)


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_road_imputation_equals_pytorch_grad_cams(photos, fraction):
    """Without noise, the conjugate-gradient solution is grad-cam's sparse direct solve (the ROAD authors' code)."""
    road = pytest.importorskip("pytorch_grad_cam.metrics.road", reason="grad-cam is the explain extra")
    generator = torch.Generator().manual_seed(1)
    removed = patch_mask(torch.rand(2, 8, 8, generator=generator) < fraction, 4)
    ours = road_impute(photos, removed, noise=0.0)
    imputer = road.NoisyLinearImputer(noise=0.0)
    theirs = torch.stack([imputer(image, (~mask).float()) for image, mask in zip(photos, removed, strict=True)])
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=0)
    assert torch.equal(ours[~removed[:, None].expand_as(ours)], photos[~removed[:, None].expand_as(photos)])


def test_road_noise_and_nothing_left(photos):
    removed = patch_mask(torch.zeros(2, 8, 8, dtype=torch.bool).index_fill_(1, torch.tensor([2, 3, 4]), True), 4)
    plain = road_impute(photos, removed, noise=0.0)
    noisy = road_impute(photos, removed, generator=torch.Generator().manual_seed(0))
    difference = (noisy - plain)[removed[:, None].expand_as(plain)]
    assert difference.std().item() == pytest.approx(0.01, rel=0.05) and abs(difference.mean().item()) < 1e-3
    assert torch.equal((noisy - plain)[~removed[:, None].expand_as(plain)], torch.zeros(2 * 3 * 32 * 32 - 2 * 3 * 384))
    everything = road_impute(photos, torch.ones(2, 32, 32, dtype=torch.bool))
    assert torch.equal(everything, torch.zeros_like(photos))  # nothing to impute from: the dataset mean


def test_token_drop_equals_timms_patch_dropout(random_vit):
    """timm's PatchDropout (training mode) keeps the tokens of ``randn(B, N).argsort()[:, :K]``; with the same draw,
    keeping those patches gives the same probabilities (global attention and mean pooling ignore token order)."""
    model = random_vit(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=5,
                       patch_drop_rate=0.25, class_token=False, global_pool="avg").eval()  # fmt: skip
    images, target = torch.randn(3, 3, 16, 16), torch.tensor([0, 3, 4])
    model.patch_drop.train()  # only the dropout draws; everything else evaluates
    torch.manual_seed(7)
    theirs = model(images).softmax(-1).gather(1, target[:, None])[:, 0]
    torch.manual_seed(7)
    keep = torch.randn(3, 16).argsort(dim=-1)[:, :12]
    model.patch_drop.eval()
    torch.testing.assert_close(kept_probabilities(model, images, keep, target), theirs)
    assert model.patch_drop.__class__.__name__ == "PatchDropout"  # given back
    every = kept_probabilities(model, images, torch.arange(16).expand(3, 16), target)
    torch.testing.assert_close(every, model(images).softmax(-1).gather(1, target[:, None])[:, 0])
    nothing = kept_probabilities(model, images, torch.empty(3, 0, dtype=torch.long), target)
    assert torch.equal(nothing, torch.full((3,), 0.2))  # no prefix token and no patch: uniform


def test_token_drop_refused_for_window_blocks_in_one_line(random_vit):
    window = random_vit(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=5, window_size=2)
    assert drop_reason(window) == "blocks 0, 1 use window attention, which needs the whole patch grid"
    with pytest.raises(ValueError, match="^token drop does not apply to this model: blocks 0, 1"):
        faithfulness(window, torch.randn(2, 3, 16, 16), {"m": torch.rand(2, 4, 4)}, baseline="drop")


@pytest.mark.parametrize("removal", ["mean", "road", "drop"])
def test_least_relevant_first_is_deletion_of_the_reversed_map_and_srg_their_gap(random_vit, removal):
    model = random_vit(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=5).eval()
    images, relevance = torch.randn(3, 3, 16, 16), torch.rand(3, 4, 4)
    result = faithfulness(model, images, {"m": relevance, "reversed": -relevance}, steps=4, baseline=removal,
                          num_random=2)  # fmt: skip
    slack = 2e-3 if removal == "road" else 1e-6  # ROAD's noise is drawn afresh for every view
    assert result["lerf_auc"]["m"] == pytest.approx(result["deletion_auc"]["reversed"], abs=slack)
    assert result["lerf_curve"]["m"] == pytest.approx(result["deletion_curve"]["reversed"], abs=slack)
    for name in ("m", "reversed", "random"):
        assert result["srg"][name] == pytest.approx(result["lerf_auc"][name] - result["deletion_auc"][name])
    assert result["srg"]["m"] == pytest.approx(-result["srg"]["reversed"], abs=2 * slack)
    # Both ends are shared: the intact image first, everything removed last (insertion: the other way round).
    assert result["lerf_curve"]["m"][0] == result["deletion_curve"]["m"][0] == result["insertion_curve"]["m"][-1]
    assert result["lerf_curve"]["m"][-1] == result["deletion_curve"]["m"][-1] == result["insertion_curve"]["m"][0]


@pytest.mark.parametrize("removal", ["mean", "drop"])
def test_insertion_keeps_the_most_relevant_patches_that_least_relevant_first_keeps(random_vit, removal):
    """With a point per patch, revealing the k most relevant patches (insertion) and removing the n - k least
    relevant (least relevant first) leave the same patches: the curves are each other's mirror, point for point."""
    model = random_vit(img_size=8, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=5).eval()
    result = faithfulness(model, torch.randn(3, 3, 8, 8), {"m": torch.rand(3, 2, 2)}, steps=4, baseline=removal,
                          num_random=0)  # fmt: skip
    assert result["insertion_curve"]["m"] == pytest.approx(result["lerf_curve"]["m"][::-1], abs=1e-6)


QUANTUS_HINT = (
    "Quantus is not installed: it requires opencv-python, which would shadow the project's opencv-python-headless; "
    "pip install --no-deps quantus pandas scikit-image cachetools (CI does)"
)


@pytest.mark.parametrize("order", ["morf", "lerf"])
def test_deletion_and_lerf_curves_equal_quantus_region_perturbation(random_vit, order):
    """Quantus's RegionPerturbation (Samek et al. 2015) with our patch grid, the removed patch filled with 0 (the
    dataset mean after normalisation: our ``mean`` removal) and one patch per step returns ``p(x) - p(x with k
    patches removed)`` in the map's order; our curve at ``steps = num_patches`` is ``p(x with k removed)``."""
    quantus = pytest.importorskip("quantus", reason=QUANTUS_HINT)
    torch.manual_seed(0)
    model = random_vit(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=5).eval()
    images = torch.randn(4, 3, 16, 16)
    maps = torch.randn(4, 4, 4)  # distinct values: no ties, whose order the two libraries break differently
    target = model(images).argmax(-1)
    ours = faithfulness(model, images, {"map": maps}, target=target, steps=16, num_random=0)
    pixels = maps.repeat_interleave(4, dim=1).repeat_interleave(4, dim=2)[:, None].expand(-1, 3, -1, -1)
    metric = quantus.RegionPerturbation(patch_size=4, order=order, regions_evaluation=16, normalise=False,
                                        perturb_baseline=0.0, disable_warnings=True)  # fmt: skip
    drops = metric(model=model, x_batch=images.numpy(), y_batch=target.numpy(), a_batch=pixels.numpy().copy(),
                   device="cpu", softmax=True, channel_first=True)  # fmt: skip
    intact = model(images).softmax(-1).gather(1, target[:, None])[:, 0].detach().numpy()
    theirs = [float(intact.mean()), *(intact[:, None] - np.asarray(drops)).mean(0)]
    curve = ours["deletion_curve" if order == "morf" else "lerf_curve"]["map"]
    assert curve == pytest.approx(theirs, abs=1e-6)
