"""``vit serve``: a server started on loopback answers as :class:`vit.Predictor` does (raw, multipart and base64
bodies, top-k, the Open Inference Protocol through Triton's client), refuses bad requests with one JSON line and keeps
serving, fails only the bad image of a batch; the ONNX backend agrees with PyTorch; a public bind needs an API key.
Overload and faults, each on a server of its own, are in test_serve_faults.py."""

from __future__ import annotations

import base64
import io
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from serve_process import NAMES, ROOT, encode, require, start, stop, wait_ready, write_files

import vit
from vit.errors import UsageError
from vit.serve.gate import check_bind, is_loopback

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
requests = pytest.importorskip("requests")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    return write_files(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def server(files, free_port):
    """``vit serve`` of the checkpoint on a free loopback port, with an API key and small limits."""
    require("litserve")
    port = free_port()
    limits = ["--max_body", "200000", "--max_image_pixels", "20000"]
    command = [sys.executable, "-m", "vit", "serve", str(files["checkpoint"]), "--port", str(port), "--api_key", KEY]
    process = start([*command, *limits], files["folder"])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process)
        yield {"url": url, "port": port, **files}
    finally:
        stop(process)


def post(server: dict, path: str = "/predict", **kwargs):
    return requests.post(f"{server['url']}{path}", headers={**AUTH, **kwargs.pop("headers", {})}, timeout=60, **kwargs)


def raw(server: dict, name: str, **params):
    kind = "image/png" if name.endswith("png") else "image/jpeg"
    data = (server["folder"] / name).read_bytes()
    return post(server, headers={"Content-Type": kind}, data=data, params=params)


def assert_matches(answer: list[dict], expected: list[tuple[str, float]]) -> None:
    assert [a["label"] for a in answer] == [label for label, _ in expected]
    np.testing.assert_allclose([a["score"] for a in answer], [p for _, p in expected], atol=1e-5)


def test_predict_answers_as_the_predictor_does(server):
    reference = vit.Predictor(server["checkpoint"])([server["folder"] / n for n in server["images"]])
    for name, expected in zip(server["images"], reference, strict=True):
        response = raw(server, name)
        assert response.status_code == 200, response.text
        assert_matches(response.json(), expected.top5)
    three = raw(server, server["images"][0], top_k=3).json()
    assert_matches(three, reference[0].top5[:3])


def test_answers_carry_the_servers_timings(server):
    """`Server-Timing` (W3C): `model`, `worker` and `handover` on an answer that went through the model, `total` on
    every answer; the forward pass is part of the worker's time, the worker's and the hand-over's are parts of the
    request's (they are timed in two processes), and the request part of what the client waited."""

    def metrics(response) -> dict[str, float]:
        items = [[part.strip() for part in item.split(";")] for item in response.headers["Server-Timing"].split(",")]
        return {name: float(dict(p.split("=", 1) for p in params)["dur"]) for name, *params in items}

    answered = raw(server, server["images"][0])
    timings = metrics(answered)
    assert list(timings) == ["model", "worker", "handover", "total"]
    assert 0 < timings["model"] < timings["worker"] < timings["total"] < answered.elapsed.total_seconds() * 1000
    assert 0 < timings["handover"] < timings["total"] - timings["worker"]
    refused = post(server, headers={"Content-Type": "image/png"}, data=b"\x89PNG not really")
    assert refused.status_code == 400 and list(metrics(refused)) == ["total"]


def test_multipart_and_base64_agree_with_raw_bytes(server):
    names = server["images"]
    reference = vit.Predictor(server["checkpoint"])([server["folder"] / n for n in names])
    uploads = [("files", (n, (server["folder"] / n).read_bytes())) for n in names]
    multipart = post(server, files=uploads, data={"top_k": "2"}).json()
    texts = [base64.b64encode((server["folder"] / n).read_bytes()).decode() for n in names]
    as_json = post(server, json={"images": texts, "top_k": 2}).json()
    one = post(server, json={"image": "data:image/png;base64," + texts[0]}).json()
    for answers in (multipart, as_json):
        assert len(answers) == 2
        for answer, expected in zip(answers, reference, strict=True):
            assert_matches(answer, expected.top5[:2])
    assert_matches(one, reference[0].top5)


