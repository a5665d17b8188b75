"""``vit bench --suite serve``: ``vit serve`` under load, driven by locust on the loopback interface.

The suite starts ``vit serve MODEL`` as a subprocess on ``127.0.0.1`` (a free port), waits for ``/health`` and then
measures, each number against the one it should be compared with:

- ``offline_images_per_s``: the model's own rate, :meth:`ServeModel.predict` on full batches (``max_batch_size``)
  in this process with the server's thread count: the limit no server on these cores can pass.
- ``saturation``: images/s the server answers 200 when ``4 x max_batch_size`` clients (at most ``max_queue``) ask
  without pause (closed loop); its ratio to the offline rate is what HTTP, decoding and batching cost.
- ``unloaded``: the latency of single requests one after another (nothing else in flight), against ``loads``:
  latency percentiles (p50, p90, p99 of the 200 answers) and served images/s at offered loads that are fractions
  of the saturation rate (0.5: half; 2: twice what the server can do). Above saturation the clients outnumber
  ``max_queue``, so the server must shed load: every request must be answered 200 or 503 (``lost`` counts the
  requests refused, reset, timed out or never answered).
- ``backends``: torch against ONNX Runtime at batch 1 (a ``vit export --onnx`` folder, exported to a temporary
  folder when MODEL is a checkpoint): offline forward time (the backends in alternating rounds, so that a drift of
  the machine's speed falls on both) and served unloaded latency, and the server's own time per request: each
  request's latency less its forward pass, which the server reports (``Server-Timing``).
- ``soak`` (``soak_s > 0``): half the saturation rate for ``soak_s`` seconds; the server's resident memory (its
  process and children) at the start and the end.

Every locust run is bounded in clients, requests and seconds and stops by itself. The report goes to the JSON
(``report["serve"]``) and a figure (latency percentiles and throughput against offered load).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vit.bench.harness import BenchError, log, write_report
from vit.bench.serve_goals import serve_checks
from vit.bench.serve_offline import backend_rates, load_model, offline_rate, onnx_folder
from vit.bench.serve_report import plot_load, print_loads
from vit.errors import VitError

LOCUSTFILE = Path(__file__).with_name("serve_locustfile.py")
STARTUP_S = 300.0
"""Seconds ``vit serve`` may take to answer ``/health`` (loading torch and the model on a busy machine)."""


def free_port() -> int:
    """A TCP port of the loopback interface that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running ``vit serve`` subprocess: its URL and process."""

    url: str
    process: subprocess.Popen
    log: Path


@contextlib.contextmanager
def serving(
    model: str | Path, folder: Path, *, options: Sequence[str] = (), startup_s: float = STARTUP_S
) -> Iterator[Server]:
    """``vit serve model`` on ``127.0.0.1`` and a free port, ready (``/health`` answers 200); stopped (SIGTERM, then
    SIGKILL after 30 s) on exit. Its output goes to a log file in ``folder``."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "vit", "serve", str(model), "--host", "127.0.0.1", "--port", str(port), *options]
    log_path = folder / f"serve-{port}.log"
    with open(log_path, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(url, process, log_path)
    try:
        deadline = time.monotonic() + startup_s
        while not _healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise BenchError(f"vit serve {model} did not become ready on {url}:\n{tail}")
            time.sleep(0.5)
        yield server
    finally:
        _stop(process)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
            return answer.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its children (LitServe's workers are processes)."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total


def unloaded_requests(url: str, image: Path, requests: int) -> tuple[list[float], list[dict[str, float]]]:
    """Milliseconds of ``requests`` single requests one after another on one keep-alive connection (as locust's users
    and HTTP sessions send them; the first, a warm-up, is left out), and the server's own timings of each
    (:func:`server_timings`)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    data, headers = image.read_bytes(), {"Content-Type": "image/png"}
    times, timings = [], []
    try:
        for _ in range(requests + 1):
            start = time.perf_counter()
            connection.request("POST", "/predict", data, headers)
            answer = connection.getresponse()
            body = answer.read()
            times.append((time.perf_counter() - start) * 1000)
            if answer.status != 200:
                raise BenchError(f"POST {url}/predict answered {answer.status}: {body[:300]!r}")
            timings.append(server_timings(answer.getheader("Server-Timing")))
    finally:
        connection.close()
    return times[1:], timings[1:]


def server_timings(header: str | None) -> dict[str, float]:
    """The milliseconds a ``Server-Timing`` header gives, by metric: ``model;dur=2.6;desc="...", total;dur=4.5`` is
    ``{"model": 2.6, "total": 4.5}`` (``vit serve``: the forward pass, and the request from its arrival to its
    answer). Enough for the headers ``vit serve`` writes: a quoted description holding a comma, or spaces around
    ``=``, are not read."""
    found = re.findall(r"(?:^|,)\s*([\w-]+)[^,]*?;\s*dur=([0-9.]+)", header or "")
    return {name: float(ms) for name, ms in found}


def drive(
    server: Server,
    image: Path,
    folder: Path,
    *,
    users: int,
    rate: float,
    seconds: float,
    timeout: float = 60.0,
    bad_every: int = 0,
    max_requests: int = 0,
) -> dict[str, Any]:
    """One bounded locust run against ``server``: ``users`` clients of ``rate`` requests/s each (``0``: no pause)
    for ``seconds`` (then the answers still out are awaited); the answers by status, the latencies of the 200
    answers and the server's memory.

    Returns:
        ``offered_rps`` (``users x rate``, ``None`` without pause), ``sent``, ``bad`` (of them without an image),
        ``status`` (count per status code as a string; ``"0"``: no answer), ``lost`` (sent but not answered by the
        server), ``errors`` (client-side kinds), ``served_ips`` (200 answers per second), ``p50_ms``, ``p90_ms``,
        ``p99_ms``, ``rss_start``, ``rss_end``.
    """
    out = folder / f"locust-{time.monotonic_ns()}.json"
    env = {**os.environ, "VIT_LOCUST_IMAGE": str(image), "VIT_LOCUST_RATE": str(rate),
           "VIT_LOCUST_TIMEOUT": str(timeout), "VIT_LOCUST_BAD_EVERY": str(bad_every),
           "VIT_LOCUST_MAX_REQUESTS": str(max_requests), "VIT_LOCUST_OUT": str(out),
           "VIT_LOCUST_SECONDS": str(seconds)}  # fmt: skip
    command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", str(users), "-r",
               str(users), "--run-time", f"{round(seconds + timeout) + 10}s", "--stop-timeout", "5",
               "--host", server.url, "--only-summary", "--loglevel", "WARNING"]  # fmt: skip
    rss_start = rss_bytes(server.process.pid)
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=seconds + timeout + 60)
    except subprocess.TimeoutExpired as err:
        raise BenchError(f"locust did not stop by itself within {seconds + timeout + 60:.0f} s") from err
    if not out.exists():
        raise BenchError(f"locust wrote no record (exit {done.returncode}):\n{done.stderr[-2000:]}")
    record = json.loads(out.read_text())
    status = {k: int(v) for k, v in record["status"].items()}
    answered = sum(v for k, v in status.items() if k != "0")
    ok = np.asarray(record["ok_ms"], dtype=float)
    span = (record["last"] - record["first"]) if record["first"] is not None else 0.0
    return {
        "users": users,
        "offered_rps": users * rate if rate > 0 else None,
        "seconds": seconds,
        "sent": record["sent"],
        "bad": record["bad"],
        "status": status,
        "lost": record["sent"] - answered,
        "errors": record["errors"],
        "served_ips": status.get("200", 0) / span if span > 0 else 0.0,
        **{f"p{q}_ms": float(np.percentile(ok, q)) if ok.size else None for q in (50, 90, 99)},
        "rss_start": rss_start,
        "rss_end": rss_bytes(server.process.pid),
    }


def noise_image(folder: Path, size: int, seed: int = 0) -> Path:
    """A PNG of random pixels, ``size`` square: every request decodes, resizes and classifies it."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    path = folder / f"image-{size}.png"
    Image.fromarray(pixels).save(path)
    return path


def server_options(
    *, backend: str, threads: int | None, max_batch_size: int, max_queue: int, batch_timeout: float | None = None
) -> list[str]:
    """``vit serve``'s options of the suite's server: one worker with the suite's threads."""
    options = ["--backend", backend, "--max_batch_size", str(max_batch_size), "--max_queue", str(max_queue)]
    options += ["--batch_timeout", f"{batch_timeout:g}"] if batch_timeout is not None else []
    return options + (["--threads", str(threads)] if threads else [])


def load_sweep(
    server: Server, image: Path, folder: Path, *, fractions: Sequence[float], saturation: float,
    max_batch_size: int, max_queue: int, seconds: float,
) -> list[dict[str, Any]]:  # fmt: skip
    """One locust run per offered load, ``fraction x saturation`` requests/s: up to saturation ``2 x
    max_batch_size`` clients (enough to keep batches full), above it more clients than ``max_queue`` holds."""
    steps = []
    for fraction in fractions:
        users = 2 * max_batch_size if fraction <= 1 else max_queue + 2 * max_batch_size
        step = drive(server, image, folder, users=users, rate=fraction * saturation / users, seconds=seconds)
        step["fraction"] = fraction
        steps.append(step)
        log(f"serve: {fraction:g} x saturation ({step['offered_rps']:.1f} req/s offered): {step['served_ips']:.1f} "
            f"img/s, p50 {step['p50_ms'] or float('nan'):.0f} ms, p99 {step['p99_ms'] or float('nan'):.0f} ms, "
            f"status {step['status']}, lost {step['lost']}")  # fmt: skip
    return steps


TIMED_PARTS = ("model", "worker", "handover", "total")
"""The ``Server-Timing`` metrics that split the server's own time (:func:`vit.serve.server.model_timing`)."""


def own_time(times: Sequence[float], timings: Sequence[dict[str, float]]) -> dict[str, float]:
    """The server's own time per request at p50, from its ``Server-Timing``: ``own_p50_ms`` as the server measures
    it (``total`` less ``model``: HTTP, decoding, the hand-over to the worker and back), ``own_client_p50_ms`` as the
    client sees it (its latency less ``model``: the client's own work and the socket's too), and the forward pass
    itself (``served_model_p50_ms``); nothing when the server sent no timings. Where the server also sent ``worker``
    and ``handover``, the parts of its own time at p50: ``own_worker_p50_ms`` (the worker's time less the forward
    pass: decoding, the top classes; of the whole batch, so per request only at batch 1, as here),
    ``own_handover_p50_ms`` (LitServe's hand-over to the worker and back) and
    ``own_http_p50_ms`` (the rest: the HTTP process's reading, parsing and encoding)."""
    timed = [(t, s["model"], s["total"]) for t, s in zip(times, timings, strict=True) if {"model", "total"} <= set(s)]
    if not timed:
        return {}
    latency, model, total = (np.array(column) for column in zip(*timed, strict=True))
    own = {"served_model_p50_ms": float(np.median(model)), "own_p50_ms": float(np.median(total - model)),
           "own_client_p50_ms": float(np.median(latency - model))}  # fmt: skip
    parts = [(s["model"], s["worker"], s["handover"], s["total"]) for s in timings if set(TIMED_PARTS) <= set(s)]
    if len(parts) == len(timed):
        model, worker, handover, total = (np.array(column) for column in zip(*parts, strict=True))
        own.update(own_worker_p50_ms=float(np.median(worker - model)), own_handover_p50_ms=float(np.median(handover)),
                   own_http_p50_ms=float(np.median(total - worker - handover)))  # fmt: skip
    return own


def skipped_row(backend: str, err: Exception) -> dict[str, str]:
    """The row of a backend that could not be measured: its name and the first line of why."""
    return {"backend": backend, "skipped": str(err).splitlines()[0]}


def compare_backends(
    model: str | Path, image: Path, folder: Path, *, backends: Sequence[str], threads: int | None, requests: int
) -> list[dict[str, Any]]:
    """Per backend at batch 1: the offline forward time (the backends timed in alternating rounds,
    :func:`~vit.bench.serve_offline.backend_rates`) and the served latency of single requests, unloaded."""
    sources, skipped, served = {}, {}, {}
    for backend in backends:
        try:
            sources[backend] = onnx_folder(model, folder) if backend == "onnx" else model
            served[backend] = load_model(sources[backend], backend, threads)
        except (BenchError, ImportError, VitError) as err:  # VitError: e.g. an export folder, onnxruntime missing
            skipped[backend] = skipped_row(backend, err)
    rows = backend_rates(served, image, seconds=4.0) if served else {}  # 10 rounds of 0.4 s per backend
    served.clear()
    for backend, row in rows.items():
        try:
            options = server_options(backend=backend, threads=threads, max_batch_size=1, max_queue=8)
            with serving(sources[backend], folder, options=options) as server:
                times, timings = unloaded_requests(server.url, image, requests)
            row.update(served_p50_ms=float(np.median(times)), served_p90_ms=float(np.percentile(times, 90)))
            row.update(own_time(times, timings))
        except (BenchError, ImportError, VitError) as err:
            skipped[backend] = skipped_row(backend, err)
    result = [skipped.get(backend) or rows[backend] for backend in backends]
    for row in result:
        log(f"serve: backend {row['backend']} at batch 1: {row}")
    return result


def preset_checkpoint(name: str, folder: Path, seed: int = 0) -> Path:
    """A checkpoint of preset ``name`` with random weights (``seed``), as ``vit fit`` writes one (its inference
    metadata included): what ``--serve_model preset:NAME`` serves where no trained model is at hand; the speed is
    the same."""
    import torch

    from vit.checkpoints.metadata import METADATA_KEY, inference_metadata
    from vit.lit_module import ImageClassifier

    torch.manual_seed(seed)
    module = ImageClassifier(name)
    path = folder / f"{name}.ckpt"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
                METADATA_KEY: inference_metadata(module.model, module.hparams)}, path)  # fmt: skip
    return path


