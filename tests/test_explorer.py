"""The attention explorer (vit.explain.explorer) in a real browser: headless Chromium driven by Playwright.

The page is opened, patches clicked, tokens, blocks, heads and overlays switched, and what it decodes and draws is
read back and compared with the attention vit.explain.capture computes for that query. Without a browser the
browser tests skip, except under CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from browser import Page, chromium_path, expected_index, lut_index

from vit.explain import capture_attention, explorer, rollout_grid
from vit.explain.explorer import ExplorerTooLarge, block_kind, explorer_payload, quantize_rows, write_explorer
from vit.explain.stats import patch_distances, row_entropy
from vit.normalize import normalize

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def assert_drawn(page: Page, b: int, h, values: np.ndarray, slack: int) -> None:
    """The small map of (block b, head h) shows ``values`` (the patch keys), within ``slack`` colour-map steps."""
    drawn = lut_index(page.cell_pixels(b, h))
    np.testing.assert_array_less(np.abs(drawn - expected_index(values)), slack + 1)


@pytest.fixture
def pixels():
    torch.manual_seed(1)
    return torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)


def test_quantize_rows_matches_a_loop_and_stays_within_one_step():
    torch.manual_seed(0)
    attn = torch.rand(2, 5, 7) ** 4
    attn[0, 1, :2] = 0.9  # a sink on the prefix keys
    attn = attn / attn.sum(-1, keepdim=True)
    codes, maxima = quantize_rows(attn, prefix=2)
    assert codes.dtype == np.uint8 and maxima.shape == (2, 5, 2) and maxima.dtype == np.float16
    for i in range(2):
        for q in range(5):
            row = attn[i, q].numpy()
            for keys, g in ((slice(2, None), 0), (slice(0, 2), 1)):
                m = np.float32(np.float16(row[keys].max()))
                np.testing.assert_array_equal(codes[i, q, keys], np.rint(row[keys] / m * 255).clip(0, 255))
                decoded = codes[i, q, keys] / 255 * maxima[i, q, g].astype(np.float32)
                np.testing.assert_array_less(np.abs(decoded - row[keys]), row[keys].max() / 255)


def test_too_many_images_are_refused_with_how_many_fit(tmp_path, random_vit, pixels, monkeypatch):
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4)
    one = len(str(explorer_payload(model, pixels[:1], mean=MEAN, std=STD, max_bytes=None)))
    with pytest.raises(ExplorerTooLarge, match=r"^3 images are too many .* about \d+ fit") as err:
        write_explorer(tmp_path / "e.html", model, pixels, mean=MEAN, std=STD, max_bytes=one + 45_000, batch_size=1)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "e.html").exists() and not list(tmp_path.iterdir())
    seen, real = [], explorer.explain_images  # with a subset note: the first that fit, each image explained once
    monkeypatch.setattr(explorer, "explain_images", lambda m, x, **kw: seen.append(len(x)) or real(m, x, **kw))
    data = explorer_payload(model, pixels, mean=MEAN, std=STD, max_bytes=one + 45_000, batch_size=1, subset_note=str)
    kept = len(data["images"])
    assert 1 <= kept < 3 and data["note"] == str(kept) and sum(seen) == kept + 1
    with pytest.raises(ValueError, match="map 'bad' has shape"):
        write_explorer(tmp_path / "e.html", model, pixels, mean=MEAN, std=STD, maps={"bad": torch.zeros(3, 2, 2)})


HOSTILE = ["{{js}}", "{{data}}", "</script><img src=x onerror=window.hacked=1>", "a & b > c"]


def data_block(page: str) -> str:
    return re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', page, re.S).group(1)


def page_data(page: str) -> dict:
    """The explorer's embedded JSON, parsed strictly (``NaN`` / ``Infinity`` are not JSON and fail here)."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(data_block(page), parse_constant=refuse)


