"""Prometheus metrics of ``vit serve`` (prometheus-client), gathered over its processes.

The HTTP process counts requests by endpoint and status, their latency and the requests in flight (the queue depth);
the model's workers, separate processes, count the images and the size of each forward pass. prometheus-client's
multiprocess mode joins them: every process writes its values under ``PROMETHEUS_MULTIPROC_DIR`` (a temporary folder
:func:`prepare` creates before any metric exists, inherited by the workers) and ``GET /metrics`` reads them all.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from functools import cache
from typing import Any

ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
ENDPOINTS = ("/predict", "/info", "/metrics", "/health", "/")
"""Endpoints counted under their own path; the V2 ones are ``/v2/...``, every other path ``other``."""


def prepare() -> str | None:
    """Create the folder of multiprocess mode and point :data:`ENV` at it, unless it is set; returns the folder
    created (to remove at exit with :func:`cleanup`) or ``None``. Call before prometheus-client is imported."""
    if os.environ.get(ENV):
        return None
    folder = tempfile.mkdtemp(prefix="vit-serve-metrics-")
    os.environ[ENV] = folder
    return folder


def cleanup(folder: str | None) -> None:
    """Remove the folder :func:`prepare` created."""
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


@cache
def metrics() -> dict[str, Any]:
    """This process's metric objects, created on first use (after :func:`prepare`)."""
    from prometheus_client import Counter, Gauge, Histogram

    return {
        "requests": Counter("vit_serve_requests", "HTTP requests by endpoint and status", ["endpoint", "status"]),
        "latency": Histogram(
            "vit_serve_request_seconds", "Time from request to answer", ["endpoint"], buckets=LATENCY_BUCKETS
        ),  # fmt: skip
        "queue": Gauge(
            "vit_serve_queue_depth", "Inference requests in flight (queued or running)", multiprocess_mode="livesum"
        ),  # fmt: skip
        "batch": Histogram("vit_serve_batch_size", "Images per forward pass of the model", buckets=BATCH_BUCKETS),
        "images": Counter("vit_serve_images", "Images classified"),
    }


def endpoint_label(path: str) -> str:
    """The ``endpoint`` label of a path: a few values, never the path of an arbitrary request."""
    if path in ENDPOINTS:
        return path
    if path.startswith("/v2"):
        return "/v2/infer" if path.endswith("/infer") else "/v2"
    return "other"


def observe_request(path: str, status: int, seconds: float) -> None:
    """Count one answered request."""
    m = metrics()
    label = endpoint_label(path)
    m["requests"].labels(label, str(status)).inc()
    m["latency"].labels(label).observe(seconds)


def set_queue_depth(depth: int) -> None:
    """The number of inference requests in flight."""
    metrics()["queue"].set(depth)


def observe_batch(images: int) -> None:
    """One forward pass of ``images`` images (in a worker)."""
    m = metrics()
    m["batch"].observe(images)
    m["images"].inc(images)


def exposition() -> tuple[bytes, str]:
    """The text of ``GET /metrics`` over every process, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return generate_latest(registry), CONTENT_TYPE_LATEST


__all__ = ["cleanup", "exposition", "observe_batch", "observe_request", "prepare", "set_queue_depth"]
