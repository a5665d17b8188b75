"""The web page of ``vit serve`` (vit.serve.page) in headless Chromium, against a stand-in server on loopback.

The stand-in answers ``GET /``, ``GET /info`` and ``POST /predict`` as the contract of ``vit serve`` says, each answer
built by the project's own code on a checkpoint trained on the digits: the labels by :class:`vit.Predictor`, the map
by :func:`vit.explain.explain`, its overlay by the colour rule of :mod:`vit.explain.colors`, the explorer by
:func:`~vit.explain.render.explorer.explorer_payload`. A digit is uploaded through the page's file input; the page must
show the predicted class first, the overlay and the explorer, say what the colours mean, show a failed request's
status and reason, and ask no host but the server for anything. Without a browser the test skips, except under CI.
"""

from __future__ import annotations

import base64
import io
import json
import re
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import numpy as np
import pytest
from PIL import Image

import vit
from vit.explain import DEFAULT_METHOD, explain
from vit.explain.colors import is_signed
from vit.explain.render.explorer import explorer_payload, render_explorer
from vit.explain.render.overlay import overlay_heatmap
from vit.serve.page import page_html


def png_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


class StandIn:
    """The answers of ``vit serve`` for one checkpoint, from the project's code (one request at a time)."""

    def __init__(self, checkpoint) -> None:
        self.predict = vit.Predictor(checkpoint)
        self.lock = threading.Lock()

    def info(self) -> dict:
        cfg = self.predict.cfg
        return {
            "model": "tiny",
            "classes": self.predict.class_names,
            "input_size": list(cfg["input_size"]),
            "mean": list(cfg["mean"]),
            "std": list(cfg["std"]),
            "temperature": None,
            "backend": "torch",
        }

    def answer(self, data: bytes) -> tuple[int, object]:
        try:
            image = np.array(Image.open(io.BytesIO(data)).convert("RGB"))
        except OSError:
            return 400, {"error": "the body is not a JPEG, PNG or WebP image"}
        with self.lock:
            prediction = self.predict([image])[0]
            model, cfg = self.predict.model, self.predict.cfg
            x = self.predict.preprocess([image])
            kept = explain(model, x, [DEFAULT_METHOD], mean=cfg["mean"], std=cfg["std"], statistics=False, block=None)
            grid = kept.maps[DEFAULT_METHOD]
            overlay = overlay_heatmap(kept.images[0], grid[0], signed=is_signed(DEFAULT_METHOD))
            payload = explorer_payload(model, x, mean=cfg["mean"], std=cfg["std"], class_names=self.predict.class_names,
                                       names=["upload"], maps={DEFAULT_METHOD: grid}, max_bytes=None)  # fmt: skip
        explanation = {
            "method": DEFAULT_METHOD,
            "signed": is_signed(DEFAULT_METHOD),
            "grid": grid[0].tolist(),
            "overlay": "data:image/png;base64," + base64.b64encode(png_bytes(overlay)).decode(),
            "explorer": json.loads(json.dumps(payload)),
        }
        top = [{"label": label, "score": score} for label, score in prediction.top5]
        return 200, [{"predictions": top, "explanation": explanation}]


@contextmanager
def serving(stand_in: StandIn):
    """The stand-in on 127.0.0.1 at a free port, in a thread, shut down on exit; yields its address and the paths
    it was asked for."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        timeout = 30  # a stalled connection cannot hold a thread past the test

        def send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 (http.server's name)
            asked.append(f"GET {self.path}")
            if self.path == "/":
                self.send(200, page_html().encode(), "text/html; charset=utf-8")
            elif self.path == "/info":
                self.send(200, json.dumps(stand_in.info()).encode(), "application/json")
            else:
                self.send(404, b'{"error": "no such page"}', "application/json")

        def do_POST(self):  # noqa: N802
            asked.append(f"POST {self.path} {self.headers['Content-Type']}")
            data = self.rfile.read(int(self.headers["Content-Length"]))
            status, body = stand_in.answer(data) if urlsplit(self.path).path == "/predict" else (404, {"error": "?"})
            self.send(status, json.dumps(body).encode(), "application/json")

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def digit() -> np.ndarray:
    """A digit of scikit-learn's set as a 32 px RGB image (each of its 8x8 pixels a 4x4 square)."""
    from sklearn.datasets import load_digits

    gray = (load_digits().images[3] * (255 / 16)).round().astype(np.uint8).repeat(4, 0).repeat(4, 1)
    return np.repeat(gray[:, :, None], 3, axis=2)


