"""Shared test settings (deterministic CPU runs, offline W&B, no network) and factories: a tiny model, a tiny
``ImageClassifier``, a CPU ``Trainer``, the digits data module and a checkpoint trained on them."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

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


@contextlib.contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def one_thread():
    """One intra-op thread for a test, restored after it (the CLI's ``torch_num_threads`` sets it for the whole
    process): small matrices gain nothing from two, and on a shared machine OpenMP's barriers stall whenever another
    process holds a core."""
    with _threads(1):
        yield


@pytest.fixture
def random_vit():
    """Build tiny ViTs whose attention is random, not near-uniform: ``random_vit(**VisionTransformer kwargs)``
    draws every parameter from N(0, 0.3²) with the test's generator (seeded per test)."""
    from vit import VisionTransformer

    def build(**config) -> VisionTransformer:
        model = VisionTransformer(**config)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.3)
        return model

    return build


class TinyViT:
    """``tiny_vit(name="vit_tiny_patch4_32", **overrides)``: preset ``name`` at the tests' size (:attr:`size`: width 32,
    two blocks, two heads; the preset's 32 px images in 4 px patches, 10 classes), ``overrides`` on top;
    ``tiny_vit.config(name, **overrides)``: its constructor arguments (for a timm twin)."""

    size = {"embed_dim": 32, "depth": 2, "num_heads": 2}

    def config(self, name: str = "vit_tiny_patch4_32", **overrides: Any) -> dict[str, Any]:
        from vit.models import model_config

        return model_config(name, **{**self.size, **overrides})

    def __call__(self, name: str = "vit_tiny_patch4_32", **overrides: Any):
        from vit import create_model

        return create_model(name, **{**self.size, **overrides})


@pytest.fixture(scope="session")
def tiny_vit() -> TinyViT:
    """:class:`TinyViT`: ``tiny_vit(name, **overrides)`` builds a tiny ``VisionTransformer``."""
    return TinyViT()


@pytest.fixture(scope="session")
def tiny_classifier():
    """``tiny_classifier(name="vit_tiny_patch4_32", model_overrides=None, seed=None, **kwargs)``: an ``ImageClassifier``
    of :class:`TinyViT`'s size (``model_overrides`` on top of it), 10 classes and 32 px images unless ``kwargs`` say
    otherwise; ``seed``: ``torch.manual_seed(seed)`` just before, for runs compared weight for weight."""
    from vit import ImageClassifier

    def build(name: str = "vit_tiny_patch4_32", model_overrides: dict | None = None, seed: int | None = None, **kwargs):
        if seed is not None:
            torch.manual_seed(seed)
        kwargs = {"num_classes": 10, "img_size": 32, **kwargs}
        return ImageClassifier(name, model_overrides={**TinyViT.size, **(model_overrides or {})}, **kwargs)

    return build


@pytest.fixture
def class_model(random_vit):
    """A :func:`random_vit` of the explorer tests: global attention with a class token, two register tokens and an
    attention-pooling head."""
    torch.manual_seed(0)
    return random_vit(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5, reg_tokens=2, global_pool="map"
    ).eval()


@pytest.fixture
def explain(capsys):
    """``explain(*args)``: ``vit explain`` (:func:`vit.explain.command.main`) in this process: an object with its
    ``returncode``, ``stdout`` and ``stderr``."""
    from vit.explain.command import main

    def run(*args) -> SimpleNamespace:
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as stop:  # bad input: one error line through vit.errors.fail
            code = stop.code
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    return run


@pytest.fixture
def checkpoint(trained_checkpoint) -> Path:
    """The session's tiny digits checkpoint (:func:`trained_checkpoint`), as the ``vit explain`` tests name it."""
    return trained_checkpoint