def test_names_and_titles_are_text_never_markup_or_template_fields(tmp_path, random_vit, pixels):
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=4).eval()
    path = write_explorer(tmp_path / "e.html", model, pixels[:1], mean=MEAN, std=STD, attribution=False,
                          class_names=HOSTILE, names=[HOSTILE[2]], title=HOSTILE[0], note=HOSTILE[1])  # fmt: skip
    page = path.read_text(encoding="utf-8")
    data = page_data(page)
    assert data["class_names"] == HOSTILE and data["images"][0]["name"] == HOSTILE[2]
    assert data["title"] == HOSTILE[0] and data["note"] == HOSTILE[1]
    outside = re.sub(r"<script\b.*?</script>", "", page, flags=re.S)
    assert "<img" not in outside.lower()
    assert "<title>{{js}}</title>" in outside and '<h1 id="title">{{js}}</h1>' in outside  # shown, not filled
    assert page.count('"use strict"') == 1  # the script once, not pasted where a name said {{js}}
    assert page.count('id="explorer-data"') == 1
    assert not set("<>&") & set(data_block(page))


def test_non_finite_numbers_are_null_in_the_page(tmp_path, random_vit, pixels):
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=4).eval()
    with torch.no_grad():
        model.head.bias.fill_(float("nan"))  # a model from a diverged epoch: NaN probabilities
    scores = {"deletion_auc": {"rollout": float("nan")}, "insertion_auc": {"rollout": float("inf")}, "steps": 4}
    maps = {"gradxinput": torch.rand(2, 4, 4), "attnlrp": torch.rand(2, 4, 4)}
    path = write_explorer(tmp_path / "e.html", model, pixels[:2], mean=MEAN, std=STD, attribution=False,
                          faithfulness=scores, maps=maps)  # fmt: skip
    data = page_data(path.read_text(encoding="utf-8"))
    assert data["map_names"] == ["attnlrp", "rollout", "gradxinput"]  # opens on the default map
    assert data["faithfulness"] == {"deletion_auc": {"rollout": None}, "insertion_auc": {"rollout": None}, "steps": 4}
    assert all(p is None for im in data["images"] for _, p in im["top"])


def test_block_kind_follows_the_class_hierarchy(random_vit):
    from vit.layers import LinearAttention, NeighborhoodAttention, WindowAttention

    for config, base, kind in (
        (dict(window_size=2, global_attn_indexes=[]), WindowAttention, "window"),
        (dict(window_size=3, window_type="sliding", global_attn_indexes=[]), NeighborhoodAttention, "sliding"),
        (dict(linear_attention=True), LinearAttention, "linear"),
    ):
        attn = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, **config).blocks[0].attn
        assert block_kind(attn) == kind
        attn.__class__ = type("Custom" + base.__name__, (base,), {})  # a user's subclass keeps the pattern
        assert block_kind(attn) == kind
    dense = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2).blocks[0].attn
    assert block_kind(dense) == "global"


def test_hostile_names_and_non_finite_numbers_show_as_text(browser, tmp_path, random_vit, pixels):
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=4).eval()
    with torch.no_grad():
        model.head.bias.fill_(float("nan"))
    scores = {"deletion_auc": {HOSTILE[2]: float("nan")}, "insertion_auc": {HOSTILE[2]: 0.5}}
    write_explorer(tmp_path / "e.html", model, pixels[:1], mean=MEAN, std=STD, attribution=False,
                   class_names=HOSTILE, names=[HOSTILE[2]], title=HOSTILE[0], faithfulness=scores)  # fmt: skip
    page = Page(browser, tmp_path / "e.html")
    assert page.js("() => document.title") == HOSTILE[0]
    assert page.page.locator("#caption").inner_text().startswith(HOSTILE[2] + " · ")
    assert page.js("() => document.querySelectorAll('img[src=\"x\"]').length") == 0
    assert page.js("() => window.hacked === undefined")
    faith = page.js("() => Array.from(document.querySelectorAll('#faith td'), s => s.textContent)")
    assert faith == [HOSTILE[2], "–", "0.500"]
    top = page.js("() => Array.from(document.querySelectorAll('#top .bar span:last-child'), s => s.textContent)")
    assert top == ["–"] * 4
    assert page.errors == []


