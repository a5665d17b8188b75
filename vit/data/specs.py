"""One small spec per dataset kind: where its splits come from, its statistics, its augmentation preset, its classes.

``DATASETS[name]`` is looked up once by :class:`~vit.data.ImageDataModule`; nothing else in the package compares
dataset names. Adding a dataset is one entry here (and its name in ``DatasetName``).

A spec's ``source(options, train)`` returns either a :class:`~vit.data.decoded.DecodeRequest` (pixels or files that
may be decoded once into a tensor) or, for ``synthetic``, a ready dataset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from PIL import Image
from torch.utils.data import Dataset

from vit.data.datasets import (
    CIFAR10_CLASSES,
    IMG_EXTENSIONS,
    DataError,
    FolderLayout,
    SyntheticDataset,
    list_image_files,
    load_cifar,
    load_digits_split,
)
from vit.data.decoded import DecodeRequest
from vit.data.transforms import Preset
from vit.normalize import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    DIGITS_MEAN,
    DIGITS_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    UNIFORM_MEAN,
    UNIFORM_STD,
    Stats,
)

DatasetName = Literal["cifar10", "cifar100", "imagenet", "imagefolder", "digits", "synthetic", "streaming"]
SMALL_IMAGE_MAX = 64  # images up to this size get the CIFAR-style preset and are decoded once; larger the ImageNet one


class Options(Protocol):
    """What a spec reads from the data module's arguments."""

    data_dir: str | None
    img_size: int
    seed: int
    synthetic_num_classes: int
    synthetic_size: int
    layout: FolderLayout | None


@dataclass(frozen=True)
class DatasetSpec:
    """What differs between dataset kinds.

    Args:
        source: ``(options, train) -> DecodeRequest | Dataset``: the train split, or the val/test split.
        splits: Where the splits come from, for the docs and error messages.
        mean: Per-channel mean; ``None``: from the image size (CIFAR-size folders: computed from the train split).
        std: Per-channel standard deviation, like ``mean``.
        preset: Augmentation family; ``None``: ``cifar`` for images up to 64 px, ``imagenet`` above.
        classes: ``options -> class names`` (known before any image is read).
        num_classes: The number of classes, when known without reading anything.
        folder: Read from a tree of class folders checked as ``imagenet`` (``train/`` + ``val/``) or ``imagefolder``
            (``val/`` or ``test/``); ``None``: not a folder tree.
        download: ``(root) -> None``: fetch the dataset into ``root``; ``None``: nothing to download.
        decodable: Its small images may be decoded once into a tensor (everything but generated data).
        streaming: Shards of ``vit data prepare`` (``data_dir``: their folder or URL), streamed with LitData.
    """

    source: Callable[[Options, bool], DecodeRequest | Dataset]
    splits: str
    classes: Callable[[Options], list[str]]
    mean: Stats | None = None
    std: Stats | None = None
    preset: Preset | None = None
    num_classes: int | None = None
    folder: Literal["imagenet", "imagefolder"] | None = None
    download: Callable[[str], None] | None = None
    decodable: bool = True
    streaming: bool = False


def _cifar(name: Literal["cifar10", "cifar100"]) -> Callable[[Options, bool], DecodeRequest]:
    def source(options: Options, train: bool) -> DecodeRequest:
        root = Path(options.data_dir if options.data_dir is not None else "data")
        data = load_cifar(name, root, train)
        base = root / ("cifar-10-batches-py" if name == "cifar10" else "cifar-100-python")
        files = sorted(p for p in base.iterdir() if p.is_file()) if base.is_dir() else []
        split = "train" if train else "test"
        return DecodeRequest(data.classes, data.images, data.labels, sources=files, root=root, split=split)

    return source


def _cifar100_classes(options: Options) -> list[str]:
    return _cifar("cifar100")(options, False).classes


def _cifar_download(name: Literal["cifar10", "cifar100"]) -> Callable[[str], None]:
    def download(root: str) -> None:
        for train in (True, False):
            load_cifar(name, root, train=train, download=True)

    return download


def _digits(options: Options, train: bool) -> DecodeRequest:
    data = load_digits_split(train)  # bundled with scikit-learn, decoded in milliseconds: no disk cache
    return DecodeRequest(data.classes, data.images, data.labels, split="train" if train else "val")


