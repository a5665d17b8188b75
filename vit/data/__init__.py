"""Data: dataset specs, decoded-once tensors with batched augmentation, albumentations transforms, datasets and the
``ImageDataModule``."""

from vit.data.batch_augment import BatchAugment, crop_flip, draw_crop_flip
from vit.data.datamodule import ImageDataModule
from vit.data.datasets import (
    CIFAR10_CLASSES,
    IMG_EXTENSIONS,
    ArrayDataset,
    DataError,
    FolderLayout,
    ImageFileDataset,
    SyntheticDataset,
    check_image_folder,
    collate_skip_none,
    list_image_files,
    list_predict_files,
    load_cifar,
    load_digits_split,
    load_rgb,
)
from vit.data.decoded import DecodedSplit
from vit.data.decoded_loader import DecodedLoader
from vit.data.jpeg import JpegCrop, decode_batch_cuda
from vit.data.prepare import prepare_shards, read_meta
from vit.data.specs import DATASETS, DatasetName, DatasetSpec
from vit.data.streaming import ShardImages, ShardLoader
from vit.data.transforms import (
    EVAL_CROP_FRACTION,
    Augment,
    Preset,
    build_transforms,
    seed_transform,
)
from vit.data.workers import SkipReportingDataLoader, default_num_workers, seed_worker
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
    denormalize,
    normalize,
)

__all__ = [
    "ArrayDataset",
    "BatchAugment",
    "DATASETS",
    "DatasetSpec",
    "DecodedLoader",
    "DecodedSplit",
    "crop_flip",
    "default_num_workers",
    "draw_crop_flip",
    "list_predict_files",
    "Augment",
    "CIFAR10_CLASSES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR100_MEAN",
    "CIFAR100_STD",
    "DIGITS_MEAN",
    "DIGITS_STD",
    "DataError",
    "DatasetName",
    "EVAL_CROP_FRACTION",
    "FolderLayout",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMG_EXTENSIONS",
    "ImageDataModule",
    "ImageFileDataset",
    "JpegCrop",
    "ShardImages",
    "ShardLoader",
    "decode_batch_cuda",
    "prepare_shards",
    "read_meta",
    "Preset",
    "SkipReportingDataLoader",
    "Stats",
    "SyntheticDataset",
    "UNIFORM_MEAN",
    "UNIFORM_STD",
    "build_transforms",
    "check_image_folder",
    "collate_skip_none",
    "denormalize",
    "list_image_files",
    "load_cifar",
    "load_digits_split",
    "load_rgb",
    "normalize",
    "seed_transform",
    "seed_worker",
]
