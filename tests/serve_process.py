"""A ``vit serve`` process for the tests: a tiny calibrated checkpoint and two images to send, the server started and
stopped, its readiness awaited, and optional modules required under CI."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit import ImageClassifier
from vit.checkpoints import METADATA_KEY, inference_metadata

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["cat", "dog", "ship", "frog", "bird", "tree", "car"]


def require(module: str):
    """``module``, skipping the test without it, except under CI where it must be installed."""
    if os.environ.get("CI"):
        return __import__(module, fromlist=["_"])
    return pytest.importorskip(module)


def save_checkpoint(path: Path) -> Path:
    """A tiny 7-class model as ``vit fit`` writes its inference entry, calibrated (temperature 1.7)."""
    torch.manual_seed(0)
    module = ImageClassifier("vit_tiny_patch4_32", num_classes=7, model_overrides={"embed_dim": 32, "depth": 2,
                                                                                    "num_heads": 2})  # fmt: skip
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    meta = inference_metadata(module.model, module.hparams, NAMES, (0.4, 0.5, 0.6), (0.2, 0.25, 0.3), "cifar")
    checkpoint[METADATA_KEY] = {**meta, "temperature": 1.7}
    torch.save(checkpoint, path)
    return path


def encode(array: np.ndarray, kind: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, kind)
    return buffer.getvalue()


def wait_ready(url: str, process: subprocess.Popen, headers: dict | None = None, limit: float = 240) -> None:
    import requests  # the test modules skip without it

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read() if process.stdout else "the server exited"
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    pytest.fail("the server did not become ready")


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VIT_SERVE_API_KEY": ""}
    return subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def write_files(folder: Path) -> dict:
    """Two images (a PNG and a JPEG) and the tiny checkpoint in ``folder``: its path, the checkpoint's, the names."""
    rng = np.random.default_rng(0)
    images = {"a.png": rng.integers(0, 256, (40, 50, 3), dtype=np.uint8),
              "b.jpg": rng.integers(0, 256, (64, 48, 3), dtype=np.uint8)}  # fmt: skip
    for name, array in images.items():
        (folder / name).write_bytes(encode(array, "PNG" if name.endswith("png") else "JPEG"))
    return {"folder": folder, "checkpoint": save_checkpoint(folder / "tiny.ckpt"), "images": list(images)}
