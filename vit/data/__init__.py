"""Data: dataset specs, the loading pipelines (decoded-once tensors with batched augmentation, per-image files,
streamed shards), albumentations transforms, datasets, the shard format and the ``ImageDataModule``.

Names are imported on first use (PEP 562, :mod:`vit.lazy`): ``import vit.data`` alone loads no torch, so ``vit data
prepare --help`` answers at once."""

from typing import TYPE_CHECKING

from vit.lazy import attach, type_checking_names

if TYPE_CHECKING:  # the public names, imported on first use; type checkers and the API docs read them here
    from vit.data.batch_augment import BatchAugment, crop_flip, draw_crop_flip
    from vit.data.datamodule import ImageDataModule, choose_pipeline
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
    from vit.data.decoded_pipeline import DecodedPipeline
    from vit.data.jpeg import JpegCrop, decode_batch_cuda
    from vit.data.pipeline import PerImagePipeline, Pipeline
    from vit.data.shard_format import read_meta
    from vit.data.shard_pipeline import GpuDecodePipeline, ShardPipeline
    from vit.data.shard_writer import prepare_shards
    from vit.data.specs import DATASETS, DatasetName, DatasetSpec, predict_only_spec
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

__getattr__, __dir__ = attach(__name__, type_checking_names(__file__))

__all__ = [
    "ArrayDataset",
    "BatchAugment",
    "DATASETS",
    "DatasetSpec",
    "DecodedLoader",
    "DecodedPipeline",
    "DecodedSplit",
    "GpuDecodePipeline",
    "PerImagePipeline",
    "Pipeline",
    "ShardPipeline",
    "choose_pipeline",
    "predict_only_spec",
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
