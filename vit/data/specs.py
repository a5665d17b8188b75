"""One small spec per dataset kind: where its splits come from, its statistics, its augmentation preset, its classes.

``DATASETS[name]`` is looked up once by :class:`~vit.data.ImageDataModule`; nothing else in the package compares
dataset names. Adding a dataset is one entry here (and its name in ``DatasetName``). :func:`predict_only_spec` is
the one spec without a name: a checkpoint's own description of its data (``vit predict --ckpt_path CKPT
--data.predict_dir DIR`` with no dataset at hand).

A spec's ``source(options, train)`` returns either a :class:`~vit.data.decoded.DecodeRequest` (pixels or files that
may be decoded once into a tensor) or, for ``synthetic``, a ready dataset.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
    check_image_folder,
    list_image_files,
    load_cifar,
    load_digits_split,
)
from vit.data.decoded import DecodeRequest
from vit.data.shard_format import read_meta
from vit.data.streaming import read_split
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
    holdout: int


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
        predict_only: No train or val split: only ``predict_dir``'s images are read (a checkpoint's description).
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
    predict_only: bool = False


def checked_layout(spec: DatasetSpec, data_dir: str | None) -> FolderLayout | None:
    """The checked class-folder tree of a folder spec (no file opened), warning about classes never validated;
    ``None`` for other specs.

    Args:
        spec: The dataset's spec.
        data_dir: Its ``--data.data_dir``.

    Raises:
        DataError: The tree is not laid out as the spec expects.
    """
    if spec.folder is None:
        return None
    layout = check_image_folder(data_dir, spec.folder)
    if layout.missing_in_val:
        rank_zero_warn(
            f"class folders in {layout.train_dir} but not in {layout.val_dir}: "
            f"{layout.missing_in_val}; they will never be validated"
        )
    return layout


@dataclass(frozen=True)
class SpecOptions:
    """The :class:`Options` of a spec outside a data module (``vit data prepare`` reads a dataset with them).

    Args:
        data_dir: The dataset's root.
        img_size: Image size (only ``synthetic`` and shards of mixed sizes read it).
        seed: Seed of generated data.
        synthetic_num_classes: Classes of ``synthetic``.
        synthetic_size: Training images of ``synthetic``.
        layout: The checked folder tree of a folder spec.
        holdout: Training images held out to validate on instead of ``val/`` (:func:`held_out`); ``0``: none.
    """

    data_dir: str | None
    img_size: int = 32
    seed: int = 0
    synthetic_num_classes: int = 10
    synthetic_size: int = 1024
    layout: FolderLayout | None = None
    holdout: int = 0

    @classmethod
    def of(cls, spec: DatasetSpec, data_dir: str | None) -> SpecOptions:
        """Default options for ``spec`` read from ``data_dir`` (a folder spec's tree checked here).

        Args:
            spec: The dataset's spec.
            data_dir: Its ``--data.data_dir``.
        """
        return cls(data_dir, layout=checked_layout(spec, data_dir))


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


def held_out(
    samples: Sequence[tuple[str, int]], holdout: int, train: bool, classes: Sequence[str]
) -> list[tuple[str, int]]:
    """The training images less ``holdout`` of them (``train``), or those ``holdout`` (``not train``): of each class,
    its share of ``holdout`` (rounded), the last of its files sorted by path. The same files each time, on every
    machine: a split for choosing settings that never looks at the test images.

    Args:
        samples: ``(path, label)`` of the training images, sorted by path within each class.
        holdout: How many to hold out, in all.
        train: Return what is left to train on; else what is held out.
        classes: Class names by label (for the error message).

    Raises:
        DataError: ``holdout`` would leave a class with nothing to train on, or hold out none of it.
    """
    by_class: dict[int, list[tuple[str, int]]] = {}
    for sample in samples:
        by_class.setdefault(sample[1], []).append(sample)
    kept: list[tuple[str, int]] = []
    for label, files in by_class.items():
        count = round(holdout * len(files) / len(samples))
        if not 0 < count < len(files):
            raise DataError(
                f"--data.holdout {holdout} would hold out {count} of the {len(files)} training images of class "
                f"{classes[label]}: each class needs at least one image held out and one left to train on "
                f"({len(samples)} training images in {len(by_class)} classes); choose a "
                f"{'larger' if count == 0 else 'smaller'} --data.holdout"
            )
        kept += files[: len(files) - count] if train else files[len(files) - count :]
    return kept


def _folder(options: Options, train: bool) -> DecodeRequest:
    layout = options.layout
    assert layout is not None
    split_dir = layout.train_dir if train or options.holdout else layout.val_dir
    samples, ignored = list_image_files(split_dir, layout.classes)
    if ignored:
        rank_zero_warn(f"ignored {len(ignored)} file(s) without an image extension under {split_dir}: {ignored[:5]}")
    if not samples:
        raise DataError(f"no image files ({', '.join(IMG_EXTENSIONS)}) under {split_dir}/<class>/")
    split = split_dir.name
    if options.holdout:
        samples = held_out(samples, options.holdout, train, layout.classes)
        split = f"{'train-less' if train else 'holdout'}-{options.holdout}"  # their own decoded-once caches
    return DecodeRequest(
        list(layout.classes), samples=samples, sources=[p for p, _ in samples], root=split_dir.parent, split=split
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
    """A split of small images read whole from the shards, to be decoded once (else: :mod:`vit.data.shard_pipeline`
    streams them)."""
    split = "train" if train else "val"
    meta = read_meta(options.data_dir or "")
    root = (options.data_dir or "").rstrip("/")
    return read_split(f"{root}/{split}", meta["images"][split], list(meta["classes"]), options.img_size)


def _streaming_classes(options: Options) -> list[str]:
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


def predict_only_spec(
    class_names: Sequence[str], mean: Stats, std: Stats, preset: Preset, description: str = "a checkpoint"
) -> DatasetSpec:
    """The data a trained model describes by itself (its checkpoint's metadata): class names, statistics and eval
    transform, and no dataset: only ``predict_dir``'s images are read, through the eval transform.

    Args:
        class_names: Class names indexed by label (their number is the model's class count).
        mean: Per-channel mean the model was trained with.
        std: Per-channel standard deviation, like ``mean``.
        preset: The eval transform's preset (``cifar``, ``digits`` or ``imagenet``).
        description: What the data comes from, for the error when a split is asked for.
    """

    def source(options: Options, train: bool) -> DecodeRequest:
        raise DataError(
            f"the data of {description} has no {'train' if train else 'val'} split, only --data.predict_dir's "
            "images; give --data.predict_dir DIR, or --config / --data.dataset for the data it was trained on"
        )

    names = list(class_names)
    return DatasetSpec(
        source,
        f"{description}: no dataset, only --data.predict_dir",
        lambda options: list(names),
        tuple(mean),  # type: ignore[arg-type]
        tuple(std),  # type: ignore[arg-type]
        preset,
        num_classes=len(names),
        decodable=False,
        predict_only=True,
    )


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
