"""Shared test settings: deterministic CPU runs, offline W&B, no network."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_DISABLE_GIT", "true")


@pytest.fixture(autouse=True)
def _seed_and_isolate(tmp_path, monkeypatch):
    torch.manual_seed(0)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / ".wandb_cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / ".wandb_config"))
    yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
