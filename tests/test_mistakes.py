"""The most confident mistakes (:func:`vit.explain.worst_mistakes`): which errors, their maps of the predicted and of
the true class, the picture, the report's section and the explorer's "mistakes only" filter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from vit.callbacks import ExplanationLogger
from vit.explain import explain, explain_map, explorer_payload, render_mistakes, worst_mistakes, write_explorer
from vit.explain.choice import MethodChoice, file_sha256, write_choice
from vit.explain.mistakes import collect_mistakes, most_confident_errors
from vit.explain.render.mistakes import render_mistake
from vit.explain.render.report import render_report
from vit.normalize import normalize

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def reference_errors(probs: torch.Tensor, labels: torch.Tensor, num: int) -> list[int]:
    """The errors by a loop: every image whose argmax differs from a known label, by confidence then index."""
    errors = []
    for i in range(len(labels)):
        row = probs[i].tolist()
        pred = max(range(len(row)), key=lambda c: (row[c], -c))
        if labels[i] >= 0 and pred != labels[i]:
            errors.append((-row[pred], i))
    return [i for _, i in sorted(errors)[:num]]


@pytest.mark.parametrize("num", [0, 3, 50])
def test_the_most_confident_errors_are_those_a_loop_finds(num):
    generator = torch.Generator().manual_seed(0)
    probs = torch.rand(40, 5, generator=generator).softmax(dim=1)
    probs[7] = probs[3]  # a tie: the lower index first
    labels = torch.randint(0, 5, (40,), generator=generator)
    labels[[1, 2]] = -1  # unknown labels are never errors
    assert most_confident_errors(probs, labels, num).tolist() == reference_errors(probs, labels, num)


@pytest.fixture
def model_and_pixels(random_vit):
    torch.manual_seed(0)
    model = random_vit(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=4).eval()
    pixels = torch.randint(0, 256, (24, 3, 16, 16), dtype=torch.uint8)
    return model, pixels


def test_each_mistake_has_the_map_of_its_predicted_and_of_its_true_class(model_and_pixels, one_thread):
    model, pixels = model_and_pixels
    inputs = normalize(pixels, MEAN, STD)
    probs = model(inputs).softmax(-1)
    labels = (probs.argmax(-1) + torch.arange(24) % 2) % 4  # every other image predicted wrong
    mistakes = worst_mistakes(model, pixels, labels, num=5, mean=MEAN, std=STD, class_names=list("abcd"))
    expected = reference_errors(probs.detach(), labels, 5)
    assert mistakes.indices.tolist() == expected and mistakes.num_errors == 12 and mistakes.num_images == 24
    assert torch.equal(mistakes.labels, labels[expected])
    assert torch.equal(mistakes.preds, probs.argmax(-1)[expected])
    torch.testing.assert_close(mistakes.confidence, probs.detach().max(-1).values[expected])
    torch.testing.assert_close(mistakes.true_prob, probs.detach()[expected, labels[expected]])
    for maps, target in ((mistakes.predicted_maps, mistakes.preds), (mistakes.true_maps, mistakes.labels)):
        torch.testing.assert_close(maps, explain_map(model, inputs[expected], "attnlrp", target).patches.float())
    assert float((mistakes.predicted_maps - mistakes.true_maps).abs().max()) > 1e-4
    top = mistakes.captions()[0]
    assert top == f"true {'abcd'[labels[expected[0]]]} · pred {'abcd'[mistakes.preds[0]]} " \
                  f"({100 * float(mistakes.confidence[0]):.0f} %)"  # fmt: skip
    rows = mistakes.to_dict([f"img{i}" for i in range(24)])["mistakes"]
    assert [r["name"] for r in rows] == [f"img{i}" for i in expected]
    # The explanation's probabilities spare the forward pass and give the same mistakes.
    again = worst_mistakes(model, inputs, labels, num=5, method="rollout", probs=probs.detach())
    assert again.indices.tolist() == expected and torch.equal(again.predicted_maps, again.true_maps)
    with pytest.raises(ValueError, match="got 3 labels for 24 images"):
        worst_mistakes(model, pixels, labels[:3], mean=MEAN, std=STD)


def test_the_picture_puts_the_image_and_both_maps_side_by_side(model_and_pixels, one_thread):
    model, pixels = model_and_pixels
    labels = (model(normalize(pixels, MEAN, STD)).argmax(-1) + 1) % 4  # all wrong
    mistakes = worst_mistakes(model, pixels, labels, num=4, mean=MEAN, std=STD)
    tile = render_mistake(mistakes, 0, size=64, padding=4)
    top = tile.shape[0] - 64 - 4 - round(1.3 * 11)  # the caption above, the names under the pictures
    image = (mistakes.images[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    upscaled = image.repeat(4, axis=0).repeat(4, axis=1)  # 16 -> 64 px, nearest for the comparison
    shown = tile[top : top + 64, 4 : 4 + 64].astype(int)
    assert np.abs(shown - upscaled.astype(int)).mean() < 40  # bicubic, not nearest: close on average
    assert not np.array_equal(tile[top : top + 64, 72:136], tile[top : top + 64, 140:204])  # two different maps
    grid = render_mistakes(mistakes, ncols=2, size=64)
    assert grid.dtype == np.uint8 and grid.shape[1] >= 2 * tile.shape[1]
    none = worst_mistakes(model, pixels, model(normalize(pixels, MEAN, STD)).argmax(-1), mean=MEAN, std=STD)
    assert len(none) == 0 and render_mistakes(none) is None


def page_with_mistakes(model, pixels, tmp_path: Path) -> tuple[Path, list[int]]:
    inputs = normalize(pixels, MEAN, STD)
    probs = model(inputs).softmax(-1).detach()
    labels = probs.argmax(-1).clone()
    labels[[2, 5, 7]] = (labels[[2, 5, 7]] + 1) % 4
    explanation = explain(model, pixels[:8], ["attnlrp"], mean=MEAN, std=STD, labels=labels[:8])
    mistakes = worst_mistakes(model, pixels[:8], labels[:8], mean=MEAN, std=STD, probs=explanation.probs)
    html = render_report([Path(f"val/{i}") for i in range(8)], explanation, model=model, pixels=pixels[:8], mean=MEAN,
                         std=STD, mistakes=mistakes)  # fmt: skip
    path = tmp_path / "report.html"
    path.write_text(html, encoding="utf-8")
    order = sorted([2, 5, 7], key=lambda i: (-float(probs[i].max()), i))
    return path, order


def test_the_report_has_a_section_of_the_mistakes(model_and_pixels, tmp_path, one_thread):
    model, pixels = model_and_pixels
    path, order = page_with_mistakes(model, pixels, tmp_path)
    text = path.read_text(encoding="utf-8")
    assert text.count('<figure class="mistake">') == 3 and 'id="mistakes"' in text
    assert "of 3 errors among the 8 images" in text


@pytest.mark.slow
def test_the_explorer_filters_the_mistakes_most_confident_first(browser, model_and_pixels, tmp_path, one_thread):
    from browser import Page

    model, pixels = model_and_pixels
    path, order = page_with_mistakes(model, pixels, tmp_path)
    page = Page(browser, path)
    assert page.js("() => window.explorer.shown()") == list(range(8))
    assert page.page.locator("#mistakes-count").inner_text() == "3"
    page.page.locator("#mistakes-only").check()
    page.settle()
    assert page.js("() => window.explorer.shown()") == order
    assert page.js("() => window.explorer.state.image") == order[0]  # image 0 was right: the first mistake is shown
    page.page.locator("#mistakes-only").uncheck()
    page.settle()
    assert page.js("() => window.explorer.shown()") == list(range(8)) and page.errors == []
    # Without a wrong prediction there is no filter to offer.
    plain = write_explorer(tmp_path / "e.html", explorer_payload(model, pixels[:2], mean=MEAN, std=STD))
    assert Page(browser, plain).js("() => document.getElementById('mistakes-box').hidden")


def test_collecting_over_batches_finds_what_one_search_over_all_finds(model_and_pixels, one_thread):
    """Streaming keeps only the best errors so far: the same mistakes, positions and counts as one search."""
    model, pixels = model_and_pixels
    labels = (model(normalize(pixels, MEAN, STD)).argmax(-1) + torch.arange(24) % 3).clamp(max=3)
    whole = worst_mistakes(model, pixels, labels, num=4, mean=MEAN, std=STD)
    batches = [(pixels[i : i + 5], labels[i : i + 5]) for i in range(0, 24, 5)]
    streamed = collect_mistakes(model, batches, num=4, mean=MEAN, std=STD)
    assert streamed.indices.tolist() == whole.indices.tolist()
    assert (streamed.num_images, streamed.num_errors) == (whole.num_images, whole.num_errors)
    torch.testing.assert_close(streamed.predicted_maps, whole.predicted_maps)


def test_the_training_callback_draws_the_stored_choice_unless_a_method_is_named(trained_checkpoint, tmp_path):
    checkpoint = tmp_path / "last.ckpt"
    shutil.copy(trained_checkpoint, checkpoint)
    write_choice(checkpoint, MethodChoice("cp_lrp", {"cp_lrp": {"gamma": 0.05, "embed_gamma": 0.0}}, 0.3, ["mean"], 8,
                                          file_sha256(checkpoint)))  # fmt: skip
    trainer = SimpleNamespace(ckpt_path=str(checkpoint))
    logger = ExplanationLogger()
    assert logger.method == "attnlrp"
    logger.on_load_checkpoint(trainer, None, {"epoch": 3})
    assert logger.method == "cp_lrp" and logger.explain_kwargs["options"] == {
        "cp_lrp": {"gamma": 0.05, "embed_gamma": 0.0}
    }
    named = ExplanationLogger(method="rollout", method_options={"cp_lrp": {"gamma": 1.0}})
    named.on_load_checkpoint(trainer, None, {"epoch": 3})
    assert named.method == "rollout" and named.explain_kwargs["options"] == {"cp_lrp": {"gamma": 1.0}}


@pytest.mark.slow
def test_the_callback_logs_the_mistakes_to_the_run_folder_and_wandb(tmp_path, monkeypatch, tiny_classifier, digits,
                                                                    cpu_trainer):  # fmt: skip
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(project="test", save_dir=str(tmp_path), offline=True)
    callback = ExplanationLogger(num_images=2, mistakes=3, explorer=False, attribution=False, statistics=False)
    fit = cpu_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=2, callbacks=[callback], logger=logger)
    fit.fit(tiny_classifier(seed=0), digits())
    logger.experiment.finish()
    with Image.open(tmp_path / "rollout" / "mistakes_epoch_000.png") as picture:
        assert picture.width > 2 * 3 * 96
    media = tmp_path / "wandb" / "latest-run" / "files" / "media"
    assert len(list((media / "images" / "val").glob("mistakes_[0-9]*.png"))) == 1
    (table,) = (media / "table" / "val").glob("mistakes_table_*.table.json")
    content = json.loads(table.read_text())
    assert content["columns"][:3] == ["image", "true", "predicted"] and len(content["data"]) == 3
