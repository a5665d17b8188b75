"""How the attention explorer reads its data in a real browser: the PNG decoder against PNGs written here by hand
(every row filter, split data chunks), a page served in two parts (an image clicked while the rest still loads),
a failure shown on the page, and the input refused before a page is written."""

from __future__ import annotations

import base64
import http.server
import io
import re
import struct
import threading
import zlib

import numpy as np
import pytest
import torch
from browser import Page, expected_index, lut_index
from explorer_data import decode_rows, page_data, stored
from PIL import Image

from vit.explain.render.explorer import explorer_payload, write_explorer

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def encode_png(pixels: np.ndarray, filters: list[int], split: int, extra: bytes = b"") -> str:
    """An 8-bit gray ``(H, W)`` or RGB ``(H, W, 3)`` PNG (base64), row ``y`` filtered with ``filters[y % len]``
    as the PNG specification defines them, its zlib stream cut into IDAT chunks of ``split`` bytes."""
    height, width = pixels.shape[:2]
    channels = 1 if pixels.ndim == 2 else 3
    flat = pixels.reshape(height, width * channels).astype(int)
    raw = bytearray()
    for y in range(height):
        kind = filters[y % len(filters)]
        raw.append(kind)
        for x in range(width * channels):
            a = flat[y, x - channels] if x >= channels else 0
            b = flat[y - 1, x] if y else 0
            c = flat[y - 1, x - channels] if y and x >= channels else 0
            raw.append((flat[y, x] - [0, a, b, (a + b) // 2, paeth(a, b, c)][kind]) % 256)
    stream = zlib.compress(bytes(raw), 9)
    header = struct.pack(">IIBBBBB", width, height, 8, 0 if channels == 1 else 2, 0, 0, 0)
    idat = b"".join(chunk(b"IDAT", stream[i : i + split]) for i in range(0, len(stream), split))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + extra + idat + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()


@pytest.fixture
def pixels():
    torch.manual_seed(1)
    return torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)


@pytest.fixture
def page(browser, tmp_path, random_vit, pixels):
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=4).eval()
    return Page(browser, write_explorer(tmp_path / "e.html", explorer_payload(model, pixels[:1], mean=MEAN, std=STD)))


def test_png_decoder_undoes_every_filter_across_split_chunks(page):
    rng = np.random.default_rng(0)
    decode = "(b64) => window.explorer.png(b64)"
    refuse = "(b64) => window.explorer.png(b64).then(() => 'accepted', (e) => e.message)"
    for shape in ((7, 5), (6, 4, 3), (1, 9), (9, 1, 3)):
        pixels = rng.integers(0, 256, shape, dtype=np.uint8)
        for filters in ([0], [1], [2], [3], [4], [0, 1, 2, 3, 4], [4, 3, 2, 1, 0]):
            b64 = encode_png(pixels, filters, split=int(rng.integers(1, 40)), extra=chunk(b"tEXt", b"k\x00v"))
            got = page.js(decode, b64)
            assert (got["height"], got["width"], got["channels"]) == (*shape[:2], 1 if len(shape) == 2 else 3)
            assert got["data"] == pixels.flatten().tolist(), (shape, filters)
    for depth, colour, interlace in ((16, 0, 0), (8, 3, 0), (8, 0, 1), (8, 6, 0)):  # 16-bit, palette, Adam7, RGBA
        header = struct.pack(">IIBBBBB", 2, 2, depth, colour, 0, 0, interlace)
        png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 20))
        refused = page.js(refuse, base64.b64encode(png).decode())
        assert refused == "unsupported PNG layout"
    header = struct.pack(">IIBBBBB", 2, 2, 8, 0, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes([5, 1, 2, 0, 3, 4])))
    refused = page.js(refuse, base64.b64encode(png).decode())
    assert refused == "PNG row 0 has an unknown filter 5"
    assert page.errors == []


def test_an_image_clicked_while_the_page_still_loads_is_shown_once_it_has_arrived(
    browser, tmp_path, random_vit, pixels
):
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4).eval()
    path = write_explorer(tmp_path / "e.html", explorer_payload(model, pixels, mean=MEAN, std=STD))
    body = path.read_bytes()
    cut = body.index(b'id="explorer-codes-2"') + 40  # inside the codes of the third image
    release = threading.Event()

    class TwoParts(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[:cut])
            self.wfile.flush()
            release.wait(30)
            self.wfile.write(body[cut:])

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TwoParts)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tab = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = []
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.goto(f"http://127.0.0.1:{server.server_address[1]}/", wait_until="commit")
        tab.wait_for_function("window.explorer && window.explorer.timings.open !== null")  # drawn before the rest
        assert tab.evaluate("document.readyState") == "loading"
        tab.locator("#thumbs button").nth(2).click()  # its codes are only half there
        tab.wait_for_timeout(200)
        release.set()
        tab.wait_for_function("document.readyState !== 'loading'")
        tab.evaluate("() => window.explorer.select({})")
        assert tab.evaluate("window.explorer.state.image") == 2
        P, t = model.num_prefix_tokens, model.num_prefix_tokens + 5
        shown = decode_rows(*stored(page_data(body.decode()), 2), P, 6)
        row = tab.evaluate("([b, h, t]) => window.explorer.row(b, h, t)", [1, 0, t])
        np.testing.assert_allclose(row, shown[1, 0, t], rtol=1e-5, atol=1e-7)
        assert tab.evaluate("window.explorer.errors") == [] and errors == []
        assert tab.evaluate("document.getElementById('note').hidden")
    finally:
        release.set()
        server.shutdown()