@pytest.fixture
def class_model(random_vit):
    """Global attention with a class token, two register tokens and an attention-pooling head."""
    torch.manual_seed(0)
    return random_vit(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5, reg_tokens=2, global_pool="map"
    ).eval()


def test_clicked_patch_and_tokens_show_the_captured_attention(browser, tmp_path, class_model, pixels):
    model = class_model
    write_explorer(tmp_path / "e.html", model, pixels, mean=MEAN, std=STD, class_names=list("abcde"))
    inputs = normalize(pixels, MEAN, STD)
    record = capture_attention(model, inputs)
    P, grid = model.num_prefix_tokens, model.patch_embed.grid_size
    distances = patch_distances(grid, model.patch_embed.patch_size).numpy()
    page = Page(browser, tmp_path / "e.html")
    page.js("() => window.explorer.select({image: 1})")
    for r, c in ((0, 0), (2, 3), (3, 1)):
        page.click_patch(r, c, grid)
        t = P + r * grid[1] + c
        assert page.state()["query"] == {"kind": "token", "index": t}
        for b, attn in enumerate(record):
            for h in (0, 1, "mean"):
                truth = attn[1, :, t].mean(0) if h == "mean" else attn[1, h, t]
                row = page.row(b, h, t)
                groups = (truth[P:].max(), truth[:P].max())  # one quantisation step per key group
                step = np.array([groups[1]] * P + [groups[0]] * (len(truth) - P)) / 255
                np.testing.assert_array_less(np.abs(row - truth.numpy()), step + 1e-6)
                assert_drawn(page, b, h, truth[P:].numpy(), slack=2)
            page.js("([b]) => window.explorer.select({block: b, head: 1})", [b])
            entropy, distance = page.cell_stats(b)
            truth = attn[1, 1, t].double()
            assert entropy == pytest.approx(float(row_entropy(truth)), abs=0.02)
            patches = truth[P:].numpy()
            assert distance == pytest.approx(float((patches * distances[t - P]).sum() / patches.sum()), rel=0.02)
    page.page.keyboard.press("ArrowLeft")  # from (3, 1) to (3, 0)
    page.settle()
    assert page.state()["query"]["index"] == P + 3 * grid[1]
    page.page.get_by_role("button", name="class token").click()
    page.settle()
    assert_drawn(page, 1, 0, record[1][1, 0, 0, P:].numpy(), slack=2)
    assert page.cell_stats(1)[1] is None  # a token has no position: no distance
    page.page.get_by_role("button", name="reg 1").click()
    page.settle()
    assert page.state()["query"]["index"] == 2
    assert_drawn(page, 0, 1, record[0][1, 1, 2, P:].numpy(), slack=2)
    page.page.get_by_role("button", name="MAP query 0").click()
    page.settle()
    pool = np.array(page.js("() => window.explorer.poolRow(0, 0)"))
    np.testing.assert_array_less(np.abs(pool - record.pool[1, 0, 0].numpy()), record.pool[1, 0, 0].max() / 255 + 1e-6)
    assert_drawn(page, -1, "mean", record.pool[1, :, 0].mean(0).numpy(), slack=2)
    assert page.page.locator("tr.off").count() == 2  # the blocks have no row for the latent query
    assert page.errors == []


