"""``--data.dataset streaming``: disjoint parts per rank, an exact mid-epoch resume, eval splits, ImageDataModule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from vit.data import DataError, DecodedSplit, ImageDataModule
from vit.data.shard_writer import prepare_shards, read_meta
from vit.data.streaming import ShardImages, ShardLoader, read_split


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory, photo_tree) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("tree")
    photo_tree(root, per_class=12, big=False)  # 24 train, 12 val images
    dest = tmp_path_factory.mktemp("shards") / "dest"
    meta = prepare_shards(dataset="imagefolder", data_dir=str(root), out=str(dest), chunk_bytes="4kB")
    return dest, meta


def _ids(loader: ShardLoader, batches: int | None = None) -> list[int]:
    out: list[int] = []
    for i, batch in enumerate(loader):
        out += batch[2].tolist()
        if batches is not None and i + 1 == batches:
            break
    return out


def _loader(dest: Path, seed: int = 3, batch_size: int = 4, num_workers: int = 0) -> ShardLoader:
    dataset = ShardImages(str(dest / "train"), 16, train=True, seed=seed, return_ids=True)
    return ShardLoader(dataset, batch_size=batch_size, num_workers=num_workers)


def test_epochs_shuffle_each_sample_once_seeded(shards: tuple[Path, dict]) -> None:
    dest, meta = shards
    loader = _loader(dest)
    first, second = _ids(loader), _ids(loader)
    assert sorted(first) == sorted(second) == list(range(meta["images"]["train"]))
    assert first != second  # a new order per epoch
    again = _loader(dest)
    assert (_ids(again), _ids(again)) == (first, second)  # the same seed, the same orders
    assert _ids(_loader(dest, seed=4)) != first


_RANK = """
import json, sys
from vit.data.streaming import ShardImages, ShardLoader
out = {}
for batch_size in (2, 5):
    loader = ShardLoader(ShardImages(sys.argv[1], 16, train=True, seed=3, return_ids=True), batch_size=batch_size)
    out[batch_size] = [[[i for i in batch[2].tolist()] for batch in loader] for _ in range(2)]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_ranks_get_disjoint_parts_of_equal_whole_batches(shards: tuple[Path, dict]) -> None:
    dest, meta = shards
    n = meta["images"]["train"]
    parts = []
    for rank in (0, 1):  # LitData reads the rank and world size from the environment without torch.distributed
        env = {**os.environ, "WORLD_SIZE": "2", "GLOBAL_RANK": str(rank)}
        done = subprocess.run(
            [sys.executable, "-c", _RANK, str(dest / "train")], env=env, capture_output=True, text=True, check=True
        )
        parts.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for epoch in (0, 1):
        zero, one = ([i for batch in part["2"][epoch] for i in batch] for part in parts)
        assert zero and one and not set(zero) & set(one)
        assert sorted(zero + one) == list(range(n))  # 24 = 2 ranks x 6 batches of 2: every sample exactly once
        # Batches of 5: 24 is not a multiple of 2 x 5. Each rank gets the same number of whole batches (under DDP a
        # rank with one batch more would wait for the others at the end of the epoch); 4 samples are left out.
        fives = [part["5"][epoch] for part in parts]
        assert [len(batches) for batches in fives] == [2, 2] and all(len(b) == 5 for r in fives for b in r)
        seen = [i for batches in fives for b in batches for i in b]
        assert len(set(seen)) == len(seen) == 20 and set(seen) <= set(range(n))
    assert parts[0]["2"][0] != parts[0]["2"][1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_mid_epoch_resume_goes_on_at_the_next_sample(shards: tuple[Path, dict], num_workers: int) -> None:
    dest, _ = shards
    uninterrupted = _loader(dest, num_workers=num_workers)
    _ids(uninterrupted)
    epoch_one = _ids(uninterrupted)

    stopped = _loader(dest, num_workers=num_workers)
    _ids(stopped)
    head = _ids(stopped, batches=2)
    state = stopped.state_dict()
    assert state == {"epoch": 1, "batches": 2}
    saved = torch.load(_save(dest, state), weights_only=True)  # as it travels in a checkpoint

    resumed = _loader(dest, num_workers=num_workers)
    resumed.load_state_dict(saved)
    tail = _ids(resumed)
    assert head + tail == epoch_one
    assert len(tail) == len(epoch_one) - 8
    assert _ids(resumed) == _ids(_loader_at_epoch(dest, 2, num_workers))  # and the next epoch is epoch 2's order


def _save(dest: Path, state: dict) -> Path:
    path = dest.parent / "state.pt"
    torch.save(state, path)
    return path


def _loader_at_epoch(dest: Path, epoch: int, num_workers: int) -> ShardLoader:
    loader = _loader(dest, num_workers=num_workers)
    for _ in range(epoch):
        _ids(loader)
    return loader


@pytest.mark.parametrize("size", [24, 72])
def test_datamodule_streams_every_split(shards: tuple[Path, dict], size: int) -> None:
    dest, meta = shards
    dm = ImageDataModule(
        dataset="streaming", data_dir=str(dest), img_size=size, batch_size=5, num_workers=0, decode_once=False
    )
    assert dm.preset == "cifar" and not dm.decoded  # 40x60 photographs: small, at any img_size, as in their folder
    assert dm.num_classes == 2 and dm.class_names == meta["classes"]
    assert dm.mean == tuple(meta["mean"]) and dm.std == tuple(meta["std"])
    dm.setup("fit")
    train = list(dm.train_dataloader())
    assert len(train) == meta["images"]["train"] // 5  # the incomplete last batch dropped
    images, labels = train[0]
    assert images.shape == (5, 3, size, size) and images.dtype == torch.uint8 and labels.dtype == torch.int64
    for loader in (dm.val_dataloader(), dm.test_dataloader(), dm.predict_dataloader()):
        batches = list(loader)
        assert sum(len(b[1]) for b in batches) == meta["images"]["val"]  # every val image, the last batch kept
    val = ShardImages(str(dest / "val"), size, train=False, return_ids=True)
    ids = [val[i][2] for i in range(len(val))]
    assert ids == list(range(meta["images"]["val"]))  # eval splits keep the stored order
    first = [b[0] for b in dm.val_dataloader()]
    assert all(torch.equal(a, b) for a, b in zip(first, [b[0] for b in dm.val_dataloader()], strict=True))


def test_shards_of_large_photographs_stream_at_any_img_size(tmp_path: Path, photo_tree) -> None:
    """A prepared folder is judged by the size its images are stored at, as the folder is by its images: 300x400
    photographs (stored 256x341) stream with the ImageNet preset even at 32 px, never read whole into memory."""
    photo_tree(tmp_path / "tree", per_class=1, big=True)  # every image 300x400
    prepare_shards(dataset="imagefolder", data_dir=str(tmp_path / "tree"), out=str(tmp_path / "shards"))
    kwargs = dict(img_size=32, batch_size=1, num_workers=0)
    folder = ImageDataModule(dataset="imagefolder", data_dir=str(tmp_path / "tree"), **kwargs)
    stream = ImageDataModule(dataset="streaming", data_dir=str(tmp_path / "shards"), **kwargs)
    assert stream.preset == folder.preset == "imagenet" and not stream.decoded and not folder.decoded
    stream.setup("fit")
    assert isinstance(stream.train_dataset, ShardImages)
    assert next(iter(stream.train_dataloader()))[0].shape == (1, 3, 32, 32)


def test_an_empty_split_is_one_clear_error(small_tree: Path) -> None:
    with pytest.raises(DataError, match="holds no samples"):
        read_split(str(small_tree / "shards" / "val"), 0, ["china", "flower"], 32)


def test_shard_metadata_is_read_from_a_url(small_tree: Path) -> None:
    """``--data.data_dir`` may be a URL (``s3://``, ``gs://``): its ``vit-shards.json`` is read through fsspec, here
    from fsspec's in-memory file system."""
    import fsspec

    text = (small_tree / "shards" / "vit-shards.json").read_text()
    with fsspec.open("memory://bucket/shards/vit-shards.json", "w") as file:
        file.write(text)
    assert read_meta("memory://bucket/shards/") == json.loads(text)
    with pytest.raises(DataError, match="not a finished shard folder"):
        read_meta("memory://bucket/elsewhere")


def test_streaming_needs_prepared_shards(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not a finished shard folder"):
        _ = ImageDataModule(dataset="streaming", data_dir=str(tmp_path)).num_classes


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on machines without CUDA")
def test_cuda_decoding_without_cuda_is_one_clear_error(shards: tuple[Path, dict]) -> None:
    with pytest.raises(DataError, match="--data.decode_device cuda needs a CUDA GPU"):
        ImageDataModule(dataset="streaming", data_dir=str(shards[0]), decode_device="cuda")


class _Recorder(pl.LightningModule):
    """A linear model that keeps every training batch's images."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3 * 16 * 16, 2)
        self.batches: list[torch.Tensor] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.batches.append(batch[0].clone())
        return torch.nn.functional.cross_entropy(self.linear(batch[0].flatten(1)), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_fit_resumed_from_a_mid_epoch_checkpoint_sees_the_next_samples(
    shards: tuple[Path, dict], tmp_path: Path, cpu_trainer
) -> None:
    dest, _ = shards

    def fit(max_steps: int, ckpt_path: str | None = None) -> tuple[pl.Trainer, _Recorder]:
        dm = ImageDataModule(
            dataset="streaming", data_dir=str(dest), img_size=16, batch_size=4, num_workers=0, decode_once=False
        )
        trainer = cpu_trainer(max_steps=max_steps)
        model = _Recorder()
        trainer.fit(model, dm, ckpt_path=ckpt_path)
        return trainer, model

    _, uninterrupted = fit(9)  # 6 batches an epoch: epoch 0 and half of epoch 1
    stopped, first = fit(8)  # stopped two batches into epoch 1
    stopped.save_checkpoint(tmp_path / "last.ckpt")
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)["loops"]["fit_loop"]["state_dict"]
    assert saved["combined_loader"] == [{"epoch": 1, "batches": 2}]
    _, resumed = fit(9, str(tmp_path / "last.ckpt"))
    assert len(resumed.batches) == 1
    assert all(torch.equal(a, b) for a, b in zip(first.batches + resumed.batches, uninterrupted.batches, strict=True))


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A class-folder tree of 32x32 photographs (12 train, 6 val), as CIFAR's, and its shards beside it."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    root = tmp_path_factory.mktemp("small")
    photos, rng = load_sample_images().images, np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 3)):
        for label, name in enumerate(["china", "flower"]):
            (root / "tree" / split / name).mkdir(parents=True)
            for i in range(n):
                top, left = rng.integers(0, 427 - 96), rng.integers(0, 640 - 96)
                crop = Image.fromarray(photos[label][top : top + 96, left : left + 96]).resize((32, 32))
                crop.save(root / "tree" / split / name / f"{i}.jpg", quality=95)
    prepare_shards(dataset="imagefolder", data_dir=str(root / "tree"), out=str(root / "shards"))
    return root


def test_small_images_from_shards_are_decoded_once_as_from_their_folder(small_tree: Path) -> None:
    kwargs = dict(img_size=32, batch_size=4, num_workers=0, seed=5)
    folder = ImageDataModule(dataset="imagefolder", data_dir=str(small_tree / "tree"), **kwargs)
    stream = ImageDataModule(dataset="streaming", data_dir=str(small_tree / "shards"), **kwargs)
    assert folder.decoded and stream.decoded
    folder.setup("fit")
    stream.setup("fit")
    for mine, theirs in ((stream.train_dataset, folder.train_dataset), (stream.val_dataset, folder.val_dataset)):
        assert isinstance(mine, DecodedSplit) and mine.classes == theirs.classes
        assert torch.equal(mine.labels, theirs.labels)  # the source order, not the shards' shuffled one
        assert (mine.images.int() - theirs.images.int()).abs().max() <= 1  # both decoders are libjpeg-turbo
    # the same seed, the same batches: the decoded-once loader and its batched augmentation, from either source
    batches = [[b for b in dm.train_dataloader()] for dm in (stream, folder)]
    assert len(batches[0]) == len(batches[1]) == 3
    for (a, la), (b, lb) in zip(*batches, strict=True):
        assert torch.equal(la, lb) and (a.int() - b.int()).abs().max() <= 1


def test_small_images_stream_with_the_augmentation_of_their_folder(small_tree: Path) -> None:
    tmp_path = small_tree
    kwargs = dict(img_size=32, batch_size=4, num_workers=0)
    folder = ImageDataModule(dataset="imagefolder", data_dir=str(tmp_path / "tree"), decode_once=False, **kwargs)
    stream = ImageDataModule(dataset="streaming", data_dir=str(tmp_path / "shards"), decode_once=False, **kwargs)
    assert stream.preset == folder.preset == "cifar"
    folder.setup("fit")
    stream.setup("fit")
    # Evaluation: the image itself, as from the folder (both decoders are libjpeg-turbo).
    by_path = {os.fsdecode(p): i for i, p in enumerate(folder.val_dataset._paths)}
    views = {}
    for i in range(len(stream.val_dataset)):
        path = stream.val_dataset.path(i)
        mine, theirs = stream.val_dataset[i][0], folder.val_dataset[by_path[path]][0]
        assert mine.shape == theirs.shape == (3, 32, 32) and mine.dtype == theirs.dtype == torch.uint8
        assert (mine.int() - theirs.int()).abs().max() <= 1, path
        views[path] = mine
    # Training: the folder's pad-crop and flip (a shift of at most 4 pixels, mirrored or not), not a resized crop.
    train = ShardImages(
        str(tmp_path / "shards" / "train"), 32, train=True, image_transform=stream.train_dataset.image_transform
    )
    eval_train = ShardImages(
        str(tmp_path / "shards" / "train"), 32, train=False, image_transform=stream.val_dataset.image_transform
    )
    eval_by_path = {eval_train.path(i): eval_train[i][0] for i in range(len(eval_train))}
    moved = 0
    for i in range(len(train)):
        image, whole = train[i][0].int(), eval_by_path[train.path(i)].int()
        padded = torch.nn.functional.pad(whole, (4, 4, 4, 4))
        matches = [
            (dy, dx, flip)
            for dy in range(9) for dx in range(9) for flip in (False, True)
            if torch.equal((padded.flip(-1) if flip else padded)[:, dy : dy + 32, dx : dx + 32][:, 4:-4, 4:-4],
                           image[:, 4:-4, 4:-4])
        ]  # fmt: skip
        assert matches, train.path(i)
        moved += (4, 4, False) not in matches
    assert moved > len(train) // 2  # most images are shifted or flipped
