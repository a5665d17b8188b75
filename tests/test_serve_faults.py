"""``vit serve`` under faults, each on a server of its own: a full queue answers 503 at once and SIGTERM drains; a
worker that dies is restarted and its request answered 503; a request held past ``--timeout`` answers 504 and leaves
nothing in LitServe's response buffer."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from serve_process import NAMES, ROOT, require, start, stop, wait_ready, write_files

requests = pytest.importorskip("requests")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    return write_files(tmp_path_factory.mktemp("serve"))


@pytest.mark.slow  # a second server
def test_a_full_queue_answers_503_at_once_and_sigterm_drains(files, tmp_path, free_port):
    """max_queue 1 and a model held busy (tests/serve_gate.py): the second request is refused with Retry-After; on
    SIGTERM new requests get 503, the one in flight finishes, the server exits 0."""
    process, url, checkpoint = start_gated(files, tmp_path, free_port)
    image = (files["folder"] / files["images"][0]).read_bytes()
    try:
        wait_ready(url, process)
        held: dict = {}
        first = threading.Thread(target=lambda: held.update(response=requests.post(
            f"{url}/predict", data=image, headers={"Content-Type": "image/png"}, timeout=120)))  # fmt: skip
        first.start()
        deadline = time.monotonic() + 60
        while "vit_serve_queue_depth 1.0" not in requests.get(f"{url}/metrics", timeout=10).text:
            assert time.monotonic() < deadline, "the first request never reached the model"
            time.sleep(0.1)
        full = requests.post(f"{url}/predict", data=image, headers={"Content-Type": "image/png"}, timeout=10)
        assert full.status_code == 503 and full.headers["Retry-After"] == "1" and "--max_queue" in full.json()["error"]
        process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while requests.get(f"{url}/metrics", timeout=10).status_code != 503:
            assert time.monotonic() < deadline, "new requests were still accepted after SIGTERM"
            time.sleep(0.1)
        Path(str(checkpoint) + ".gate").touch()
        first.join(timeout=120)
        assert held["response"].status_code == 200 and held["response"].json()[0]["label"] in NAMES
        assert process.wait(timeout=60) == 0
    finally:
        Path(str(checkpoint) + ".gate").touch()
        stop(process)


def start_gated(files: dict, tmp_path: Path, free_port, *options: str) -> tuple[subprocess.Popen, str, Path]:
    """tests/serve_gate.py on a free port: the process, its URL, and its checkpoint (``.gate`` opens the model)."""
    require("litserve")
    checkpoint = tmp_path / "gated.ckpt"
    checkpoint.write_bytes(files["checkpoint"].read_bytes())
    port = free_port()
    script = [sys.executable, str(ROOT / "tests" / "serve_gate.py"), str(checkpoint), str(port), *options]
    return start(script, tmp_path), f"http://127.0.0.1:{port}", checkpoint


def post_image(url: str, files: dict, timeout: float = 120):
    image = (files["folder"] / files["images"][0]).read_bytes()
    return requests.post(f"{url}/predict", data=image, headers={"Content-Type": "image/png"}, timeout=timeout)


@pytest.mark.slow  # a second server
@pytest.mark.parametrize("batch", [1, 4])  # LitServe's single loop says which worker took a request; its batched not
def test_a_worker_that_dies_is_restarted_and_its_request_answered(files, tmp_path, free_port, batch):
    """The worker process killed while it holds a request: that request is answered 503 (long before --timeout), the
    worker comes back, the next request gets 200, and the server stays up; killed again while idle, waiting on the
    request queue, it comes back and answers too."""
    psutil = require("psutil")
    options = ("timeout=600", "max_queue=4", f"max_batch_size={batch}")
    process, url, checkpoint = start_gated(files, tmp_path, free_port, *options)
    try:
        wait_ready(url, process)
        pid_file = Path(str(checkpoint) + ".pid")
        worker = int(pid_file.read_text())
        assert worker in [p.pid for p in psutil.Process(process.pid).children(recursive=True)]
        held: dict = {}
        first = threading.Thread(target=lambda: held.update(response=post_image(url, files)))
        first.start()
        deadline = time.monotonic() + 60
        while "vit_serve_queue_depth 1.0" not in requests.get(f"{url}/metrics", timeout=10).text:
            assert time.monotonic() < deadline, "the first request never reached the model"
            time.sleep(0.1)
        psutil.Process(worker).kill()
        first.join(timeout=120)
        assert held["response"].status_code == 503 and "restarted" in held["response"].json()["error"]
        assert held["response"].headers["Retry-After"] == "1"
        Path(str(checkpoint) + ".gate").touch()
        deadline = time.monotonic() + 120
        while (response := post_image(url, files)).status_code != 200:
            assert response.status_code in (503, 504) and time.monotonic() < deadline, response.text
        assert response.json()[0]["label"] in NAMES and process.poll() is None
        idle = int(pid_file.read_text())
        assert idle != worker
        psutil.Process(idle).kill()  # killed while it waits on the request queue: its restart must still get requests
        deadline = time.monotonic() + 120
        while (response := post_image(url, files, timeout=30)).status_code != 200:
            assert response.status_code in (503, 504) and time.monotonic() < deadline, response.text
        assert int(pid_file.read_text()) not in (worker, idle) and process.poll() is None
    finally:
        Path(str(checkpoint) + ".gate").touch()
        stop(process)


@pytest.mark.slow  # a second server
def test_timeout_answers_504_and_the_server_keeps_serving(files, tmp_path, free_port):
    """A forward held past --timeout: 504 with one JSON line; once the model answers again, 200."""
    process, url, checkpoint = start_gated(files, tmp_path, free_port, "timeout=2", "max_queue=4")
    try:
        wait_ready(url, process)
        response = post_image(url, files)
        assert response.status_code == 504 and list(response.json()) == ["error"]
        assert "--timeout" in response.json()["error"]
        Path(str(checkpoint) + ".gate").touch()
        assert post_image(url, files).status_code == 200
    finally:
        Path(str(checkpoint) + ".gate").touch()
        stop(process)


def test_a_timed_out_request_leaves_nothing_in_the_response_buffer():
    """LitServe keeps each request's answer slot in ``response_buffer`` until it is answered: a request that times
    out must not leave its slot behind (the buffer would grow by one per 504)."""
    require("litserve")
    import asyncio
    import queue
    from types import SimpleNamespace

    from vit.serve.errors import RequestError
    from vit.serve.server import Endpoints

    submitted: queue.Queue = queue.Queue()

    async def submit_request(payload):
        submitted.put(payload)
        return f"uid-{submitted.qsize()}", 0

    server = SimpleNamespace(vit_timeout=0.05, response_buffer={"earlier": object()})
    endpoints = Endpoints.__new__(Endpoints)
    endpoints.server, endpoints.handler = server, SimpleNamespace(_submit_request=submit_request)
    for _ in range(3):
        with pytest.raises(RequestError) as err:
            asyncio.run(endpoints.submit({"kind": "predict"}))
        assert err.value.status == 504
    assert submitted.qsize() == 3 and list(server.response_buffer) == ["earlier"]
