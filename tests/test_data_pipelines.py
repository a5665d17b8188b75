"""How a dataset is loaded: one pipeline object per way, chosen once from the spec and the settings; the checkpoint's
own predict-only data; the shard format's reader and writer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from litdata import StreamingDataLoader
from torch.utils.data import DataLoader

import vit.data.datamodule as datamodule_module
from vit.data import (
    DataError,
    DecodedLoader,
    DecodedPipeline,
    ImageDataModule,
    PerImagePipeline,
    ShardPipeline,
    build_transforms,
    load_rgb,
)
from vit.data.shard_format import FORMAT, META, read_meta, write_meta
from vit.data.shard_writer import prepare_shards

pytestmark = pytest.mark.usefixtures("one_thread")


def _tree(root: Path, size: tuple[int, int]) -> None:
    """``train/`` (6 per class) and ``val/`` (3 per class) of crops of scikit-learn's two sample photographs."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(0)
    for split, count in (("train", 6), ("val", 3)):
        for name, photo in zip(("china", "flower"), load_sample_images().images, strict=True):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                top, left = rng.integers(0, 427 - size[0]), rng.integers(0, 640 - size[1])
                crop = photo[top : top + size[0], left : left + size[1]]
                Image.fromarray(crop).save(root / split / name / f"{i}.jpg", quality=95)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Folder trees of small (40x60) and of ImageNet-size (96x128) photographs, and the shards of each."""
    paths = {}
    for name, size in (("small", (40, 60)), ("big", (96, 128))):
        root = tmp_path_factory.mktemp(name)
        _tree(root / "tree", size)
        prepare_shards(dataset="imagefolder", data_dir=str(root / "tree"), out=str(root / "shards"), chunk_bytes="4kB")
        paths[name] = root
    return paths


CASES = {  # dataset, settings -> the pipeline and the loader it hands Lightning
    "digits": ("digits", {}, DecodedPipeline, DecodedLoader),
    "digits-per-image": ("digits", {"decode_once": False}, PerImagePipeline, DataLoader),
    "synthetic": ("synthetic", {"synthetic_size": 16}, PerImagePipeline, DataLoader),
    "small-folder": ("imagefolder", {"data_dir": "small/tree"}, DecodedPipeline, DecodedLoader),
    "big-folder": ("imagefolder", {"data_dir": "big/tree"}, PerImagePipeline, DataLoader),
    "small-shards": ("streaming", {"data_dir": "small/shards"}, DecodedPipeline, DecodedLoader),
    "small-shards-streamed": ("streaming", {"data_dir": "small/shards", "decode_once": False}, ShardPipeline, None),
    "big-shards": ("streaming", {"data_dir": "big/shards"}, ShardPipeline, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_dataset_is_loaded_by_one_pipeline_chosen_once(case, trees, monkeypatch):
    dataset, settings, pipeline_cls, loader_cls = CASES[case]
    if "data_dir" in settings:
        kind, folder = settings["data_dir"].split("/")
        settings = {**settings, "data_dir": str(trees[kind] / folder)}
    chosen = []
    choose = datamodule_module.choose_pipeline

    def spy(module):
        chosen.append(choose(module))
        return chosen[-1]

    monkeypatch.setattr(datamodule_module, "choose_pipeline", spy)
    dm = ImageDataModule(dataset, img_size=16, batch_size=4, num_workers=0, pin_memory=False, **settings)
    dm.setup("fit")
    train, val = dm.train_dataloader(), dm.val_dataloader()
    _ = dm.mean, dm.predict_dataloader()
    assert len(chosen) == 1 and type(chosen[0]) is pipeline_cls and dm.pipeline is chosen[0]
    assert dm.train_dataset is chosen[0].train_dataset and dm.val_dataset is chosen[0].val_dataset
    expected = loader_cls or StreamingDataLoader
    assert isinstance(train, expected) and isinstance(val, expected)
    images, labels = next(iter(train))
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 16, 16) and labels.shape == (4,)
    batch = dm.on_after_batch_transfer([images, labels], 0)  # normalised once on the device, whatever the pipeline
    mean = torch.tensor(dm.mean).view(1, 3, 1, 1)
    std = torch.tensor(dm.std).view(1, 3, 1, 1)
    torch.testing.assert_close(batch[0], (images.float() / 255 - mean) / std)


META_OF_CHECKPOINT = {
    "img_size": [16, 16],
    "num_classes": 3,
    "class_names": ["cat", "dog", "owl"],
    "mean": [0.5, 0.4, 0.3],
    "std": [0.2, 0.25, 0.3],
    "eval_transform": "cifar",
}


def _photos(folder: Path, count: int) -> list[Path]:
    from PIL import Image

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    paths = []
    for i in range(count):
        path = folder / f"{i:02d}.png"
        Image.fromarray(rng.integers(0, 256, (20 + i, 24, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


@pytest.mark.parametrize("skip_corrupt", [False, True])
def test_the_checkpoint_data_reads_only_the_predict_folder(tmp_path, skip_corrupt):
    good = _photos(tmp_path / "photos", 5)
    bad = tmp_path / "photos" / "02b.png"
    bad.write_bytes(good[0].read_bytes()[:30])
    like = ImageDataModule(
        "digits", batch_size=8, num_workers=0, predict_dir=str(bad.parent), skip_corrupt=skip_corrupt
    )
    dm = ImageDataModule.from_checkpoint_metadata(META_OF_CHECKPOINT, like)
    assert (dm.num_classes, dm.class_names, dm.img_size, dm.preset) == (3, ["cat", "dog", "owl"], 16, "cifar")
    assert (dm.mean, dm.std) == ((0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    assert (dm.batch_size, dm.skip_corrupt, dm.num_workers) == (8, skip_corrupt, 0)
    assert type(dm.pipeline) is PerImagePipeline and "_spec" not in dm.hparams  # not a setting: no hyper-parameter
    if not skip_corrupt:
        assert dm.predict_paths == sorted(str(p) for p in [*good, bad])
        with pytest.raises(DataError, match=f"cannot read image {bad}.*--data.skip_corrupt true"):
            next(iter(dm.predict_dataloader()))
        return
    with pytest.warns(UserWarning, match=f"skipping unreadable image {bad}"):
        assert dm.predict_paths == [str(p) for p in good]
    assert dm.train_dataset is None and dm.val_dataset is None  # no dataset: nothing else was read
    images, labels = next(iter(dm.predict_dataloader()))
    assert images.shape == (5, 3, 16, 16) and labels.tolist() == [-1] * 5
    eval_transform = build_transforms("cifar", 16, False, dm.mean, dm.std, normalize=False)
    for image, path in zip(images, good, strict=True):
        expected = eval_transform(image=load_rgb(path))["image"]
        assert torch.equal(image, torch.as_tensor(expected))


def test_the_checkpoint_data_has_no_split_to_train_on(tmp_path):
    meta = {**META_OF_CHECKPOINT, "class_names": None}
    dm = ImageDataModule.from_checkpoint_metadata(meta, ImageDataModule("digits"))
    assert dm.class_names == ["0", "1", "2"] and dm.predict_dir is None
    for call in (dm.train_dataloader, dm.val_dataloader, dm.predict_dataloader):
        with pytest.raises(DataError, match="the data of a checkpoint has no (train|val) split.*--data.predict_dir"):
            call()


def test_the_shard_format_is_written_and_read_back(tmp_path):
    meta = write_meta(tmp_path, {"dataset": "digits", "classes": ["0", "1"], "mean": [0.5] * 3, "std": [0.2] * 3})
    assert list(meta)[0] == "format" and meta["format"] == FORMAT
    assert read_meta(tmp_path) == meta == json.loads((tmp_path / META).read_text())
    (tmp_path / META).write_text(json.dumps({"format": "other/2"}))
    with pytest.raises(DataError, match="is not a vit-shards file"):
        read_meta(tmp_path)
    with pytest.raises(DataError, match="not a finished shard folder .*vit data prepare"):
        read_meta(tmp_path / "nowhere")


def test_gpu_decoding_pipeline_hands_jpeg_bytes_to_the_device_step(trees, monkeypatch):
    """``--data.decode_device cuda``: batches of JPEG bytes from the shards, decoded by ``decode_batch_cuda`` in the
    device step (here a CPU stand-in with its signature: the real one needs nvJPEG), then normalised."""
    import vit.data.shard_pipeline as shard_pipeline
    from vit.data import GpuDecodePipeline
    from vit.data.jpeg import decode, eval_crop, resize_flip

    calls = []

    def decode_batch(datas, img_size, train, generator):
        calls.append((len(datas), img_size, train, type(generator).__name__))
        crops = []
        for data in datas:
            image = decode(data)
            crop, _ = eval_crop(image.shape[0], image.shape[1], img_size)
            region = image[crop.top : crop.top + crop.height, crop.left : crop.left + crop.width]
            crops.append(torch.from_numpy(resize_flip(region, img_size, False)).permute(2, 0, 1))
        return torch.stack(crops)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(shard_pipeline, "decode_batch_cuda", decode_batch)
    dm = ImageDataModule("streaming", data_dir=str(trees["big"] / "shards"), img_size=32, batch_size=4,
                         num_workers=0, decode_device="cuda", pin_memory=False)  # fmt: skip
    assert type(dm.pipeline) is GpuDecodePipeline
    datas, labels = next(iter(dm.val_dataloader()))
    assert isinstance(datas, list) and all(isinstance(d, bytes) for d in datas) and labels.shape == (4,)
    images, same_labels = dm.on_after_batch_transfer([datas, labels], 0)
    assert calls == [(4, 32, False, "Generator")] and same_labels is labels
    decoded = decode_batch(datas, 32, False, None).float() / 255
    mean, std = torch.tensor(dm.mean).view(1, 3, 1, 1), torch.tensor(dm.std).view(1, 3, 1, 1)
    torch.testing.assert_close(images, (decoded - mean) / std)
