"""The command-line arguments of the CLI tests: a small synthetic run of a tiny ViT on one CPU thread, its folders,
and the environment of a vit subprocess."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto"]
CPU += ["--trainer.precision", "32-true", "--data.num_workers", "0", "--trainer.enable_progress_bar", "false"]
# A small synthetic run: 32 images of 16 px, batches of 8.
SMALL = ["--data.dataset", "synthetic", "--data.synthetic_size", "32", "--data.batch_size", "8"]
SMALL += ["--data.img_size", "16"]
TINY_VIT = ["--model.model", "vit_tiny_patch4_32", "--model.model_overrides", "{embed_dim: 32, depth: 2, num_heads: 2}"]


def dirs(tmp_path: Path) -> list[str]:
    return ["--trainer.default_root_dir", str(tmp_path), "--checkpoint.dirpath", str(tmp_path / "ckpt")]


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "PYTHONWARNINGS": "ignore"}