def open_page(browser, address: str):
    """The page opened at ``address``, every request it makes recorded (and any to another host refused)."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    host = urlsplit(address).netloc
    page.route("**/*", lambda route: route.continue_() if urlsplit(route.request.url).netloc == host else route.abort())
    page.goto(address + "/")
    page.evaluate("() => window.servePage.info")
    return page, requests, errors


def check_prediction(card, expected) -> None:
    """The card shows the top-5 of ``expected`` (a :class:`vit.inference.Prediction`): labels, percentages, bars."""
    assert card.locator(".bars .label").all_text_contents() == [label for label, _ in expected.top5]
    assert card.locator(".bars li.first .label").text_content() == expected.label
    shown = [t.rstrip("%") for t in card.locator(".bars .pct").all_text_contents()]
    assert shown == [f"{100 * p:.1f}" if p >= 0.001 else "<0.1" for _, p in expected.top5]
    widths = card.locator(".bars .fill").evaluate_all("(fills) => fills.map((f) => f.style.width)")
    np.testing.assert_allclose([float(w.rstrip("%")) for w in widths], [100 * p for _, p in expected.top5], rtol=1e-5)


def check_explanation(page, card, expected) -> None:
    """The overlay is loaded and captioned with its method and colour rule; the explorer is drawn without errors."""
    overlay = card.locator(".overlay img")
    page.wait_for_function("(img) => img.complete", arg=overlay.element_handle())
    assert overlay.evaluate("(img) => img.naturalWidth") == 32
    caption = card.locator(".overlay figcaption").text_content()
    assert caption.startswith(f"{DEFAULT_METHOD} for “{expected.label}”Signed relevance: red = evidence for")
    frame = card.locator(".explorer iframe").element_handle().content_frame()
    frame.wait_for_function("() => window.explorer && window.explorer.timings.open !== null")
    explored = frame.evaluate("() => ({pred: window.explorer.data.images[0].pred, errors: window.explorer.errors,"
                              " maps: document.querySelectorAll('.cell canvas.heat').length})")  # fmt: skip
    assert explored == {"pred": expected.index, "errors": [], "maps": 2 * (2 + 1)}  # blocks x (heads + mean)
    assert card.locator(".explorer iframe").evaluate("(f) => f.getBoundingClientRect().height") > 300  # fitted


def test_page_shows_the_prediction_the_map_and_the_explorer_of_an_uploaded_image(
    browser, trained_checkpoint, digit, tmp_path
):
    stand_in = StandIn(trained_checkpoint)
    (tmp_path / "digit.png").write_bytes(png_bytes(digit))
    expected = vit.Predictor(trained_checkpoint)([tmp_path / "digit.png"])[0]  # from the file, not the upload
    with serving(stand_in) as (address, asked):
        page, requests, errors = open_page(browser, address)
        assert page.locator("#model-name").text_content() == "tiny"
        assert page.locator("#model-info").text_content().startswith("10 classes · input 32×32 px")
        stops = []  # the file input is reached with the keyboard: the second stop, after the classes' summary
        for _ in range(2):
            page.keyboard.press("Tab")
            stops.append(page.evaluate("() => document.activeElement.id"))
        assert stops == ["classes-count", "files"]
        page.locator("#files").set_input_files(str(tmp_path / "digit.png"))
        card = page.locator("article.result").first
        page.wait_for_function("() => document.querySelector('article.result').dataset.state !== 'pending'")
        assert card.get_attribute("data-state") == "done", card.locator(".error").text_content()
        check_prediction(card, expected)
        check_explanation(page, card, expected)
        page.screenshot(path=str(tmp_path / "serve_page.png"), full_page=True)
        assert not errors

        page.locator("#files").set_input_files({"name": "notes.txt", "mimeType": "text/plain", "buffer": b"hello"})
        page.wait_for_function("() => window.servePage.done()")
        page.wait_for_function("() => document.querySelectorAll('article.result')[1].dataset.state === 'error'")
        failed = page.locator("article.result").nth(1)
        assert failed.locator(".error").text_content() == "error 400: the body is not a JPEG, PNG or WebP image"
        assert failed.locator(".top").is_hidden() and failed.locator(".explorer").is_hidden()
    assert errors == ["Failed to load resource: the server responded with a status of 400 (Bad Request)"]
    assert all(urlsplit(url).scheme in ("data", "blob", "about") or address in url for url in requests), requests
    assert asked == ["GET /", "GET /info", "POST /predict?top_k=5&explain=default&explorer=1 image/png",
                     "POST /predict?top_k=5&explain=default&explorer=1 text/plain"]  # fmt: skip


HOSTILE = ["{{js}}", "{{data}}", "</script><img src=x onerror=window.hacked=1>", "a & b > c 'é'"]
SCRIPT_JSON = re.compile(r'(<script type="application/json" id="[\w-]+">)(.*?)(</script>)', re.S)


def split_json(page: str) -> tuple[str, list]:
    """The page with its JSON script elements emptied, and their contents parsed (JSON written by Python and by the
    browser differ in form, e.g. ``1e-05`` and ``0.00001``, not in value)."""
    return SCRIPT_JSON.sub(r"\1\3", page), [json.loads(m[2]) for m in SCRIPT_JSON.finditer(page)]


def routed_page(browser, answer):
    """The page at http://127.0.0.1:9/ with every request answered by ``answer(route.request) -> (status, headers,
    body)`` (``/`` by the page itself): nothing reaches a network."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))

    def fulfil(route):
        if urlsplit(route.request.url).path == "/":
            return route.fulfill(status=200, content_type="text/html", body=page_html())
        status, headers, body = answer(route.request)
        route.fulfill(status=status, headers=headers, body=body if isinstance(body, str) else json.dumps(body))

    page.route("**/*", fulfil)
    page.goto("http://127.0.0.1:9/")
    page.evaluate("() => window.servePage.info")
    return page, errors


