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
from browser import SIGNED_LUT, Page, chromium_path, expected_index, expected_signed_index, lut_index
from explorer_data import data_blocks, decode_bound, decode_rows, page_data, stored
from PIL import Image

from vit.explain import capture_attention, rollout_grid
from vit.explain.render import explorer
from vit.explain.render.explorer import ExplorerTooLarge, explorer_payload, render_explorer, write_explorer
from vit.explain.render.explorer_codes import CODES, quantize_rows
from vit.explain.stats import patch_distances, row_entropy
from vit.normalize import normalize

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def assert_drawn(page: Page, b: int, h, values: np.ndarray, slack: int) -> None:
    """The small map of (block b, head h) shows ``values`` (the patch keys), within ``slack`` colour-map steps."""
    drawn = lut_index(page.cell_pixels(b, h))
    np.testing.assert_array_less(np.abs(drawn - expected_index(values)), slack + 1)


def one_image_page(model, pixels: torch.Tensor, maps: dict | None = None, **options) -> int:
    """Bytes of the explorer page of the first image alone: a size limit just above it holds one image, not two."""
    first = {name: m[:1] for name, m in (maps or {}).items()}
    payload = explorer_payload(model, pixels[:1], mean=MEAN, std=STD, max_bytes=None, maps=first, **options)
    return len(render_explorer(payload).encode())


@pytest.fixture
def pixels():
    torch.manual_seed(1)
    return torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)


@pytest.mark.parametrize("bits", [6, 8, 3])
def test_quantize_rows_codes_the_square_root_and_decodes_within_its_bound(bits):
    torch.manual_seed(0)
    attn = torch.rand(2, 5, 7) ** 6
    attn[0, 1, :2] = 5.0  # a sink on the prefix keys
    attn[1, 2, 2:] = 0.0  # every patch key at zero
    attn[1, 3, :2] = 2e4 * attn[1, 3, 2:].sum()  # a sink: 0.99995 on the prefix, float16 would round 1 - it to 0
    attn = attn / attn.sum(-1, keepdim=True)
    codes, share = quantize_rows(attn, prefix=2, bits=bits)
    assert codes.dtype == np.uint8 and share.shape == (2, 5) and share.dtype == np.float16
    levels = 2**bits - 1
    for i in range(2):
        for q in range(5):
            row = attn[i, q].double().numpy()
            for keys in (slice(2, None), slice(0, 2)):
                top = row[keys].max()
                expected = np.rint(levels * np.sqrt(row[keys] / top)) if top > 0 else np.zeros_like(row[keys])
                np.testing.assert_array_equal(codes[i, q, keys], expected)
            front = row[:2].sum() / row.sum()  # the smaller share, float16 (11 bits, subnormal below 2^-14)
            small, sign = (front, 1.0) if front <= 0.5 else (1 - front, -1.0)
            assert np.copysign(1.0, share[i, q]) == sign  # negative, even when 0: the patches' share
            assert abs(float(share[i, q])) == pytest.approx(small, rel=2**-11, abs=2**-25)
    decoded = decode_rows(codes, share, 2, bits)
    truth = attn.double().numpy()
    np.testing.assert_allclose(decoded.sum(-1), 1.0, atol=1e-12)
    bound = decode_bound(truth, 2, bits)
    assert np.all(np.abs(decoded - truth) <= bound)
    for keys in (slice(0, 2), slice(2, None)):  # within a few steps of each key group's own maximum
        assert np.all(bound[..., keys] <= 4 / levels * truth[..., keys].max(-1, keepdims=True) + 1e-6)
    assert decoded[1, 2, 2:].max() == 0 and decoded[0, 1, :2].sum() > 0.9
    np.testing.assert_allclose(decoded[1, 3, 2:].sum(), truth[1, 3, 2:].sum(), rtol=2**-10, atol=2**-24)  # sink
    assert quantize_rows(attn[..., 2:], prefix=0, bits=bits)[1] is None
    with pytest.raises(ValueError, match="bits must be an integer from 2 to 8, got 9"):
        quantize_rows(attn, bits=9)