def _folder(options: Options, train: bool) -> DecodeRequest:
    layout = options.layout
    assert layout is not None
    split_dir = layout.train_dir if train else layout.val_dir
    samples, ignored = list_image_files(split_dir, layout.classes)
    if ignored:
        rank_zero_warn(f"ignored {len(ignored)} file(s) without an image extension under {split_dir}: {ignored[:5]}")
    if not samples:
        raise DataError(f"no image files ({', '.join(IMG_EXTENSIONS)}) under {split_dir}/<class>/")
    root = split_dir.parent
    return DecodeRequest(
        list(layout.classes), samples=samples, sources=[p for p, _ in samples], root=root, split=split_dir.name
    )


def _synthetic(options: Options, train: bool) -> Dataset:
    num_val = max(1, options.synthetic_size // 4)
    return SyntheticDataset(
        options.synthetic_size if train else num_val,
        options.synthetic_num_classes,
        options.img_size,
        seed=options.seed,
        offset=0 if train else options.synthetic_size,
    )


def _streaming(options: Options, train: bool) -> DecodeRequest:
    """A split of small images read whole from the shards, to be decoded once (else: ``ImageDataModule._build``)."""
    from vit.data.prepare import read_meta
    from vit.data.streaming import read_split

    split = "train" if train else "val"
    meta = read_meta(options.data_dir or "")
    root = (options.data_dir or "").rstrip("/")
    return read_split(f"{root}/{split}", meta["images"][split], list(meta["classes"]), options.img_size)


def _streaming_classes(options: Options) -> list[str]:
    from vit.data.prepare import read_meta

    if options.data_dir is None:
        raise DataError("--data.data_dir is required for dataset streaming: the folder vit data prepare wrote")
    return list(read_meta(options.data_dir)["classes"])


def _folder_classes(options: Options) -> list[str]:
    assert options.layout is not None
    return list(options.layout.classes)


DATASETS: dict[str, DatasetSpec] = {
    "cifar10": DatasetSpec(
        _cifar("cifar10"),
        "torchvision's python pickles: 50,000 train images; val/test/predict: the 10,000 test images",
        lambda options: list(CIFAR10_CLASSES),
        CIFAR10_MEAN,
        CIFAR10_STD,
        "cifar",
        num_classes=10,
        download=_cifar_download("cifar10"),
    ),
    "cifar100": DatasetSpec(
        _cifar("cifar100"),
        "torchvision's python pickles: 50,000 train images; val/test/predict: the 10,000 test images",
        _cifar100_classes,
        CIFAR100_MEAN,
        CIFAR100_STD,
        "cifar",
        num_classes=100,
        download=_cifar_download("cifar100"),
    ),
    "digits": DatasetSpec(
        _digits,
        "scikit-learn's 1,797 8x8 digits, split 80/20 (stratified, fixed): 1,437 train, 360 val",
        lambda options: [str(d) for d in range(10)],
        DIGITS_MEAN,
        DIGITS_STD,
        "digits",
        num_classes=10,
    ),
    "imagefolder": DatasetSpec(
        _folder,
        "<data_dir>/train/<class>/ and <data_dir>/val/<class>/ (or test/)",
        _folder_classes,
        folder="imagefolder",
    ),
    "imagenet": DatasetSpec(
        _folder,
        "<data_dir>/train/<wnid>/ and <data_dir>/val/<wnid>/",
        _folder_classes,
        IMAGENET_MEAN,
        IMAGENET_STD,
        "imagenet",
        folder="imagenet",
    ),
    "synthetic": DatasetSpec(
        _synthetic,
        "seeded random images: synthetic_size train, a quarter as many val",
        lambda options: [f"class_{i}" for i in range(options.synthetic_num_classes)],
        UNIFORM_MEAN,
        UNIFORM_STD,
        decodable=False,
    ),
    "streaming": DatasetSpec(
        _streaming,
        "<data_dir>/train/ and <data_dir>/val/: LitData shards written by `vit data prepare` (a folder or URL)",
        _streaming_classes,
        streaming=True,
    ),
}


def folder_image_size(layout: FolderLayout) -> int:
    """The larger side of the first image of the first class folders of ``train/`` (read from its header only).

    Args:
        layout: A checked folder tree.
    """
    for name in layout.classes[:3]:
        samples, _ = list_image_files(layout.train_dir, [name])
        for path, _ in samples[:1]:
            try:
                with Image.open(path) as image:
                    return max(image.size)
            except OSError:
                continue
    return SMALL_IMAGE_MAX + 1  # nothing readable here: the per-image ImageNet path reports the files one by one