def test_a_failure_is_shown_on_the_page_and_the_other_images_still_work(browser, tmp_path, random_vit, pixels):
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=4).eval()
    path = write_explorer(tmp_path / "e.html", explorer_payload(model, pixels[:2], mean=MEAN, std=STD))
    codes = re.search(r'id="explorer-codes-1">\{"attn":"([^"]+)"', path.read_text()).group(1)
    middle = len(codes) // 2 // 4 * 4
    path.write_text(path.read_text().replace(codes, codes[:middle] + "AAAAAAAA" + codes[middle + 8 :]))  # bad zlib
    page = Page(browser, path)
    page.page.locator("#thumbs button").nth(1).click()
    page.settle()
    assert page.js("window.explorer.errors") and not page.js("document.getElementById('note').hidden")
    assert page.page.locator("#note").inner_text().startswith("The explorer failed: ")
    page.page.locator("#thumbs button").nth(0).click()  # the explorer still answers
    page.settle()
    assert page.state()["image"] == 0 and page.js("document.getElementById('caption').textContent").startswith(
        "image 0"
    )


def test_no_image_or_bad_bits_are_refused_before_a_page_is_written(tmp_path, random_vit, pixels):
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=4).eval()
    with pytest.raises(ValueError, match=r"at least one image, got shape \(0, 3, 32, 32\)"):
        write_explorer(tmp_path / "e.html", explorer_payload(model, pixels[:0], mean=MEAN, std=STD))
    with pytest.raises(ValueError, match='bits must be "auto" or an integer from 2 to 8, got 1'):
        write_explorer(tmp_path / "e.html", explorer_payload(model, pixels, mean=MEAN, std=STD, bits=1))
    assert not list(tmp_path.iterdir())


def test_a_nan_patch_leaves_the_rest_of_its_map(random_vit, pixels):
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=4).eval()
    custom = torch.rand(1, 4, 4)
    custom[0, 1, 2] = float("nan")
    entry = explorer_payload(model, pixels[:1], mean=MEAN, std=STD, maps={"custom": custom}, attribution=False)
    saved = entry["images"][0]["maps"]["custom"]
    values = np.frombuffer(base64.b64decode(saved["f16"]), "<f2").astype(float) * saved["max"]
    expected = custom[0].nan_to_num(0.0).flatten().numpy()
    np.testing.assert_allclose(values, expected, rtol=2**-11, atol=2**-12 * expected.max())


