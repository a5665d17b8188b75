"""The attention explorer where the project writes it, in a real browser: the rollout logger's page (logged to W&B,
keeping the images that fit), the HTML report that opens on it, the benchmark suite's budget case, and the head
importance bars."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from browser import Page, assert_drawn, chromium_path
from explorer_data import MEAN, STD, decode_bound, decode_rows, one_image_page, page_data, stored

from vit.explain import capture_attention
from vit.explain.render.explorer import explorer_payload, write_explorer
from vit.normalize import normalize


@pytest.fixture
def pixels():
    torch.manual_seed(1)
    return torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)


def test_rollout_logger_writes_the_explorer_and_logs_it_to_wandb(browser, tmp_path, monkeypatch):
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import WandbLogger

    from vit import ImageClassifier, ImageDataModule
    from vit.callbacks import AttentionRolloutLogger, explained_model

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    torch.manual_seed(0)
    module = ImageClassifier(
        "vit_tiny_patch4_32", num_classes=10, img_size=32, model_overrides={"depth": 2, "embed_dim": 32, "num_heads": 2}
    )
    callback = AttentionRolloutLogger(num_images=3, statistics=False, faithfulness_every_n=0)
    logger = WandbLogger(project="test", save_dir=str(tmp_path), offline=True)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, accelerator="cpu", max_epochs=2, limit_train_batches=2, limit_val_batches=1,
        num_sanity_val_steps=0, callbacks=[callback], logger=logger, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False,
    )  # fmt: skip
    trainer.fit(module, ImageDataModule(dataset="digits", img_size=32, batch_size=16, num_workers=0, seed=0))
    logger.experiment.finish()

    written = sorted((tmp_path / "rollout").glob("explorer_epoch_*.html"))
    assert [p.name for p in written] == ["explorer_epoch_000.html", "explorer_epoch_001.html"]
    logged = sorted((tmp_path / "wandb" / "latest-run" / "files" / "media" / "html" / "val").glob("*.html"))
    assert len(logged) == 2 and all(p.name.startswith("attention_explorer_") for p in logged)
    last = next(p for p in logged if p.read_bytes() == written[1].read_bytes())  # W&B holds the file as written

    model = explained_model(module)
    record = capture_attention(model, normalize(callback.images, callback.mean, callback.std))
    page = Page(browser, last)
    assert page.js("() => window.explorer.data.images.length") == 3
    grid = model.patch_embed.grid_size
    page.js("() => window.explorer.select({image: 2})")
    page.click_patch(5, 6, grid)
    P = model.num_prefix_tokens
    t = P + 5 * grid[1] + 6
    shown = decode_rows(*stored(page_data(last.read_text(encoding="utf-8")), 2), P, 6)
    for b, attn in enumerate(record):
        truth = attn[2, 1, t].double().numpy()
        row = page.row(b, 1, t)
        np.testing.assert_allclose(row, shown[b, 1, t], rtol=1e-5, atol=1e-7)
        assert np.all(np.abs(row - truth) <= decode_bound(truth, P, 6))
        assert_drawn(page, b, 1, shown[b, 1, t, P:], slack=1)
    assert page.errors == []


def test_report_opens_on_the_explorer_and_keeps_the_summary(browser, tmp_path, class_model, pixels):
    from vit.explain import explain
    from vit.explain.render.report import render_report

    model = class_model
    files = [tmp_path / f"img{i}.png" for i in range(3)]
    results = explain(model, pixels, ["rollout", "attribution"], mean=MEAN, std=STD, faithfulness=True, steps=4)
    page_html = render_report(files, results, "report", model=model, pixels=pixels, mean=MEAN, std=STD)
    (tmp_path / "r.html").write_text(page_html)
    page = Page(browser, tmp_path / "r.html")
    assert page.js("() => window.explorer.data.images.length") == 3
    assert page.js("() => document.getElementById('note').hidden")
    names = page.js("() => Array.from(document.querySelectorAll('#thumbs button'), b => b.title)")
    assert names == [f"{tmp_path.name}/img{i}.png" for i in range(3)]
    attribution = results.maps["attribution"][1].flatten().numpy()
    shown = page.js("() => window.explorer.map('attribution', 1)")  # float16 of the map over its maximum
    np.testing.assert_allclose(shown, attribution, rtol=2**-11, atol=2**-12 * np.abs(attribution).max())
    assert page.page.locator("#report table#faithfulness").count() == 1  # the static summary follows
    faith = page.js("() => Array.from(document.querySelectorAll('#faith td:first-child'), s => s.textContent)")
    assert faith == list(results.faithfulness["deletion_auc"])
    assert page.errors == []

    one = one_image_page(model, pixels, results.maps, attribution=False, faithfulness=results.faithfulness)
    small = render_report(files, results, "r", model=model, pixels=pixels, mean=MEAN, std=STD, max_bytes=one + 1_200,
                          bits=6)  # fmt: skip
    (tmp_path / "s.html").write_text(small)
    page = Page(browser, tmp_path / "s.html")
    count = page.js("() => window.explorer.data.images.length")
    assert 1 <= count < 3
    assert page.page.locator("#note").inner_text() == (
        f"The explorer holds the first {count} of 3 images (the file size limit); the statistics and faithfulness of "
        "the summary below cover all of them."
    )
    assert page.errors == []


def test_report_overlays_stop_at_the_size_limit_with_a_note(tmp_path, class_model, pixels):
    from vit.explain import explain
    from vit.explain.render.report import render_report

    files = [tmp_path / f"img{i}.png" for i in range(3)]
    results = explain(class_model, pixels, ["rollout", "attribution"], mean=MEAN, std=STD, faithfulness=True, steps=4)
    panel = re.compile(r'<div class="panel">.*?</figure></div>')
    whole = render_report(files, results, "report")
    sizes = [len(m.group().encode()) for m in panel.finditer(whole)]
    assert len(sizes) == 3 and "overlays-note" not in whole
    for limit, shown in [(sum(sizes), 3), (sizes[0] + sizes[1], 2), (sizes[0] + sizes[1] - 1, 1), (1, 1)]:
        page = render_report(files, results, "report", max_bytes=limit)
        assert len(panel.findall(page)) == shown, limit
        note = "The overlays of the first {} of 3 images (the file size limit); the statistics and faithfulness"
        assert (note.format(shown) in page) == (shown < 3)
        assert page.count('id="faithfulness"') == 1 and page.count("Per-head attention") == 1  # still every image


def test_benchmark_suite_measures_the_budget_case(browser, tmp_path):
    import subprocess
    import sys

    # In a process of its own: this one already runs Playwright's event loop (the browser fixture).
    command = [sys.executable, "-m", "vit.bench", "--suite", "explorer", "--device", "cpu", "--explorer_cases",
               "cifar10_cpu", "--explorer_browser", chromium_path(), "--explorer_bits", "5",
               "--json", tmp_path / "bench.json"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "bench.json").read_text())
    (row,) = report["explorer"]["rows"]
    assert row["case"] == "cifar10_cpu" and row["images"] == 16 and row["weights"] == "initialised" and row["bits"] == 5
    assert 300_000 < row["bytes"] < 2_000_000 and row["write_s"] > 0
    assert (
        0 < row["click_ms"] <= row["click_max_ms"] and 0 < row["open_ms"] <= row["open_max_ms"] and row["switch_ms"] > 0
    )
    budget, speed = report["explorer"]["checks"]
    assert budget["passed"] == (row["bytes"] <= 1_000_000) and f"{row['bytes']:,} bytes" in budget["detail"]
    assert speed["passed"] == (max(row["open_ms"], row["click_max_ms"]) < 200)
    assert "| cifar10_cpu | 16 | initialised | 5 |" in result.stdout


def test_rollout_logger_keeps_the_images_that_fit(tmp_path):
    import re

    import lightning.pytorch as pl

    from vit import ImageClassifier, ImageDataModule
    from vit.callbacks import AttentionRolloutLogger

    torch.manual_seed(0)
    module = ImageClassifier(
        "vit_tiny_patch4_32", num_classes=10, img_size=32, model_overrides={"depth": 2, "embed_dim": 32, "num_heads": 2}
    )
    callback = AttentionRolloutLogger(num_images=4, statistics=False, faithfulness_every_n=0, explorer_max_bytes=52_000,
                                      explorer_bits=6)  # fmt: skip
    trainer = pl.Trainer(
        default_root_dir=tmp_path, accelerator="cpu", max_epochs=1, limit_train_batches=1, limit_val_batches=1,
        num_sanity_val_steps=0, callbacks=[callback], logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False,
    )  # fmt: skip
    trainer.fit(module, ImageDataModule(dataset="digits", img_size=32, batch_size=16, num_workers=0, seed=0))
    page = (tmp_path / "rollout" / "explorer_epoch_000.html").read_text()
    assert len(page.encode()) <= 52_000
    data = json.loads(re.search(r'id="explorer-data">(.*?)</script>', page, re.S).group(1))
    count = len(data["images"])
    assert 1 <= count < 4
    assert data["note"] == f"The first {count} of the 4 explained images (all would pass the size limit)."
    assert [im["label"] for im in data["images"]] == callback.labels[:count].tolist()


def test_head_importance_bars_and_ranked_heads_select_a_head(browser, tmp_path, class_model, pixels):
    """With the heads' mean-ablation importance, every map of the grid carries a bar as wide as its share of the
    largest drop, the heads are listed most important first, and a click on one selects that block and head."""
    from vit.explain import explain

    ex = explain(class_model, pixels, ["rollout"], mean=MEAN, std=STD, heads=True)
    drops = ex.heads.logit_drop
    payload = explorer_payload(class_model, pixels, mean=MEAN, std=STD, attribution=False, importance=drops)
    page = Page(browser, write_explorer(tmp_path / "e.html", payload))
    listed = page.js("() => Array.from(document.querySelectorAll('#importance button'), b => b.textContent)")
    ranked = sorted(((float(drops[b, h]), b, h) for b in range(2) for h in range(2)), reverse=True)
    assert listed == [f"block {b}, head {h}: {drop:.3f}" for drop, b, h in ranked]
    widths = page.js("() => Array.from(document.querySelectorAll('#heads .cell .bar'), e => e.style.width)")
    top = max(float(drops.max()), 1e-12)
    assert widths == [f"{round(100 * max(0.0, float(drops[b, h])) / top)}%" for b in range(2) for h in range(2)]
    _, b, h = ranked[-1]
    page.page.locator("#importance button").last.click()
    assert page.js("() => [window.explorer.state.block, window.explorer.state.head]") == [b, h]
    assert page.errors == []
    plain_payload = explorer_payload(class_model, pixels, mean=MEAN, std=STD, attribution=False)
    plain = Page(browser, write_explorer(tmp_path / "p.html", plain_payload))
    assert plain.js("() => document.getElementById('importance-box').hidden")
    assert plain.js("() => document.querySelectorAll('#heads .bar').length") == 0