def test_a_bad_image_among_several_fails_only_itself(server):
    good = (server["folder"] / server["images"][0]).read_bytes()
    uploads = [("file", ("a.png", good)), ("file", ("x.png", b"not an image")), ("file", ("c.png", good))]
    answers = post(server, files=uploads, params={"top_k": 1}).json()
    assert "error" in answers[1] and "not an image" in answers[1]["error"]
    assert answers[0] == answers[2] and answers[0][0]["label"] in NAMES


@pytest.mark.parametrize(
    ("request_kwargs", "status", "words"),
    [
        ({"headers": {"Content-Type": "image/png"}, "data": b"\x89PNG not really"}, 400, "not an image"),
        ({"headers": {"Content-Type": "image/png"}, "data": b"x" * 300_000}, 413, "--max_body"),
        ({"headers": {"Content-Type": "text/plain"}, "data": b"hello"}, 415, "Content-Type text/plain"),
        ({"headers": {"Content-Type": "application/json"}, "data": b"{}"}, 400, "no images"),
        ({"params": {"top_k": "zero"}, "json": {"image": ""}}, 400, "top_k"),
        ({"params": {"explain": "magic"}, "json": {"image": ""}}, 400, "unknown method"),
    ],
)
def test_bad_requests_get_one_json_line_and_the_server_keeps_serving(server, request_kwargs, status, words):
    response = post(server, **request_kwargs)
    assert response.status_code == status, response.text
    assert list(response.json()) == ["error"] and words in response.json()["error"]
    assert "\n" not in response.json()["error"]
    assert raw(server, server["images"][0]).status_code == 200


def test_too_many_pixels_unknown_models_and_the_api_key(server):
    big = encode(np.zeros((200, 200, 3), np.uint8), "PNG")  # 40,000 pixels > --max_image_pixels 20000
    response = post(server, headers={"Content-Type": "image/png"}, data=big)
    assert response.status_code == 413 and "above the limit" in response.json()["error"]
    for path in ("/v2/models/nope", "/nowhere"):
        response = requests.get(server["url"] + path, headers=AUTH, timeout=30)
        assert response.status_code == 404 and list(response.json()) == ["error"]
    assert requests.get(server["url"] + "/info", timeout=30).status_code == 401
    assert requests.get(server["url"] + "/health", timeout=30).status_code == 200  # probes need no key
    assert requests.get(server["url"] + "/", timeout=30).status_code == 200  # nor the page: it asks for the key
    info = requests.get(server["url"] + "/info", headers=AUTH, timeout=30).json()
    assert info["classes"] == NAMES and info["temperature"] == pytest.approx(1.7) and info["input_size"] == [3, 32, 32]


def test_explanations_and_metrics(server):
    answer = raw(server, server["images"][0], explain="default", top_k=2).json()
    explanation = answer[0]["explanation"]
    assert explanation["method"] == "attnlrp" and explanation["signed"] is True
    assert np.asarray(explanation["grid"]).shape == (8, 8)  # 32 px in 4 px patches
    assert explanation["overlay"].startswith("data:image/png;base64,")
    overlay = Image.open(io.BytesIO(base64.b64decode(explanation["overlay"].partition(",")[2])))
    assert overlay.size[1] >= 224
    rollout = raw(server, server["images"][0], explain="rollout", explorer="1").json()[0]["explanation"]
    assert rollout["method"] == "rollout" and rollout["signed"] is False
    assert "rollout" in rollout["explorer"]["map_names"]
    text = requests.get(server["url"] + "/metrics", headers=AUTH, timeout=30).text
    assert 'vit_serve_requests_total{endpoint="/predict",status="200"}' in text
    assert "vit_serve_batch_size_count" in text and "vit_serve_images_total" in text
    assert "vit_serve_queue_depth" in text