def check_model(model: str | None) -> str | None:
    """The preset's name of ``preset:NAME``, else ``None`` for a path that exists.

    Raises:
        BenchError: No model, an unknown preset, or a path that does not exist.
    """
    if not model:
        raise BenchError("--suite serve needs --serve_model: a checkpoint, a vit export folder or preset:NAME")
    if model.startswith("preset:"):
        from vit.models.presets import list_models

        name = model.removeprefix("preset:")
        if name not in list_models():
            raise BenchError(f"--serve_model {model}: no such preset; known: {', '.join(list_models())}")
        return name
    if not Path(model).exists():
        raise BenchError(f"--serve_model {model}: no such file or folder (or preset:NAME for random weights)")
    return None


def run_serve_suite(
    *,
    report: dict[str, Any],
    model: str | None,
    threads: int | None = None,
    max_batch_size: int = 8,
    max_queue: int = 64,
    batch_timeout: float | None = None,
    seconds: float = 20.0,
    fractions: Sequence[float] = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0),
    backends: Sequence[str] = ("torch", "onnx"),
    soak_s: float = 0.0,
    figure: str | None = None,
    seed: int = 0,
    json_path: str | None = None,
) -> dict[str, Any]:
    """Measure ``vit serve model`` under load (see the module's docstring), print the table and checks, fill
    ``report["serve"]``, write the JSON and the figure; returns ``report["serve"]``.

    Args:
        report: The report to fill (written to ``json_path`` after each stage).
        model: What ``vit serve`` takes, a checkpoint or a ``vit export`` folder; or ``preset:NAME``, a preset of
            :func:`vit.list_models` with random weights (:func:`preset_checkpoint`).
        threads: Threads of the server's worker and of the offline measurement (``None``: the server's default).
        max_batch_size: The server's ``--max_batch_size`` (and the offline batch).
        max_queue: The server's ``--max_queue``.
        batch_timeout: The server's ``--batch_timeout``; ``None``: its default (recorded as such).
        seconds: Length of each locust run (saturation and every offered load).
        fractions: Offered loads as fractions of the saturation rate.
        backends: Compared at batch 1 (``()``: no comparison).
        soak_s: Seconds at half the saturation rate, memory measured before and after (``0``: no soak).
        figure: The PNG (default: beside ``json_path``, else ``serve_load.png``).
        seed: Seed of the test image.
        json_path: Where the report is written.
    """
    preset = check_model(model)
    if batch_timeout is None:
        from vit.serve.command import build_parser

        batch_timeout = build_parser().get_default("batch_timeout")
    figure = figure or (str(Path(json_path).with_suffix(".png")) if json_path else "serve_load.png")
    entry: dict[str, Any] = {"model": str(model), "threads": threads, "max_batch_size": max_batch_size,
                             "batch_timeout": batch_timeout, "max_queue": max_queue, "seconds": seconds,
                             "load_before": os.getloadavg()}  # fmt: skip
    report["serve"] = entry
    with tempfile.TemporaryDirectory(prefix="vit-bench-serve-") as tmp:
        folder = Path(tmp)
        if preset:
            model = preset_checkpoint(preset, folder, seed)
            log(f"serve: {preset} with random weights in {model}")
        served = load_model(model, "torch", threads)
        image = noise_image(folder, served.input_size[-1], seed)
        entry["offline"] = offline_rate(served, image, batch=max_batch_size, seconds=min(10.0, seconds))
        del served
        log(f"serve: offline batched forward {entry['offline']['images_per_s']:.1f} img/s")
        options = server_options(backend="torch", threads=threads, max_batch_size=max_batch_size, max_queue=max_queue,
                                 batch_timeout=batch_timeout)  # fmt: skip
        with serving(model, folder, options=options) as server:
            entry["unloaded_ms"] = unloaded_requests(server.url, image, 20)[0]
            entry["unloaded_p50_ms"] = float(np.median(entry["unloaded_ms"]))
            users = min(4 * max_batch_size, max_queue)
            entry["saturation"] = drive(server, image, folder, users=users, rate=0, seconds=seconds)
            log(f"serve: saturation {entry['saturation']['served_ips']:.1f} img/s")
            saturation = max(entry["saturation"]["served_ips"], 1.0)
            entry["loads"] = load_sweep(
                server, image, folder, fractions=fractions, saturation=saturation,
                max_batch_size=max_batch_size, max_queue=max_queue, seconds=seconds,
            )  # fmt: skip
            write_report(json_path, report)
            if soak_s > 0:
                users = 2 * max_batch_size
                entry["soak"] = drive(server, image, folder, users=users, rate=0.5 * saturation / users, seconds=soak_s)
        entry["backends"] = compare_backends(model, image, folder, backends=backends, threads=threads, requests=50)
    entry["load_after"] = os.getloadavg()
    entry["figure"] = figure
    plot_load(entry, figure)
    print_loads(entry)
    entry["checks"] = serve_checks(entry)
    write_report(json_path, report)
    return entry