def test_a_photograph_is_stored_as_jpeg_and_coarse_codes_unfiltered_and_both_read_back(browser, tmp_path, random_vit):
    """Above 64 pixels a side the picture is a JPEG (a photograph: a sixth of its PNG); codes of 3 bits or fewer are a
    PNG without row filters (deflate alone does better on them). The page shows the one and decodes the other."""
    torch.manual_seed(0)
    model = random_vit(img_size=96, patch_size=16, embed_dim=32, depth=1, num_heads=2, num_classes=4).eval()
    y, x = torch.meshgrid(torch.arange(96), torch.arange(96), indexing="ij")
    photo = torch.stack([y * 2, x * 2, 255 - y - x // 2]).clamp(0, 255).to(torch.uint8)[None]  # a smooth gradient
    path = write_explorer(
        tmp_path / "e.html", explorer_payload(model, photo, mean=MEAN, std=STD, attribution=False, bits=3)
    )
    data = page_data(path.read_text(encoding="utf-8"))
    picture = base64.b64decode(data["images"][0]["image"])
    assert picture[:3] == b"\xff\xd8\xff"  # JPEG
    attn = base64.b64decode(data["images"][0]["attn"])
    stream = b"".join(  # the IDAT chunks, by the chunk layout
        attn[p + 8 : p + 8 + struct.unpack(">I", attn[p : p + 4])[0]]
        for p in _chunk_offsets(attn)
        if attn[p + 4 : p + 8] == b"IDAT"
    )
    raw = np.frombuffer(zlib.decompress(stream), np.uint8).reshape(-1, 1 + 37)  # (2 heads · 37 tokens, 1 + 37)
    assert not raw[:, 0].any()  # filter 0 on every row
    codes, share = stored(data, 0)
    assert codes.max() <= 7
    page = Page(browser, path)
    page.js("() => window.explorer.select({overlay: 'none'})")
    shown = decode_rows(codes, share, model.num_prefix_tokens, 3)
    np.testing.assert_allclose(page.row(0, 1, 5), shown[0, 1, 5], rtol=1e-5, atol=1e-7)
    page.page.wait_for_function("document.querySelector('#thumbs img').naturalWidth === 96")  # filled once drawn
    view = np.array(
        page.js("""() => { const c = document.getElementById('view');
        return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data); }""")
    ).reshape(320, 320, 4)
    for r, c in ((20, 20), (150, 90), (300, 250)):  # away from the patch grid's lines
        expected = photo[0, :, r * 96 // 320, c * 96 // 320].int().numpy()
        assert np.abs(view[r, c, :3] - expected).max() <= 8, (r, c)
    assert page.errors == []


def _chunk_offsets(png: bytes) -> list[int]:
    offsets, p = [], 8
    while p < len(png):
        offsets.append(p)
        p += 12 + struct.unpack(">I", png[p : p + 4])[0]
    return offsets


def test_a_negative_zero_share_puts_the_whole_row_on_the_prefix(browser, tmp_path, random_vit, pixels):
    """The stored share is the smaller one, negative for the patches': -0.0 means the patches hold nothing."""
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=4, reg_tokens=1)
    path = write_explorer(
        tmp_path / "e.html", explorer_payload(model.eval(), pixels[:1], mean=MEAN, std=STD, attribution=False)
    )
    text = path.read_text()
    share = re.search(r'id="explorer-codes-0">[^<]*"share":"([^"]+)"', text).group(1)
    values = np.frombuffer(base64.b64decode(share), "<f2").copy()
    P = model.num_prefix_tokens
    values[P] = -0.0  # block 0, head 0, the first patch's row: the patches' share, 0
    path.write_text(text.replace(share, base64.b64encode(values.astype("<f2").tobytes()).decode()))
    codes, stored_share = stored(page_data(path.read_text()), 0)
    assert np.signbit(stored_share[0, 0, P]) and stored_share[0, 0, P] == 0
    page = Page(browser, path)
    row = page.row(0, 0, P)
    np.testing.assert_allclose(row, decode_rows(codes, stored_share, P, 6)[0, 0, P], rtol=1e-6, atol=1e-7)
    assert sum(row[:P]) == pytest.approx(1.0, abs=1e-6) and not any(row[P:])
    assert page.errors == []


def test_the_page_opens_on_the_first_patch_rows_before_the_codes_are_inflated(browser, tmp_path, random_vit, pixels):
    """The first image's codes element is broken here: the page still opens, drawn from the first patch's rows in its
    data, and says what failed once it needs the whole codes."""
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4).eval()
    path = write_explorer(
        tmp_path / "e.html", explorer_payload(model, pixels[:2], mean=MEAN, std=STD, attribution=False)
    )
    data = page_data(path.read_text())
    codes, share = stored(data, 0)
    P, bits = model.num_prefix_tokens, data["bits"]
    first = data["images"][0]["first"]
    np.testing.assert_array_equal(
        np.asarray(Image.open(io.BytesIO(base64.b64decode(first["attn"])))), codes[:, :, P].reshape(-1, codes.shape[-1])
    )
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(first["share"]), "<f2"), share[:, :, P].ravel())
    assert "first" not in data["images"][1]
    text = path.read_text()
    broken = re.search(r'id="explorer-codes-0">\{"attn":"([^"]+)"', text).group(1)
    middle = len(broken) // 2 // 4 * 4
    path.write_text(text.replace(broken, broken[:middle] + "AAAAAAAA" + broken[middle + 8 :]))
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(path.as_uri())
    page.wait_for_function("window.explorer && window.explorer.timings.open !== null && window.explorer.errors.length")
    shown = decode_rows(codes, share, P, bits)[:, :, P, P:]  # (blocks, heads, patches) of the opening query
    for b in range(2):
        drawn = page.evaluate(
            """(b) => { const c = document.querySelector(`.cell[data-block="${b}"][data-head="0"] canvas.heat`);
            return Array.from(c.getContext("2d").getImageData(0, 0, c.width, c.height).data); }""",
            b,
        )
        got = lut_index(np.array(drawn).reshape(-1, 4)[:, :3])
        assert np.abs(got - expected_index(shown[b, 0])).max() <= 1  # float32 on the page
    assert page.locator("#note").inner_text().startswith("The explorer failed: ")
    page.close()