def test_open_inference_protocol_with_tritonclient(server):
    triton = require("tritonclient.http")
    # headers=dict(AUTH): the client writes its binary header into the dict it is given
    client = triton.InferenceServerClient(f"127.0.0.1:{server['port']}", connection_timeout=30, network_timeout=60)
    assert client.is_server_live() and client.is_model_ready("tiny", headers=dict(AUTH))
    predictor = vit.Predictor(server["checkpoint"])
    paths = [server["folder"] / n for n in server["images"]]
    expected = predictor.probabilities(paths).numpy()
    inputs = predictor.preprocess(paths).numpy()  # FP32: the eval transform and normalisation, done by the client
    for binary in (True, False):
        tensor = triton.InferInput("images", list(inputs.shape), "FP32")
        tensor.set_data_from_numpy(inputs, binary_data=binary)
        outputs = [triton.InferRequestedOutput("probabilities", binary_data=binary),
                   triton.InferRequestedOutput("logits", binary_data=binary, class_count=2)]  # fmt: skip
        result = client.infer("tiny", [tensor], outputs=outputs, headers=dict(AUTH))
        np.testing.assert_allclose(result.as_numpy("probabilities"), expected, atol=1e-5)
        top = expected.argmax(1)
        labels = [str(row[0], "utf-8") if isinstance(row[0], bytes) else row[0] for row in result.as_numpy("logits")]
        assert [int(s.split(":")[1]) for s in labels] == list(top)
        assert [s.split(":")[2] for s in labels] == [NAMES[i] for i in top]
    encoded = np.array([p.read_bytes() for p in paths], dtype=object)
    tensor = triton.InferInput("image_bytes", [len(paths)], "BYTES")
    tensor.set_data_from_numpy(encoded, binary_data=True)
    result = client.infer("tiny", [tensor], outputs=[triton.InferRequestedOutput("probabilities", class_count=3)],
                          headers=dict(AUTH))  # fmt: skip
    rows = [[s.decode().split(":") for s in row] for row in result.as_numpy("probabilities")]
    for row, probs in zip(rows, expected, strict=True):
        assert [NAMES[int(i)] for _, i, _ in row] == [NAMES[i] for i in np.argsort(-probs)[:3]]
        np.testing.assert_allclose([float(v) for v, _, _ in row], np.sort(probs)[::-1][:3], atol=1e-5)
    with pytest.raises(triton.InferenceServerException, match="unknown model"):
        client.infer("nope", [tensor], headers=dict(AUTH))


def test_onnx_backend_agrees_with_torch(files, tmp_path):
    require("onnxruntime")
    from vit.export import export
    from vit.serve.model import ServeModel

    export(files["checkpoint"], tmp_path / "exported", onnx=True)
    torch_model = ServeModel(tmp_path / "exported", "torch", threads=1)
    onnx_model = ServeModel(tmp_path / "exported", "onnx", threads=1)
    images = [torch_model.decode((files["folder"] / n).read_bytes()) for n in files["images"]]
    inputs = torch.stack([torch_model.predictor.preprocess([image])[0] for image in images])
    expected, got = torch_model.logits(inputs), onnx_model.logits(inputs)
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert (got.argmax(1) == expected.argmax(1)).all()
    reference = vit.Predictor(files["checkpoint"]).probabilities(images).numpy()  # the temperature applies to both
    np.testing.assert_allclose(onnx_model.probabilities(images), reference, atol=1e-5)
    assert onnx_model.info()["backend"] == "onnx" and onnx_model.name == "exported"


def test_the_key_check_and_error_headers_shared_by_both_engines():
    from vit.serve.gate import error_headers, key_error

    assert key_error(None, None) is None and key_error("Bearer x", "") is None  # no key: everything passes
    assert key_error(f"Bearer {KEY}", KEY) is None
    for wrong in (None, "", KEY, f"Bearer {KEY}x", f"bearer {KEY}", "Bearer tést"):
        denied = key_error(wrong, KEY)
        assert denied.status == 401 and "Authorization: Bearer KEY" in denied.message
    assert error_headers(503) == {"Retry-After": "1"} and error_headers(401) == {"WWW-Authenticate": "Bearer"}
    assert error_headers(400) == {}


def test_a_public_bind_needs_an_api_key(monkeypatch):
    monkeypatch.delenv("VIT_SERVE_API_KEY", raising=False)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("example.org")
    assert check_bind("127.0.0.1", None) is None
    with pytest.raises(UsageError, match="--api_key"):
        check_bind("0.0.0.0", None)
    assert check_bind("0.0.0.0", "k") == "k" and check_bind("::", None, insecure=True) is None
    monkeypatch.setenv("VIT_SERVE_API_KEY", "from-env")
    assert check_bind("0.0.0.0", None) == "from-env"