@pytest.fixture
def keep_threads():
    """Each test may set torch's thread count; the next one starts from the one before."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny(tiny_classifier):
    """``tiny(**kwargs)``: :func:`tiny_classifier` with three blocks, on 16 px images unless ``img_size`` says
    otherwise; ``model_overrides`` go on top of its size."""

    def build(model_overrides: dict | None = None, img_size: int = 16, **kwargs):
        return tiny_classifier(model_overrides={"depth": 3, **(model_overrides or {})}, img_size=img_size, **kwargs)

    return build


@pytest.fixture
def cpu_trainer(tmp_path):
    """``cpu_trainer(**overrides)``: a Lightning ``Trainer`` on one CPU writing to ``tmp_path``, with no logger,
    checkpoints, progress bar, model summary or sanity validation unless ``overrides`` ask for them."""
    import lightning.pytorch as pl

    def build(**overrides) -> pl.Trainer:
        defaults = dict(
            accelerator="cpu",
            devices=1,
            default_root_dir=tmp_path,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        return pl.Trainer(**{**defaults, **overrides})

    return build


@pytest.fixture(scope="session")
def digits():
    """``digits(**overrides)``: a fresh digits ``ImageDataModule`` (scikit-learn's, offline): 32 px, batches of 16,
    no worker processes, seed 0, ``overrides`` on top."""
    from vit import ImageDataModule

    def build(**overrides) -> ImageDataModule:
        return ImageDataModule(**{"dataset": "digits", "img_size": 32, "batch_size": 16, "num_workers": 0, **overrides})

    return build


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory, tiny_classifier, digits) -> Path:
    """A Lightning checkpoint of :func:`tiny_classifier` (seed 0) after three steps on :func:`digits`, without
    validation; shared by the whole session, so read it, never write it."""
    import lightning.pytorch as pl

    folder = tmp_path_factory.mktemp("trained")
    module = tiny_classifier(seed=0)
    trainer = pl.Trainer(
        default_root_dir=folder,
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=3,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, digits())
    trainer.save_checkpoint(folder / "tiny.ckpt")
    return folder / "tiny.ckpt"


@pytest.fixture(scope="module")
def trained_batch(trained_checkpoint, digits):
    """The model of :func:`trained_checkpoint` in eval mode and its first normalised validation batch with labels."""
    from vit import ImageClassifier

    model = ImageClassifier.load_from_checkpoint(trained_checkpoint, map_location="cpu").eval_model.eval()
    data = digits()
    data.setup("fit")
    images, labels = next(iter(data.val_dataloader()))
    images = data.normalize(images) if not images.is_floating_point() else images
    return model, images, labels


PHOTO_CLASSES = ["china", "flower"]


@pytest.fixture(scope="session")
def photo_tree():
    """Write a class-folder tree of real photographs: ``photo_tree(root, per_class=4, big=True) -> counts``.

    ``train/<class>/`` and ``val/<class>/`` (:data:`PHOTO_CLASSES`, one class per scikit-learn sample photograph)
    of JPEG crops, 40x60, and with ``big`` the first of each class 300x400; ``val`` gets half as many.
    """
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_images

    def make(root: Path, per_class: int = 4, big: bool = True) -> dict[str, int]:
        photos = load_sample_images().images
        rng = np.random.default_rng(0)
        counts = {"train": 0, "val": 0}
        for split, n in (("train", per_class), ("val", max(1, per_class // 2))):
            for label, name in enumerate(PHOTO_CLASSES):
                folder = root / split / name
                folder.mkdir(parents=True)
                for i in range(n):
                    h, w = (300, 400) if big and i == 0 else (40, 60)
                    top, left = rng.integers(0, 427 - h), rng.integers(0, 640 - w)
                    Image.fromarray(photos[label][top : top + h, left : left + w]).save(folder / f"{i}.jpg", quality=95)
                    counts[split] += 1
        return counts

    return make


@pytest.fixture(scope="module")
def one_thread_per_module():
    """:func:`one_thread` for a whole module, its module-scoped fixtures included: runs compared bit for bit must sum
    in the same order."""
    with _threads(1):
        yield


class TinyFit:
    """The arguments of a tiny CPU ``vit fit`` (``epochs`` x :attr:`steps_per_epoch` steps, no logger), with dropout,
    drop-path, Mixup/CutMix and an EMA, so that resume tests see every piece of state; checkpoints in
    ``root/checkpoints``."""

    overrides = {"embed_dim": 32, "depth": 2, "num_heads": 2, "drop_rate": 0.1, "drop_path_rate": 0.1}
    steps_per_epoch = 6
    epochs = 2

    def __call__(self, root: Path, *extra: str, dataset: str = "synthetic", epochs: int | None = None) -> list[str]:
        return [
            "fit",
            "--seed_everything=0",
            "--trainer.accelerator=cpu",
            "--trainer.devices=1",
            f"--trainer.max_epochs={epochs or self.epochs}",
            f"--trainer.limit_train_batches={self.steps_per_epoch}",
            "--trainer.limit_val_batches=2",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={root}",
            "--model.model=vit_tiny_patch4_32",
            f"--model.model_overrides={json.dumps(self.overrides)}",
            "--model.mixup_alpha=0.8",
            "--model.cutmix_alpha=1.0",
            "--model.ema_decay=0.9",
            "--model.warmup_steps=2",
            f"--data.dataset={dataset}",
            "--data.img_size=16",
            "--data.batch_size=16",
            "--data.synthetic_size=96",
            "--data.num_workers=0",
            "--data.augment=basic",
            f"--checkpoint.dirpath={root / 'checkpoints'}",
            *extra,
        ]


@pytest.fixture(scope="session")
def fit_args() -> TinyFit:
    """:class:`TinyFit`: ``fit_args(root, *extra, dataset=..., epochs=...)`` and its constants."""
    return TinyFit()


@pytest.fixture(scope="session")
def digits_test_args():
    """``digits_test_args(checkpoint, root, *extra)``: the arguments of a CPU ``vit test`` of ``checkpoint`` on the
    digits' validation split, no logger, its files under ``root``."""

    def args(checkpoint: Path, root: Path, *extra: str) -> list[str]:
        return [
            "test",
            f"--ckpt_path={checkpoint}",
            "--data.dataset=digits",
            "--data.num_workers=0",
            "--trainer.accelerator=cpu",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={root}",
            *extra,
        ]

    return args


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium (the system's) under Playwright; skips locally, fails under CI, when either is missing."""
    from browser import launch_browser

    yield from launch_browser()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The PostgreSQL server of the sweep tests, ``VIT_TEST_POSTGRES_URL`` (``.ci/run`` starts one on loopback);
    skips locally, fails under CI, without it."""
    url = os.environ.get("VIT_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("CI needs the PostgreSQL tests: VIT_TEST_POSTGRES_URL is not set (.ci/run starts a server)")
        pytest.skip("no PostgreSQL server: set VIT_TEST_POSTGRES_URL=postgresql://USER@HOST:PORT/DATABASE")
    return url


@pytest.fixture(scope="session")
def free_port():
    """A function returning a TCP port of 127.0.0.1 that nothing listens on now (bound by the OS, then released)."""
    import socket

    def pick() -> int:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    return pick