def test_the_explorer_filled_in_the_browser_is_the_one_python_writes(browser, random_vit):
    """The page fills the explorer's template from a payload as render_explorer does: the same HTML, the same data
    (two images: the first's elements before the script, the second's after it), names kept as text."""
    import torch

    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=4).eval()
    pixels = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    payload = explorer_payload(model, pixels, mean=(0.5,) * 3, std=(0.25,) * 3, class_names=HOSTILE,
                               names=HOSTILE[2:], title=HOSTILE[0], note=HOSTILE[1], max_bytes=None)  # fmt: skip
    payload = json.loads(json.dumps(payload))
    page, errors = routed_page(browser, lambda request: (500, {}, "down"))
    filled = page.evaluate("(payload) => window.servePage.explorerPage(payload)", payload)
    assert split_json(filled) == split_json(render_explorer(payload))
    page.set_content(filled)  # and it runs: both images drawn, no markup from the names
    page.wait_for_function("() => window.explorer && window.explorer.timings.open !== null")
    page.evaluate("() => window.explorer.select({image: 1})")
    assert page.evaluate("() => [window.explorer.errors, window.hacked, document.title]") == [[], None, HOSTILE[0]]
    assert not errors


def test_every_shape_of_answer_and_failure_is_shown_as_text(browser):
    """Predictions without an explanation (Hugging Face's shape) under a label that holds markup; an image's own error
    inside a 200; a full queue's 503 with Retry-After; a 401 that asks for the API key, then the key sent; an /info
    that is not JSON."""
    seen = []

    def answer(request):
        key, path = request.post_data_buffer, urlsplit(request.url).path
        seen.append((path, key, request.headers.get("authorization")))
        if path == "/info":
            return 500, {}, "Internal Server Error\n<html>trace</html>"
        if key == b"key" and request.headers.get("authorization") != "Bearer s3cret":
            return 401, {}, {"error": "a bearer token is required (Authorization: Bearer KEY)"}
        return {
            b"markup": (200, {}, [{"label": HOSTILE[2], "score": 0.75}, {"label": "b", "score": 0.0004}]),
            b"slot": (200, {}, [{"error": "the image is truncated"}]),
            b"busy": (503, {"Retry-After": "2"}, {"error": "the queue is full"}),
            b"key": (200, {}, [{"label": "cat", "score": 1.0}]),
        }[key]

    page, errors = routed_page(browser, answer)
    assert page.locator("#model-info").text_content() == (
        "The model's description is unavailable: error 500: Internal Server Error"
    )
    files = [
        {"name": f"{k}.png", "mimeType": "image/png", "buffer": k.encode()} for k in ("markup", "slot", "busy", "key")
    ]
    page.locator("#files").set_input_files(files)
    page.wait_for_function("() => window.servePage.done()")
    cards = page.locator("article.result")
    assert cards.evaluate_all("(cards) => cards.map((c) => c.dataset.state)") == ["done", "error", "error", "error"]
    assert cards.nth(0).locator(".bars .label").all_text_contents() == [HOSTILE[2], "b"]
    assert cards.nth(0).locator(".bars .pct").all_text_contents() == ["75.0%", "<0.1%"]
    assert cards.nth(0).locator(".overlay").is_hidden() and cards.nth(0).locator(".explorer").is_hidden()
    lines = [cards.nth(i).locator(".error").text_content() for i in (1, 2, 3)]
    assert lines == ["error: the image is truncated", "error 503: the queue is full (try again in 2 s)",
                     "error 401: a bearer token is required (Authorization: Bearer KEY)"]  # fmt: skip
    assert page.locator("#key-box").is_visible()
    page.locator("#key").fill("s3cret")
    page.locator("#files").set_input_files(files[3])
    page.wait_for_function("() => window.servePage.done()")
    assert cards.nth(4).locator(".bars .label").all_text_contents() == ["cat"]
    assert seen[-1] == ("/predict", b"key", "Bearer s3cret")
    assert page.evaluate("() => window.hacked") is None and not errors
