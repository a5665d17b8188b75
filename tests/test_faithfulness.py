"""Deletion / insertion areas on a hand-built model whose answer depends on four known patches."""

from __future__ import annotations

import importlib
import io
import math
import re
import sys
from functools import partial

import pytest
import torch
from torch import nn
from tqdm import tqdm

from vit.explain.faithfulness import faithfulness, gaussian_blur, removal_counts

KEYS = (0, 5, 10, 15)  # the diagonal of a 4 x 4 grid of 2 x 2-pixel patches on 8 x 8 images


class KeyPatches(nn.Module):
    """p = 0.1 + 0.8 · (mean pixel of the key patches, channel 0); logits log(p), log(1 - p), so softmax = (p, 1 - p).

    With images of ones and a zero baseline, p = 0.1 + 0.2 · (key patches intact): 0.9 intact, 0.1 with all gone.
    """

    def __init__(self) -> None:
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))  # gives faithfulness a device to read
        self.calls = 0

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        patches = images[:, 0].unfold(1, 2, 2).unfold(2, 2, 2).mean((-1, -2)).flatten(1)  # (B, 16)
        p = 0.1 + 0.8 * patches[:, list(KEYS)].mean(1) + self.dummy
        return torch.stack([p.log(), (1 - p).log()], dim=1)


def ranked(first: list[int]) -> torch.Tensor:
    """A 4 x 4 map ranking the patches ``first`` highest (in that order), every other patch below them."""
    relevance = torch.zeros(16)
    for i, patch in enumerate(first):
        relevance[patch] = 100.0 - i
    return relevance.view(4, 4)


def trapezoid(ys: list[float], dx: float) -> float:
    return sum((a + b) / 2 * dx for a, b in zip(ys, ys[1:], strict=False))


def test_removal_counts_round_half_up():
    assert removal_counts(16, 4) == [0, 4, 8, 12, 16]
    assert removal_counts(16, 10) == [0, 2, 3, 5, 6, 8, 10, 11, 13, 14, 16]
    assert removal_counts(3, 2) == [0, 2, 3]