def test_threads_per_worker_are_the_free_cores_shared_among_the_workers(monkeypatch):
    """As ``vit explain`` counts them (the cores less the busy ones, rounded), divided among --workers, at least 1."""
    from vit import env
    from vit.serve.server import worker_threads

    assert worker_threads(1, cores=8, busy=0.0) == 8 and worker_threads(2, cores=8, busy=0.0) == 4
    assert worker_threads(2, cores=8, busy=2.4) == 3  # 8 - 2 free cores, 3 each
    assert worker_threads(1, cores=2, busy=1.6) == 1 and worker_threads(3, cores=2, busy=0.0) == 1
    assert worker_threads(1, cores=4, busy=0.4) == 4  # a noisy machine keeps all its cores
    monkeypatch.setattr(env, "available_cores", lambda: 6)
    monkeypatch.setattr(env, "busy_cores", lambda: 2.0)
    assert worker_threads(2) == 2


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["nope.ckpt"], "nope.ckpt"),
        (["{ckpt}", "--backend", "onnx"], "vit export"),
        (["{ckpt}", "--host", "0.0.0.0"], "--api_key"),
        (["{ckpt}", "--max_queue", "0"], "--max_queue"),
        (["{ckpt}", "--timeout", "0"], "--timeout"),
        (["{ckpt}", "--timeout", "-1"], "--timeout"),
        (["{ckpt}", "--threads", "0"], "--threads"),
        (["{ckpt}", "--max_queu", "3"], "did you mean --max_queue"),
        (["{ckpt}", "--port", "{busy}"], "cannot be bound"),
    ],
)
def test_bad_command_lines_are_one_error_line(files, argv, words, capsys, monkeypatch):
    from vit.main import main

    monkeypatch.delenv("VIT_SERVE_API_KEY", raising=False)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", *[a.format(ckpt=files["checkpoint"], busy=busy.getsockname()[1]) for a in argv]])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("error:") and "\n" not in err and words in err


def test_help_and_bad_options_answer_before_torch_loads():
    code = "import sys; from vit.serve.command import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)  # fmt: skip
    assert out.stdout.strip() == "False"
    from vit.checkpoints.loading import CONFIG_FILE
    from vit.serve.command import EXPORT_CONFIG

    assert EXPORT_CONFIG == CONFIG_FILE


def test_the_page_of_the_real_server_shows_its_own_answer(server, browser, tmp_path):
    """GET / of the running server in headless Chromium: the key asked for (the server has one), a digit uploaded
    through the file input; the card shows the labels /predict answers for that file, top-1 first, and the overlay
    loads."""
    from sklearn.datasets import load_digits

    gray = (load_digits().images[3] * (255 / 16)).round().astype(np.uint8).repeat(4, 0).repeat(4, 1)
    path = tmp_path / "digit.png"
    path.write_bytes(encode(np.repeat(gray[:, :, None], 3, axis=2), "PNG"))
    expected = post(server, headers={"Content-Type": "image/png"}, data=path.read_bytes(), params={"top_k": 5})
    assert expected.status_code == 200, expected.text
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(server["url"] + "/")
        page.wait_for_selector("#key-box", state="visible")  # /info answered 401: the page asks for the key
        page.locator("#key").fill(KEY)
        page.locator("#files").set_input_files(str(path))
        page.wait_for_function("() => window.servePage.done()", timeout=120_000)
        card = page.locator("article.result").first
        assert card.get_attribute("data-state") == "done", card.locator(".error").text_content()
        assert card.locator(".bars li.first .label").text_content() == expected.json()[0]["label"]
        assert card.locator(".bars .label").all_text_contents() == [a["label"] for a in expected.json()]
        overlay = card.locator(".overlay img")
        page.wait_for_function("(img) => img.complete && img.naturalWidth > 0", arg=overlay.element_handle())
        assert overlay.evaluate("(img) => img.naturalWidth") >= 224  # the server's overlay, not the upload
        assert not errors
    finally:
        page.close()


def test_the_gate_counts_a_refused_request_neither_in_nor_out():
    """A full queue refuses with 503 and leaves the count of requests in flight where it was: refusals must not
    make room (before the fix each 503 counted one request out that never came in, and the queue grew by one)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from vit.serve.gate import Gate, Shared

    async def app(scope, receive, send):  # answers 200 at once
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def call(gate):
        sent = []

        async def send(message):
            sent.append(message)

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        scope = {"type": "http", "method": "POST", "path": "/predict", "headers": []}
        await gate(scope, receive, send)
        return sent[0]["status"]

    def status(gate):  # in a thread of its own: a browser test may leave an event loop running in this one
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, call(gate)).result()

    shared = Shared(max_queue=2)
    gate = Gate(app, shared)
    shared.in_flight.value = 2  # two requests held elsewhere
    assert [status(gate) for _ in range(3)] == [503, 503, 503]
    assert shared.in_flight.value == 2
    shared.in_flight.value = 1
    assert status(gate) == 200 and shared.in_flight.value == 1  # in, then out