def test_overlays_and_prediction(browser, tmp_path, class_model, pixels):
    model = class_model
    inputs = normalize(pixels, MEAN, STD)
    custom = torch.rand(3, 4, 4)
    scores = {"deletion_auc": {"rollout": 0.25, "custom": 0.5}, "insertion_auc": {"rollout": 0.75, "custom": 0.5}}
    write_explorer(tmp_path / "e.html", model, pixels, mean=MEAN, std=STD, maps={"custom": custom},
                   faithfulness=scores)  # fmt: skip
    page = Page(browser, tmp_path / "e.html")
    options = page.js("() => Array.from(document.querySelectorAll('#overlay option'), o => o.value)")
    assert options == ["attention", "rollout", "attribution", "custom", "none"]
    record = capture_attention(model, inputs)
    rollout = rollout_grid(model, record)
    page.js("() => window.explorer.select({image: 2})")
    for name, values in (("rollout", rollout[2]), ("custom", custom[2])):
        page.page.select_option("#overlay", name)
        page.settle()
        drawn = page.js(
            "() => Array.from(document.querySelector('#overlay-map').getContext('2d').getImageData(0, 0, 4, 4).data)"
        )
        got = lut_index(np.array(drawn).reshape(-1, 4)[:, :3])
        np.testing.assert_array_less(np.abs(got - expected_index(values.flatten().numpy())), 2)
    probs = model(inputs).softmax(-1)[2]
    top = page.js("() => Array.from(document.querySelectorAll('#top .bar span:last-child'), s => s.textContent)")
    assert top == [f"{100 * p:.1f} %" for p in probs.sort(descending=True).values.tolist()]
    faith = page.js("() => Array.from(document.querySelectorAll('#faith td'), s => s.textContent)")
    assert faith == ["rollout", "0.250", "0.750", "custom", "0.500", "0.500"]
    assert page.errors == []


@pytest.mark.parametrize(
    "config",
    [
        dict(window_size=2, shift_windows=True, global_attn_indexes=[]),
        dict(window_size=3, window_type="sliding", global_attn_indexes=[]),
        dict(linear_attention=True),
    ],
    ids=["window", "sliding", "linear"],
)
def test_window_sliding_and_linear_blocks(browser, tmp_path, random_vit, pixels, config):
    torch.manual_seed(0)
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4, **config).eval()
    write_explorer(tmp_path / "e.html", model, pixels[:1], mean=MEAN, std=STD, attribution=False)
    record = capture_attention(model, normalize(pixels[:1], MEAN, STD))
    P, grid = model.num_prefix_tokens, model.patch_embed.grid_size
    page = Page(browser, tmp_path / "e.html")
    labels = page.js("() => Array.from(document.querySelectorAll('td.block small'), s => s.textContent)")
    kind = {"window": "window", "sliding": "sliding window", "linear": "linear (implicit)"}
    page.click_patch(1, 2, grid)
    t = P + 1 * grid[1] + 2
    for b, attn in enumerate(record):
        module = model.blocks[b].attn
        expected = kind["linear" if config.get("linear_attention") else config.get("window_type", "window")]
        assert labels[b] == expected
        assert_drawn(page, b, 0, attn[0, 0, t, P:].numpy(), slack=2)
        allowed = page.js("([b]) => window.explorer.allowed(b)", [b])
        if expected == "linear (implicit)":
            assert allowed is None
        else:
            assert allowed == module.dense_mask()[t, P:].int().tolist()
            assert 0 < sum(allowed) < len(allowed)
    assert page.errors == []


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
    t = model.num_prefix_tokens + 5 * grid[1] + 6
    for b, attn in enumerate(record):
        truth = attn[2, 1, t]
        row = page.row(b, 1, t)
        np.testing.assert_array_less(np.abs(row - truth.numpy()), truth.max().item() / 255 + 1e-6)
        assert_drawn(page, b, 1, truth[model.num_prefix_tokens :].numpy(), slack=2)
    assert page.errors == []


