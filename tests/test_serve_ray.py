"""The Ray Serve engine (vit.serve.ray_app) on a local Ray instance, loopback only: the answers are ServeModel's, the
Serve config round-trips through app_builder, and a replica killed under load loses no request.

Ray is an optional extra of the install (``vit[serve-ray]``) and part of the dev extra: these tests skip without it,
except under CI, where they fail.
"""

from __future__ import annotations

import base64
import io
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

if os.environ.get("CI"):
    import ray.serve  # noqa: F401 (CI installs the dev extra, which has Ray Serve: missing, the tests fail)
else:
    pytest.importorskip("ray.serve", reason="Ray Serve is an optional extra: pip install 'vit[serve-ray]'")
requests = pytest.importorskip("requests")

pytestmark = pytest.mark.slow


def _png(seed: int, size: int = 32) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def ray_url(trained_checkpoint, free_port):
    """``vit.serve.ray_app.build_app`` of the trained checkpoint, 2 model replicas, on a local Ray instance; the URL."""
    import ray
    from ray import serve

    from vit.serve.ray_app import build_app

    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        # calls wait 1 s for a batch to fill: a replica holds calls nearly all the time (the kill test relies on it)
        app = build_app(
            trained_checkpoint, workers=2, threads=1, cpus_per_replica=0.5, max_batch_size=64, batch_timeout=1.0,
            max_queue=64, timeout=60,
        )  # fmt: skip
        serve.run(app, name="vit", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def reference(trained_checkpoint):
    """The same checkpoint's ServeModel, in this process: the independent answer."""
    from vit.serve.model import ServeModel

    return ServeModel(trained_checkpoint, threads=1)


def _close(served: list[dict], direct: list[dict]) -> None:
    assert [p["label"] for p in served] == [p["label"] for p in direct]
    np.testing.assert_allclose([p["score"] for p in served], [p["score"] for p in direct], rtol=1e-4, atol=1e-6)


def test_answers_are_the_models(ray_url, reference):
    images = [_png(seed) for seed in range(3)]
    direct = reference.predict([reference.decode(b, "image/png") for b in images], top_k=3)

    one = requests.post(f"{ray_url}/predict?top_k=3", data=images[0], headers={"Content-Type": "image/png"}, timeout=60)
    assert one.status_code == 200, one.text
    _close(one.json(), direct[0]["predictions"])

    body = {"images": [base64.b64encode(b).decode() for b in images], "top_k": 3}
    many = requests.post(f"{ray_url}/predict", json=body, timeout=60)
    assert many.status_code == 200, many.text
    assert len(many.json()) == 3
    for served, expected in zip(many.json(), direct, strict=True):
        _close(served, expected["predictions"])

    form = requests.post(f"{ray_url}/predict", files=[("files", ("a.png", images[1], "image/png"))], timeout=60)
    assert form.status_code == 200, form.text
    _close(form.json()[:3], direct[1]["predictions"])
    assert len(form.json()) == min(5, len(reference.class_names))  # default top_k


def test_bad_input_fails_only_itself(ray_url):
    bad = requests.post(f"{ray_url}/predict", data=b"not an image", headers={"Content-Type": "image/png"}, timeout=60)
    assert bad.status_code == 400 and "error" in bad.json()
    body = {"images": [base64.b64encode(_png(0)).decode(), base64.b64encode(b"nope").decode()]}
    mixed = requests.post(f"{ray_url}/predict", json=body, timeout=60)
    assert mixed.status_code == 200
    first, second = mixed.json()
    assert isinstance(first, list) and first[0]["label"] and "error" in second and "label" not in second
    top = requests.post(f"{ray_url}/predict?top_k=0", data=_png(0), headers={"Content-Type": "image/png"}, timeout=60)
    assert top.status_code == 400 and "top_k" in top.json()["error"]
    assert requests.get(f"{ray_url}/health", timeout=30).text == "ok"


def _replica_pids() -> list[int]:
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if "ServeReplica:vit:Classifier" in " ".join(process.info["cmdline"] or []):
            found.append(process.info["pid"])
    return found


def _retries_logged() -> int:
    """The front's log lines for calls whose replica died under them (each retried on another replica)."""
    import ray

    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
    return sum(f.read_text(errors="replace").count("replica died under a call") for f in logs.glob("*Ingress*.log"))


def test_a_killed_replica_loses_no_request(ray_url):
    """80 requests from 16 clients (a few seconds); a model replica is killed (SIGKILL) half a second after the first
    16 are answered, while the next calls wait on it for their batch. Every request is answered 200 (retried on the
    other replica) or 503 (none could answer), none is lost, and the front did retry calls of the killed replica."""
    pids = _replica_pids()
    assert len(pids) == 2, pids
    image, answered = _png(7), threading.Semaphore(0)

    def ask(_: int) -> int:
        try:
            return requests.post(
                f"{ray_url}/predict", data=image, headers={"Content-Type": "image/png"}, timeout=120
            ).status_code
        except requests.RequestException:
            return 0  # refused, reset or timed out: lost
        finally:
            answered.release()

    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(ask, i) for i in range(80)]
        for _ in range(16):
            answered.acquire()
        time.sleep(0.5)
        os.kill(pids[0], signal.SIGKILL)
        codes = [f.result() for f in futures]
    assert len(codes) == 80
    assert set(codes) <= {200, 503}, sorted(set(codes))
    assert codes.count(200) >= 16  # the other replica kept answering
    time.sleep(1)  # the log lines reach their files
    assert _retries_logged() >= 1  # the kill did hit calls in flight
    after = requests.post(f"{ray_url}/predict", data=image, headers={"Content-Type": "image/png"}, timeout=120)
    assert after.status_code == 200