def test_six_bits_keep_entropy_and_distance_of_peaked_rows():
    """Rows like a trained model's (a few strong keys, a long tail): the statistics the page shows stay close."""
    torch.manual_seed(0)
    logits = torch.randn(64, 64) * 3
    attn = logits.softmax(-1)
    codes, _ = quantize_rows(attn, bits=6)
    decoded = torch.from_numpy(decode_rows(codes, None, 0, 6))
    distances = patch_distances((8, 8), (4, 4)).double()
    assert (row_entropy(decoded) - row_entropy(attn.double())).abs().max() < 0.05  # nats; log 64 = 4.16
    assert ((decoded - attn.double()) * distances).sum(-1).abs().max() < 0.2  # pixels, on a 32-pixel image


def test_too_many_images_are_refused_with_how_many_fit(tmp_path, random_vit, pixels, monkeypatch):
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4)
    one = one_image_page(model, pixels)
    with pytest.raises(ExplorerTooLarge, match=r"^3 images are too many .* about \d+ fit") as err:
        write_explorer(
            tmp_path / "e.html",
            explorer_payload(model, pixels, mean=MEAN, std=STD, max_bytes=one + 1_200, batch_size=1, bits=6),
        )
    assert "\n" not in str(err.value)
    assert not (tmp_path / "e.html").exists() and not list(tmp_path.iterdir())
    seen, real = [], explorer.explain  # with a subset note: the first that fit, each image explained once
    monkeypatch.setattr(explorer, "explain", lambda m, x, *a, **kw: seen.append(len(x)) or real(m, x, *a, **kw))
    data = explorer_payload(model, pixels, mean=MEAN, std=STD, max_bytes=one + 1_200, batch_size=1, subset_note=str,
                            bits=6)  # fmt: skip
    kept = len(data["images"])
    assert 1 <= kept < 3 and data["note"] == str(kept) and sum(seen) == kept + 1
    with pytest.raises(ValueError, match="map 'bad' has shape"):
        write_explorer(
            tmp_path / "e.html", explorer_payload(model, pixels, mean=MEAN, std=STD, maps={"bad": torch.zeros(3, 2, 2)})
        )


def test_auto_bits_are_the_finest_that_fit_and_the_page_says_so(tmp_path, random_vit):
    torch.manual_seed(0)
    model = random_vit(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=4).eval()
    images = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    long_names = ["first", *(f"{i}: " + "a long file name " * 1_000 for i in range(1, 6))]  # the first undersizes

    def page(pixels, bits, max_bytes=None, names=long_names):
        data = explorer_payload(model, pixels, mean=MEAN, std=STD, max_bytes=max_bytes, bits=bits, attribution=False,
                                names=names)  # fmt: skip
        return data, len(render_explorer(data).encode())

    size = {bits: page(images, bits)[1] for bits in (6, 5, 4, 3)}
    assert size[6] > size[5] > size[4] > size[3]
    data, _ = page(images, "auto")  # no limit: the finest
    assert data["bits"] == 6 and data["note"] is None
    for bits in (5, 4, 3):
        limit = size[bits] + 200  # room for the page's note on the bits
        assert page(images[:1].repeat(6, 1, 1, 1), 6, names=["first"] * 6)[1] < limit  # as the first sizes them
        data, written = page(images, "auto", limit)
        assert data["bits"] == bits and written <= limit < size[bits + 1]  # the finest that fits, one step at a time
        assert data["note"] == (f"The attention is stored at {bits} bits per value instead of 6 to keep the explorer "
                                f"under {limit / 1e3:.0f} kB: the small maps are coarser.")  # fmt: skip
        assert stored(data, 1)[0].max() <= 2**bits - 1
    with pytest.raises(ExplorerTooLarge, match=r"^6 images are too many .* over the \d+ kB limit; about [1-5] fit"):
        page(images, "auto", size[3] // 2)  # not even 3 bits fit: refused as without "auto"
    _, written = page(images, 6, size[6] + 50)  # the limit holds to the byte: the page is counted as it is written
    assert written <= size[6] + 50
    with pytest.raises(ExplorerTooLarge):
        page(images, 6, size[6] - 1)
    from vit.callbacks import AttentionRolloutLogger

    with pytest.raises(ValueError, match='explorer_bits must be "auto" or an integer from 2 to 8, got 6.0'):
        AttentionRolloutLogger(num_images=1, statistics=False, faithfulness_every_n=0, explorer_bits=6.0)


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


@pytest.fixture
def class_model(random_vit):
    """Global attention with a class token, two register tokens and an attention-pooling head."""
    torch.manual_seed(0)
    return random_vit(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5, reg_tokens=2, global_pool="map"
    ).eval()


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
    import json
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
    import json
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