def test_report_opens_on_the_explorer_and_keeps_the_summary(browser, tmp_path, class_model, pixels):
    from vit.explain import compute
    from vit.explain.report import render_report

    model = class_model
    files = [tmp_path / f"img{i}.png" for i in range(3)]
    results = compute(model, pixels, mean=MEAN, std=STD, faithfulness_steps=4)
    page_html = render_report(files, results, "report", model=model, pixels=pixels, mean=MEAN, std=STD)
    (tmp_path / "r.html").write_text(page_html)
    page = Page(browser, tmp_path / "r.html")
    assert page.js("() => window.explorer.data.images.length") == 3
    assert page.js("() => document.getElementById('note').hidden")
    names = page.js("() => Array.from(document.querySelectorAll('#thumbs button'), b => b.title)")
    assert names == [f"{tmp_path.name}/img{i}.png" for i in range(3)]
    maps = page.js("() => window.explorer.data.images[1].maps")
    np.testing.assert_allclose(maps["attribution"], results.attribution[1].flatten().numpy(), atol=1e-5)
    assert page.page.locator("#report table#faithfulness").count() == 1  # the static summary follows
    faith = page.js("() => Array.from(document.querySelectorAll('#faith td:first-child'), s => s.textContent)")
    assert faith == list(results.faithfulness["deletion_auc"])
    assert page.errors == []

    one = len(str(explorer_payload(model, pixels[:1], mean=MEAN, std=STD, max_bytes=None)))
    small = render_report(files, results, "r", model=model, pixels=pixels, mean=MEAN, std=STD, max_bytes=one + 45_000)
    (tmp_path / "s.html").write_text(small)
    page = Page(browser, tmp_path / "s.html")
    count = page.js("() => window.explorer.data.images.length")
    assert 1 <= count < 3
    assert page.page.locator("#note").inner_text() == (
        f"The explorer holds the first {count} of 3 images (the file size limit); the summary below covers all of them."
    )
    assert page.errors == []


def test_benchmark_suite_measures_the_budget_case(browser, tmp_path):
    import json
    import subprocess
    import sys

    # In a process of its own: this one already runs Playwright's event loop (the browser fixture).
    command = [sys.executable, "-m", "vit.bench", "--suite", "explorer", "--device", "cpu", "--explorer-cases",
               "cifar10_cpu", "--explorer-browser", chromium_path(), "--json", tmp_path / "bench.json"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "bench.json").read_text())
    (row,) = report["explorer"]["rows"]
    assert row["case"] == "cifar10_cpu" and row["images"] == 16 and row["weights"] == "initialised"
    assert 300_000 < row["bytes"] < 2_000_000 and row["write_s"] > 0
    assert 0 < row["click_ms"] <= row["click_max_ms"] and row["open_ms"] > 0 and row["switch_ms"] > 0
    budget, speed = report["explorer"]["checks"]
    assert budget["passed"] == (row["bytes"] <= 1_000_000) and f"{row['bytes']:,} bytes" in budget["detail"]
    assert speed["passed"] == (max(row["open_ms"], row["click_max_ms"]) < 200)
    assert "| cifar10_cpu | 16 | initialised |" in result.stdout


def test_rollout_logger_keeps_the_images_that_fit(tmp_path):
    import json
    import re

    import lightning.pytorch as pl

    from vit import ImageClassifier, ImageDataModule
    from vit.callbacks import AttentionRolloutLogger

    torch.manual_seed(0)
    module = ImageClassifier(
        "vit_tiny_patch4_32", num_classes=10, img_size=32, model_overrides={"depth": 2, "embed_dim": 32, "num_heads": 2}
    )
    callback = AttentionRolloutLogger(num_images=4, statistics=False, faithfulness_every_n=0, explorer_max_bytes=70_000)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, accelerator="cpu", max_epochs=1, limit_train_batches=1, limit_val_batches=1,
        num_sanity_val_steps=0, callbacks=[callback], logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False,
    )  # fmt: skip
    trainer.fit(module, ImageDataModule(dataset="digits", img_size=32, batch_size=16, num_workers=0, seed=0))
    page = (tmp_path / "rollout" / "explorer_epoch_000.html").read_text()
    assert len(page.encode()) <= 70_000
    data = json.loads(re.search(r'id="explorer-data">(.*?)</script>', page, re.S).group(1))
    count = len(data["images"])
    assert 1 <= count < 4
    assert data["note"] == f"The first {count} of the 4 explained images (all would pass the size limit)."
    assert [im["label"] for im in data["images"]] == callback.labels[:count].tolist()