def test_a_full_queue_answers_503_at_once(ray_url, trained_checkpoint):
    """A second application with one replica, batches of 1, a queue of 1 and an API key: 16 clients at once overflow
    it, and the overflow is answered 503 with Retry-After, the rest 200; nothing else. Without the key: 401."""
    from ray import serve

    from vit.serve.ray_app import build_app

    small = build_app(
        trained_checkpoint, workers=1, threads=1, cpus_per_replica=0.5, max_batch_size=1, max_queue=1, api_key="k3y"
    )
    serve.run(small, name="small", route_prefix="/small")
    try:
        image = _png(3)

        def ask(_: int) -> tuple[int, str | None]:
            headers = {"Content-Type": "image/png", "Authorization": "Bearer k3y"}
            answer = requests.post(f"{ray_url}/small/predict", data=image, headers=headers, timeout=120)
            return answer.status_code, answer.headers.get("Retry-After")

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(ask, range(48)))
        denied = requests.post(
            f"{ray_url}/small/predict", data=image, headers={"Content-Type": "image/png"}, timeout=60
        )
        assert denied.status_code == 401 and "error" in denied.json()
        assert requests.get(f"{ray_url}/small/health", timeout=30).status_code == 200  # health needs no key
    finally:
        serve.delete("small")
    codes = [code for code, _ in answers]
    assert set(codes) == {200, 503}, sorted(set(codes))
    assert all(retry == "1" for code, retry in answers if code == 503)


def test_deploy_config_round_trips(trained_checkpoint):
    """The Serve config is valid for Ray's own schema, and its args rebuild the application through app_builder."""
    import yaml
    from ray.serve.schema import ServeDeploySchema

    from vit.serve.ray_app import app_builder, deploy_config

    config = deploy_config(trained_checkpoint, port=8123, autoscale=(1, 4), max_queue=32, max_batch_size=8)
    ServeDeploySchema.model_validate(yaml.safe_load(yaml.safe_dump(config)))  # what `serve deploy` reads
    (application,) = config["applications"]
    classifier = {d["name"]: d for d in application["deployments"]}["Classifier"]
    assert classifier["max_queued_requests"] == 32 and classifier["autoscaling_config"]["max_replicas"] == 4
    assert application["args"]["model"] == str(trained_checkpoint.resolve())
    assert "api_key" not in application["args"]
    app = app_builder(application["args"])
    assert type(app).__name__ == "Application"


def test_the_command_line_grace_reaches_the_deployments(trained_checkpoint, capsys):
    """``vit serve --engine ray --grace 7 --print_config``: both deployments wait 7 s for their calls on shutdown."""
    import yaml

    from vit.main import main

    assert main(["serve", str(trained_checkpoint), "--engine", "ray", "--grace", "7", "--print_config"]) in (0, None)
    (application,) = yaml.safe_load(capsys.readouterr().out)["applications"]
    assert {d["name"]: d["graceful_shutdown_timeout_s"] for d in application["deployments"]} == {
        "Classifier": 7,
        "Ingress": 7,
    }