def test_areas_by_hand():
    model = KeyPatches()
    images = torch.ones(3, 3, 8, 8)
    others = [p for p in range(16) if p not in KEYS]
    maps = {
        "perfect": torch.stack([ranked(list(KEYS)), ranked(list(KEYS)), ranked(list(KEYS))]),
        # keys last / two keys first and two last / keys first again
        "mixed": torch.stack([ranked(others), ranked([0, 5, *others]), ranked(list(KEYS))]),
    }
    result = faithfulness(model, images, maps, steps=4, num_random=3)

    assert result["fractions"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert result["target"] == [0, 0, 0] and result["num_images"] == 3
    # perfect: deletion 0.9, 0.1, 0.1, 0.1, 0.1 -> 0.2; insertion 0.1, 0.9, 0.9, 0.9, 0.9 -> 0.8.
    assert result["per_image"]["deletion_auc"]["perfect"] == pytest.approx([0.2] * 3)
    assert result["per_image"]["insertion_auc"]["perfect"] == pytest.approx([0.8] * 3)
    assert result["deletion_curve"]["perfect"] == pytest.approx([0.9, 0.1, 0.1, 0.1, 0.1])
    # keys last: deletion 0.9 x 4, 0.1 -> 0.8; insertion 0.1 x 4, 0.9 -> 0.2.
    # two first (patches 0, 5 and two others in the first quarter): deletion 0.9, 0.5, 0.5, 0.5, 0.1 -> 0.5.
    assert result["per_image"]["deletion_auc"]["mixed"] == pytest.approx([0.8, 0.5, 0.2])
    assert result["per_image"]["insertion_auc"]["mixed"] == pytest.approx([0.2, 0.5, 0.8])
    assert result["deletion_auc"]["mixed"] == pytest.approx(0.5)

    # random: seed s draws one randperm per image; p after removing the first k patches counts the keys among them.
    expected = []
    for image in range(3):
        aucs = []
        for seed in range(3):
            generator = torch.Generator().manual_seed(seed)
            perms = [torch.randperm(16, generator=generator).tolist() for _ in range(3)]
            ys = [0.9 - 0.2 * sum(p in KEYS for p in perms[image][:k]) for k in (0, 4, 8, 12, 16)]
            aucs.append(trapezoid(ys, 0.25))
        expected.append(sum(aucs) / 3)
    assert result["per_image"]["deletion_auc"]["random"] == pytest.approx(expected)
    assert result["deletion_auc"]["random"] == pytest.approx(sum(expected) / 3)
    # Every insertion curve here mirrors its deletion curve: p_ins(k) = 1 - p_del(k).
    assert result["insertion_auc"]["random"] == pytest.approx(1 - result["deletion_auc"]["random"])


def test_explicit_target_and_steps_that_do_not_divide_the_grid():
    model = KeyPatches()
    images = torch.ones(1, 3, 8, 8)
    # Target class 1 (probability 1 - p): deletion with keys first 0.1, 0.9, ..., insertion 0.9, 0.1, ...
    result = faithfulness(model, images, {"perfect": ranked(list(KEYS))[None]}, target=[1], steps=4, num_random=0)
    assert result["deletion_auc"] == {"perfect": pytest.approx(0.8)}
    assert result["insertion_auc"] == {"perfect": pytest.approx(0.2)}
    # steps=3 removes 0, 5, 11, 16 patches (fractions 0, 5/16, 11/16, 1): keys first -> 0.9, 0.1, 0.1, 0.1.
    result = faithfulness(model, images, {"perfect": ranked(list(KEYS))[None]}, steps=3, num_random=0)
    assert result["fractions"] == [0, 5 / 16, 11 / 16, 1]
    assert result["deletion_auc"]["perfect"] == pytest.approx(5 / 16 * 0.5 + 11 / 16 * 0.1)


def test_blur_baseline():
    model = KeyPatches()
    # A constant image blurs to itself: nothing changes when patches are replaced, every curve stays at 0.9.
    result = faithfulness(model, torch.ones(1, 3, 8, 8), {"m": ranked(list(KEYS))[None]}, baseline="blur", steps=2)
    assert result["deletion_auc"] == {"m": pytest.approx(0.9), "random": pytest.approx(0.9)}
    # The blur is a normalised Gaussian of sigma = 1 pixel (half of a 2-pixel patch), radius 3.
    delta = torch.zeros(1, 1, 9, 9)
    delta[0, 0, 4, 4] = 1.0
    blurred = gaussian_blur(delta, sigma=1.0)[0, 0]
    g = torch.tensor([math.exp(-(i**2) / 2) for i in range(-3, 4)])
    g = g / g.sum()
    torch.testing.assert_close(blurred[1:8, 1:8], g[:, None] * g[None, :])
    assert blurred.sum().item() == pytest.approx(1.0)


def test_model_left_as_it_was_and_bad_arguments():
    model = KeyPatches().train()
    images = torch.ones(2, 3, 8, 8)
    faithfulness(model, images, {"m": torch.rand(2, 4, 4)}, steps=2, num_random=1)
    assert model.training and model.dummy.grad is None
    with pytest.raises(ValueError, match="reserved"):
        faithfulness(model, images, {"random": torch.rand(2, 4, 4)})
    with pytest.raises(ValueError, match=r"maps must all be \(B=2"):
        faithfulness(model, images, {"a": torch.rand(2, 4, 4), "b": torch.rand(2, 2, 2)})
    with pytest.raises(ValueError, match="does not divide 8x8"):
        faithfulness(model, images, {"a": torch.rand(2, 3, 3)})
    with pytest.raises(ValueError, match="target class 2 out of range"):
        faithfulness(model, images, {"a": torch.rand(2, 4, 4)}, target=2)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        faithfulness(model, images, {"a": torch.rand(2, 4, 4)}, steps=0)
    with pytest.raises(ValueError, match="baseline must be"):
        faithfulness(model, images, {"a": torch.rand(2, 4, 4)}, baseline="noise")
    assert model.training


def test_chunks_give_the_same_answer():
    model = KeyPatches()
    torch.manual_seed(0)
    images = torch.rand(5, 3, 8, 8)
    maps = {"m": torch.rand(5, 4, 4)}
    whole = faithfulness(model, images, maps, steps=4, num_random=2, batch_size=1000)
    chunked = faithfulness(model, images, maps, steps=4, num_random=2, batch_size=3)
    for kind in ("deletion_auc", "insertion_auc"):
        for name in ("m", "random"):
            assert chunked["per_image"][kind][name] == pytest.approx(whole["per_image"][kind][name])


def test_silent_by_default_and_one_line_per_order_when_asked(capsys):
    """The default prints nothing (the training callback relies on it); ``show_progress`` writes one plain line per
    map and one for the random order to stderr when it is not a terminal, and changes no number."""
    torch.manual_seed(0)
    images, maps = torch.rand(5, 3, 8, 8), {"a": torch.rand(5, 4, 4), "b": torch.rand(5, 4, 4)}
    quiet = faithfulness(KeyPatches(), images, maps, steps=4, num_random=3, batch_size=6)
    assert capsys.readouterr() == ("", "")
    loud = faithfulness(KeyPatches(), images, maps, steps=4, num_random=3, batch_size=6, show_progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "\r" not in err
    lines = err.splitlines()
    assert len(lines) == 3
    assert re.fullmatch(r"a: deletion/insertion curves of 5 images \(4 steps\) in \d+\.\d s", lines[0])
    assert re.fullmatch(r"b: deletion/insertion curves of 5 images \(4 steps\) in \d+\.\d s", lines[1])
    assert re.fullmatch(r"random: deletion/insertion curves of 5 images x 3 seeds \(4 steps\) in \d+\.\d s", lines[2])
    assert loud == quiet


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_counts_every_image(monkeypatch):
    """On a terminal each order gets a bar updated in place up to its images (x seeds), cleared before its line."""
    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    module = importlib.import_module("vit.explain.progress")
    monkeypatch.setattr(module, "tqdm", partial(tqdm, mininterval=0, miniters=1))  # draw every update
    torch.manual_seed(0)
    # batch_size 6 over 2 · 3 inner steps: one image per forward chunk, so the bar moves image by image.
    faithfulness(KeyPatches(), torch.rand(5, 3, 8, 8), {"a": torch.rand(5, 4, 4)}, steps=4, num_random=3,
                 batch_size=6, show_progress=True)  # fmt: skip
    text = stream.getvalue()
    bar_a, line_a, bar_random, line_random = re.split(r"(\w+: deletion/insertion curves of [^\r\n]+)\n", text)[:4]
    assert [f"{i}/5 " in bar_a for i in range(6)] == [True] * 6 and bar_a.startswith("\r")
    assert [f"{i}/15 " in bar_random for i in (0, 5, 15)] == [True] * 3 and "16/15" not in bar_random
    assert re.search(r"\r\s+\r$", bar_a) and re.search(r"\r\s+\r$", bar_random)  # cleared before the line
    assert re.fullmatch(r"a: deletion/insertion curves of 5 images \(4 steps\) in \d+\.\d s", line_a)
    assert line_random.startswith("random: deletion/insertion curves of 5 images x 3 seeds (4 steps) in ")


@pytest.mark.parametrize("batch_size", [5, 64])
def test_road_curves_equal_one_imputation_per_image_and_point(random_vit, monkeypatch, batch_size):
    """ROAD imputes every view of a chunk in one solve: the curves equal imputing each image at each point alone."""
    from vit.explain.removal import road_impute

    monkeypatch.setattr(
        importlib.import_module("vit.explain.faithfulness"), "road_impute", partial(road_impute, noise=0.0)
    )  # the noise is drawn per call
    torch.manual_seed(0)
    model = random_vit(img_size=8, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=5).eval()
    images, relevance = torch.randn(3, 3, 8, 8), torch.rand(3, 2, 2)
    result = faithfulness(model, images, {"m": relevance}, steps=4, baseline="road", num_random=0,
                          batch_size=batch_size)  # fmt: skip
    order = relevance.flatten(1).argsort(dim=1, descending=True, stable=True)
    with torch.no_grad():
        target = model(images).argmax(-1)
        for kind, removed in (("deletion", lambda o, k: o[:k]), ("lerf", lambda o, k: o[4 - k :]),
                              ("insertion", lambda o, k: o[k:])):  # fmt: skip
            expected = []
            for k in range(5):
                probs = []
                for b in range(3):
                    mask = torch.zeros(4, dtype=torch.bool)
                    mask[removed(order[b], k)] = True
                    pixels = mask.view(1, 2, 2).repeat_interleave(4, 1).repeat_interleave(4, 2)
                    imputed = road_impute(images[b : b + 1], pixels[None], noise=0.0)
                    probs.append(model(imputed).softmax(-1)[0, target[b]])
                expected.append(float(torch.stack(probs).mean()))
            assert result[f"{kind}_curve"]["m"] == pytest.approx(expected, abs=1e-5), kind
