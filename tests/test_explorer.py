"""The attention explorer (vit.explain.render.explorer) in a real browser: headless Chromium driven by Playwright.

The page is opened, patches clicked, tokens, blocks, heads and overlays switched, and what it decodes and draws is
read back and compared with the attention vit.explain.capture computes for that query. Without a browser the
browser tests skip, except under CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import pytest
import torch
from browser import SIGNED_LUT, Page, assert_drawn, expected_index, expected_signed_index, lut_index
from explorer_data import MEAN, STD, data_blocks, decode_bound, decode_rows, page_data, stored
from PIL import Image

from vit.explain import capture_attention, rollout_grid
from vit.explain.render.explorer import explorer_payload, render_explorer, write_explorer
from vit.explain.render.explorer_codes import CODES
from vit.explain.stats import patch_distances, row_entropy
from vit.normalize import normalize


@pytest.fixture
def pixels():
    torch.manual_seed(1)
    return torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)


HOSTILE = ["{{js}}", "{{data}}", "</script><img src=x onerror=window.hacked=1>", "a & b > c"]


def test_names_and_titles_are_text_never_markup_or_template_fields(tmp_path, random_vit, pixels):
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=4).eval()
    path = write_explorer(
        tmp_path / "e.html",
        explorer_payload(
            model,
            pixels[:1],
            mean=MEAN,
            std=STD,
            attribution=False,
            class_names=HOSTILE,
            names=[HOSTILE[2]],
            title=HOSTILE[0],
            note=HOSTILE[1],
        ),
    )
    page = path.read_text(encoding="utf-8")
    data = page_data(page)
    assert data["class_names"] == HOSTILE and data["images"][0]["name"] == HOSTILE[2]
    assert data["title"] == HOSTILE[0] and data["note"] == HOSTILE[1]
    outside = re.sub(r"<script\b.*?</script>", "", page, flags=re.S)
    opening = r'<img id="explorer-opening" hidden alt="" src="data:image/png;base64,[A-Za-z0-9+/=]+">'  # its picture
    outside, count = re.subn(opening, "", outside)
    assert count == 1 and "<img" not in outside.lower()
    assert "<title>{{js}}</title>" in outside and '<h1 id="title">{{js}}</h1>' in outside  # shown, not filled
    assert page.count('"use strict"') == 1  # the script once, not pasted where a name said {{js}}
    assert page.count('id="explorer-data"') == 1
    assert not set("<>&") & set("".join(data_blocks(page)))


def test_each_image_is_an_element_of_its_own_the_first_before_the_script(random_vit, pixels):
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=4).eval()
    payload = explorer_payload(model, pixels, mean=MEAN, std=STD, max_bytes=None)
    page = render_explorer(payload, extra_html='<section id="extra"></section>')
    assert page_data(page) == json.loads(json.dumps(payload))  # nothing lost or changed by the split
    light = json.loads(data_blocks(page)[0])
    assert all(not {*CODES, "image"} & set(entry) for entry in light["images"])
    marks = ("explorer-picture-0", "explorer-codes-0", '"use strict"', 'id="extra"', "explorer-picture-1",
             "explorer-codes-1", "explorer-picture-2", "explorer-codes-2")  # fmt: skip
    at = [page.index(m) for m in marks]
    assert at == sorted(at)


def test_non_finite_numbers_are_null_in_the_page(tmp_path, random_vit, pixels):
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=4).eval()
    with torch.no_grad():
        model.head.bias.fill_(float("nan"))  # a model from a diverged epoch: NaN probabilities
    scores = {"deletion_auc": {"rollout": float("nan")}, "insertion_auc": {"rollout": float("inf")}, "steps": 4}
    maps = {"gradxinput": torch.rand(2, 4, 4), "attnlrp": torch.rand(2, 4, 4)}
    path = write_explorer(
        tmp_path / "e.html",
        explorer_payload(model, pixels[:2], mean=MEAN, std=STD, attribution=False, faithfulness=scores, maps=maps),
    )
    data = page_data(path.read_text(encoding="utf-8"))
    assert data["map_names"] == ["attnlrp", "rollout", "gradxinput"]  # opens on the default map
    assert data["faithfulness"] == {"deletion_auc": {"rollout": None}, "insertion_auc": {"rollout": None}, "steps": 4}
    assert all(p is None for im in data["images"] for _, p in im["top"])


def test_the_page_takes_each_blocks_kind_from_the_model(random_vit, pixels):
    """The explorer labels each block with the model's own attention kind (``attention_kinds``), outlining the
    allowed neighbourhood of window and sliding blocks only."""
    labels = {"window": "window", "sliding": "sliding window", "linear": "linear (implicit)", "global": "global"}
    for config in (
        dict(window_size=2, global_attn_indexes=[1]),
        dict(window_size=3, window_type="sliding", global_attn_indexes=[0]),
        dict(linear_attention=True),
        dict(),
    ):
        model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4, **config)
        blocks = explorer_payload(model.eval(), pixels[:1], mean=MEAN, std=STD, attribution=False)["blocks"]
        kinds = model.attention_kinds()
        assert [b["kind"] for b in blocks] == kinds and [b["label"] for b in blocks] == [labels[k] for k in kinds]
        assert [b["mask"] is not None for b in blocks] == [k in ("window", "sliding") for k in kinds]


def test_hostile_names_and_non_finite_numbers_show_as_text(browser, tmp_path, random_vit, pixels):
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=4).eval()
    with torch.no_grad():
        model.head.bias.fill_(float("nan"))
    scores = {"deletion_auc": {HOSTILE[2]: float("nan")}, "insertion_auc": {HOSTILE[2]: 0.5}}
    write_explorer(
        tmp_path / "e.html",
        explorer_payload(
            model,
            pixels[:1],
            mean=MEAN,
            std=STD,
            attribution=False,
            class_names=HOSTILE,
            names=[HOSTILE[2]],
            title=HOSTILE[0],
            faithfulness=scores,
        ),
    )
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


def test_many_images_keep_the_view_on_the_first_screen(browser, tmp_path, random_vit):
    # 360 thumbnails in wrapped rows filled a 1000-pixel-high window before the image and its maps began.
    torch.manual_seed(0)
    model = random_vit(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3).eval()
    images = torch.randint(0, 256, (60, 3, 16, 16), dtype=torch.uint8)
    page = Page(browser, write_explorer(tmp_path / "e.html", explorer_payload(model, images, mean=MEAN, std=STD)))
    strip = page.js("() => { const t = document.getElementById('thumbs'); return [t.clientHeight, t.scrollHeight]; }")
    assert strip[0] <= 124 < strip[1]  # two rows shown, the others a scroll away
    assert page.js("() => document.getElementById('view').getBoundingClientRect().top") < 300
    page.page.locator("#thumbs button").nth(59).click()  # the last one scrolls into the strip and is selected
    assert page.state()["image"] == 59 and page.errors == []


def test_clicked_patch_and_tokens_show_the_captured_attention(browser, tmp_path, class_model, pixels):
    model = class_model
    path = write_explorer(
        tmp_path / "e.html", explorer_payload(model, pixels, mean=MEAN, std=STD, class_names=list("abcde"))
    )
    inputs = normalize(pixels, MEAN, STD)
    record = capture_attention(model, inputs)
    P, grid, bits = model.num_prefix_tokens, model.patch_embed.grid_size, 6
    codes, share = stored(page_data(path.read_text(encoding="utf-8")), 1)
    shown = decode_rows(codes, share, P, bits)  # (blocks, heads, N, N): what the page must decode
    distances = patch_distances(grid, model.patch_embed.patch_size).numpy()
    page = Page(browser, path)
    page.page.wait_for_function(  # every thumbnail gets its picture once the first image is drawn
        "Array.from(document.querySelectorAll('#thumbs img')).every(i => i.complete && i.naturalWidth === 32)"
    )
    page.js("() => window.explorer.select({image: 1})")
    for r, c in ((0, 0), (2, 3), (3, 1)):
        page.click_patch(r, c, grid)
        t = P + r * grid[1] + c
        assert page.state()["query"] == {"kind": "token", "index": t}
        for b, attn in enumerate(record):
            truth = attn[1, :, t].double().numpy()
            bound = decode_bound(truth, P, bits)
            for h in (0, 1, "mean"):
                row = page.row(b, h, t)
                expected = shown[b, :, t].mean(0) if h == "mean" else shown[b, h, t]
                np.testing.assert_allclose(row, expected, rtol=1e-5, atol=1e-7)
                near = truth.mean(0) if h == "mean" else truth[h]
                assert np.all(np.abs(row - near) <= (bound.mean(0) if h == "mean" else bound[h]))
                assert_drawn(page, b, h, expected[P:], slack=1)
            page.js("([b]) => window.explorer.select({block: b, head: 1})", [b])
            entropy, distance = page.cell_stats(b)
            assert entropy == pytest.approx(float(row_entropy(torch.from_numpy(shown[b, 1, t]))), abs=1e-4)
            assert entropy == pytest.approx(float(row_entropy(attn[1, 1, t].double())), abs=0.05)
            patches = truth[1, P:]
            assert distance == pytest.approx(float((patches * distances[t - P]).sum() / patches.sum()), rel=0.02)
    page.page.keyboard.press("ArrowLeft")  # from (3, 1) to (3, 0)
    page.settle()
    assert page.state()["query"]["index"] == P + 3 * grid[1]
    page.page.get_by_role("button", name="class token").click()
    page.settle()
    np.testing.assert_allclose(page.row(1, 0, 0), shown[1, 0, 0], rtol=1e-5, atol=1e-7)
    assert_drawn(page, 1, 0, shown[1, 0, 0, P:], slack=1)
    assert page.cell_stats(1)[1] is None  # a token has no position: no distance
    assert page.js("() => Array.from(document.querySelectorAll('.cell div.query'), q => q.hidden)") == [True] * 3 * 3
    page.page.get_by_role("button", name="reg 1").click()
    page.settle()
    assert page.state()["query"]["index"] == 2
    assert_drawn(page, 0, 1, shown[0, 1, 2, P:], slack=1)
    page.page.get_by_role("button", name="MAP query 0").click()
    page.settle()
    pool = np.array(page.js("() => window.explorer.poolRow(0, 0)"))
    truth = record.pool[1, :, 0].double().numpy()  # (heads, patches)
    entry = page_data(path.read_text(encoding="utf-8"))["images"][1]
    pool_codes = np.asarray(Image.open(io.BytesIO(base64.b64decode(entry["pool"])))).reshape(2, 1, -1)
    pool_shown = decode_rows(pool_codes, None, 0, bits)[:, 0]
    np.testing.assert_allclose(pool, pool_shown[0], rtol=1e-5, atol=1e-7)
    assert np.all(np.abs(pool - truth[0]) <= decode_bound(truth, 0, bits)[0])
    assert_drawn(page, -1, "mean", pool_shown.mean(0), slack=1)
    assert page.page.locator("tr.off").count() == 2  # the blocks have no row for the latent query
    assert page.errors == []


def test_overlays_and_prediction(browser, tmp_path, class_model, pixels):
    model = class_model
    inputs = normalize(pixels, MEAN, STD)
    custom = torch.rand(3, 4, 4)
    scores = {"deletion_auc": {"rollout": 0.25, "custom": 0.5}, "insertion_auc": {"rollout": 0.75, "custom": 0.5}}
    write_explorer(
        tmp_path / "e.html",
        explorer_payload(model, pixels, mean=MEAN, std=STD, maps={"custom": custom}, faithfulness=scores),
    )
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


def test_a_signed_map_is_drawn_diverging_around_zero_with_a_numbered_bar(browser, tmp_path, class_model, pixels):
    """AttnLRP (declared signed) on bwr from -m to +m: a zero patch is white exactly, the bar reads -m, 0, m (the
    numbers vit.explain.color_scale gives); attention keeps inferno from 0 with two numbers."""
    from vit.explain import color_scale

    relevance = (torch.rand(3, 4, 4) - 0.3) * 0.5  # in [-0.15, 0.35)
    relevance[2, 1, 1] = 0.0
    relevance[2, 0, 0] = -0.5  # the largest magnitude is negative: the limits are ±0.5
    write_explorer(
        tmp_path / "e.html",
        explorer_payload(class_model, pixels, mean=MEAN, std=STD, maps={"attnlrp": relevance}, attribution=False),
    )
    page = Page(browser, tmp_path / "e.html")
    assert page.js("() => window.explorer.data.signed") == ["attnlrp"]
    page.js("() => window.explorer.select({image: 2})")
    page.page.select_option("#overlay", "attnlrp")
    page.settle()
    drawn = page.js(
        "() => Array.from(document.querySelector('#overlay-map').getContext('2d').getImageData(0, 0, 4, 4).data)"
    )
    rgb = np.array(drawn).reshape(-1, 4)[:, :3]
    values = relevance[2].flatten().numpy()
    np.testing.assert_array_less(np.abs(lut_index(rgb, SIGNED_LUT) - expected_signed_index(values)), 2)
    assert rgb[5].tolist() == [255, 255, 255] and rgb[0].tolist() == [0, 0, 255]  # zero: white; -m: blue
    assert page.js("() => window.explorer.ticks()") == list(color_scale(relevance[2], signed=True).labels())
    assert page.js("() => window.explorer.ticks()")[0] == "-0.5"
    bar = page.js("() => Array.from(document.getElementById('colorbar').getContext('2d').getImageData(127, 5, 1, 1)"
                  ".data)")  # fmt: skip
    assert bar[:3] == [255, 255, 255]  # the middle of the bar: zero's white
    page.page.select_option("#overlay", "attention")
    page.settle()
    low, middle, high = page.js("() => window.explorer.ticks()")
    assert (low, middle) == ("0", "") and float(high) > 0
    page.page.select_option("#overlay", "none")
    page.settle()
    assert page.js("() => getComputedStyle(document.getElementById('legend')).visibility") == "hidden"
    assert page.errors == []


@pytest.mark.parametrize(
    ("config", "bits"),
    [
        (dict(window_size=2, shift_windows=True, global_attn_indexes=[]), 6),
        (dict(window_size=3, window_type="sliding", global_attn_indexes=[]), 8),
        (dict(linear_attention=True), 4),
    ],
    ids=["window", "sliding-8-bits", "linear-4-bits"],
)
def test_window_sliding_and_linear_blocks(browser, tmp_path, random_vit, pixels, config, bits):
    torch.manual_seed(0)
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4, **config).eval()
    path = write_explorer(
        tmp_path / "e.html", explorer_payload(model, pixels[:1], mean=MEAN, std=STD, attribution=False, bits=bits)
    )
    record = capture_attention(model, normalize(pixels[:1], MEAN, STD))
    P, grid = model.num_prefix_tokens, model.patch_embed.grid_size
    shown = decode_rows(*stored(page_data(path.read_text(encoding="utf-8")), 0), P, bits)
    page = Page(browser, path)
    labels = page.js("() => Array.from(document.querySelectorAll('td.block small'), s => s.textContent)")
    kind = {"window": "window", "sliding": "sliding window", "linear": "linear (implicit)"}
    page.click_patch(1, 2, grid)
    t = P + 1 * grid[1] + 2
    square = page.js("""() => Array.from(document.querySelectorAll('.cell div.query'),
        q => [q.hidden, q.style.left, q.style.top, q.style.width, q.style.height])""")
    assert grid == (4, 4) and square == [[False, "50%", "25%", "25%", "25%"]] * 2 * 3  # every map: row 1, column 2
    outlines = page.js("() => document.querySelectorAll('canvas.marks').length")  # window / sliding blocks only
    assert outlines == (0 if config.get("linear_attention") else 2 * 3)
    for b, attn in enumerate(record):
        module = model.blocks[b].attn
        expected = kind["linear" if config.get("linear_attention") else config.get("window_type", "window")]
        assert labels[b] == expected
        truth = attn[0, 0, t].double().numpy()
        row = page.row(b, 0, t)
        np.testing.assert_allclose(row, shown[b, 0, t], rtol=1e-5, atol=1e-7)
        assert np.all(np.abs(row - truth) <= decode_bound(truth, P, bits))
        assert_drawn(page, b, 0, shown[b, 0, t, P:], slack=1)
        allowed = page.js("([b]) => window.explorer.allowed(b)", [b])
        if expected == "linear (implicit)":
            assert allowed is None
        else:
            assert allowed == module.dense_mask()[t, P:].int().tolist()
            assert 0 < sum(allowed) < len(allowed)
    assert page.errors == []
