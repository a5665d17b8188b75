"""``ImageDataModule``: one LightningDataModule for CIFAR-10/100, ImageNet, any class-folder tree, digits, synthetic
data and the shards of ``vit data prepare``, with seeded, resumable loading.

What differs between datasets is one :class:`~vit.data.specs.DatasetSpec` each (``vit.data.specs.DATASETS``), looked
up once here; how a dataset is loaded is one :class:`~vit.data.pipeline.Pipeline` object, chosen once from the spec
and the settings (:func:`choose_pipeline`), to which the loaders and the device-side batch step are delegated. Small
images (CIFAR, digits, class folders of CIFAR-size images, shards of them) are decoded once into a uint8 tensor
(:mod:`vit.data.decoded_pipeline`) and augmented in batches on the training device; ImageNet-size images and
``synthetic`` are decoded and augmented per image with albumentations in worker processes
(:mod:`vit.data.pipeline`), and ImageNet-size shards streamed (:mod:`vit.data.shard_pipeline`).
"""

from __future__ import annotations

from typing import Any, Literal

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from vit.data.datasets import MAX_IMAGE_PIXELS, DataError, FolderLayout, ImageFileDataset
from vit.data.decoded_loader import DecodedLoader
from vit.data.decoded_pipeline import DecodedPipeline
from vit.data.pipeline import PerImagePipeline, Pipeline
from vit.data.shard_format import read_meta
from vit.data.shard_pipeline import GpuDecodePipeline, ShardPipeline
from vit.data.specs import (
    DATASETS,
    SMALL_IMAGE_MAX,
    DatasetName,
    DatasetSpec,
    checked_layout,
    folder_image_size,
    predict_only_spec,
)
from vit.data.streaming import stored_image_size
from vit.data.transforms import Augment, Preset
from vit.data.workers import default_num_workers
from vit.normalize import IMAGENET_MEAN, IMAGENET_STD, Stats, normalize

# the loader settings a checkpoint's own data keeps from the run's data settings (the rest is the checkpoint's)
_LOADER_SETTINGS = (
    "batch_size",
    "num_workers",
    "skip_corrupt",
    "max_image_pixels",
    "pin_memory",
    "normalize_on_device",
    "seed",
)


def choose_pipeline(module: ImageDataModule) -> Pipeline:
    """The way ``module``'s dataset is loaded, from its spec and settings (chosen once, on first need).

    Args:
        module: The data module (its spec, ``decode_once``, ``decode_device`` and, for folders and shards, the size
            of their images).
    """
    if module.decoded:
        return DecodedPipeline(module)
    if module.spec.streaming:
        return GpuDecodePipeline(module) if module.decode_device == "cuda" else ShardPipeline(module)
    return PerImagePipeline(module)


class ImageDataModule(pl.LightningDataModule):
    """Image classification data: loading, augmentation and seeded, resumable loaders.

    ``num_classes`` and ``class_names`` are known right after construction (folder datasets list their class folders
    here), so the CLI can link ``data.num_classes`` into the model. Datasets are built in ``setup`` as
    ``train_dataset`` and ``val_dataset``; validation, test and predict use the val split (CIFAR's test split, ``val/``
    or ``test/`` of a folder tree); ``predict_dir`` predicts any folder of images instead.

    Args:
        dataset: ``cifar10``/``cifar100`` (torchvision, python version), ``imagenet`` (``train/<wnid>/``,
            ``val/<wnid>/``), ``imagefolder`` (``train/<class>/`` + ``val/`` or ``test/``), ``digits``
            (scikit-learn's 8x8 handwritten digits, offline) or ``synthetic`` (seeded random images).
        data_dir: Dataset root. CIFAR: the folder holding ``cifar-10-batches-py/`` or ``cifar-100-python/``
            (default ``data``). Required for ``imagenet`` and ``imagefolder``; unused by ``digits``, ``synthetic``.
        img_size: Height and width of the images fed to the model.
        batch_size: Images per batch, per device.
        num_workers: Loader worker processes for per-image loading; ``None``: the machine's CPUs less one, shared
            between the devices, at most 8. Data decoded once uses none.
        download: Download CIFAR into ``data_dir`` when it is missing.
        augment: Training augmentation: ``none`` (eval pipeline), ``basic`` (crop + flip, or random-resized crop
            + flip + colour jitter for ImageNet-style data) or ``strong`` (adds colour/affine ops and dropout).
        seed: Seed of the train order and of the augmentation draws; the same seed gives the same batches.
        synthetic_num_classes: Number of classes of the ``synthetic`` dataset.
        synthetic_size: Training images of the ``synthetic`` dataset; its val split has a quarter as many.
        skip_corrupt: Skip image files that cannot be read (logging each one and a count) instead of stopping with
            an error naming the file.
        max_image_pixels: Refuse image files whose header claims more pixels (width x height) than this, before
            decoding them (50 megapixels by default: :data:`~vit.data.datasets.MAX_IMAGE_PIXELS` says why);
            ``null``: no limit.
        pin_memory: Pin batches in page-locked memory for faster host-to-GPU copies (ignored without CUDA).
        normalize_on_device: Loaders return uint8 images and ``on_after_batch_transfer`` normalises them once they
            are on the device, as timm's prefetching loader does. A loop of your own calls ``normalize(images)``.
            ``False`` normalises in the workers (per-image path only).
        decode_once: Decode small-image datasets (CIFAR, digits, folders of images up to 64 px, shards of them)
            once into a uint8 tensor, cached on disk (shards: read whole into memory), kept on the training device
            when it fits, augmented in batches there. ``False`` uses the per-image path for them too (shards:
            streamed, decoded and augmented per image in loader workers).
        cache_dir: Folder for the decoded-once cache; default ``<data folder>/.vit-decoded/``.
        mean: Per-channel mean in [0, 1] to normalise with; default the dataset's (a folder of CIFAR-size images:
            computed once from its train split).
        std: Per-channel standard deviation in [0, 1], like ``mean``.
        predict_dir: Predict every image file under this folder (recursively, sorted) instead of the val split.
        holdout: Validate (and test) on this many of the training images instead of ``val/`` or ``test/``, and
            train on the rest: of each class its share, the last of its files by name, the same ones every time
            (folder datasets). For choosing settings (``vit sweep``) without looking at the test images; ``0``:
            none.
        decode_device: Where ``streaming`` data is decoded: ``cpu`` (loader workers, libjpeg-turbo at a reduced DCT
            scale) or ``cuda`` (batches of JPEG bytes decoded, cropped and flipped on the GPU; shards of small
            images then stream too, with that random-resized crop instead of being decoded once with their preset).
    """

    def __init__(
        self,
        dataset: DatasetName = "cifar10",
        data_dir: str | None = None,
        img_size: int = 32,
        batch_size: int = 128,
        num_workers: int | None = None,
        download: bool = False,
        augment: Augment = "basic",
        seed: int = 0,
        synthetic_num_classes: int = 10,
        synthetic_size: int = 1024,
        skip_corrupt: bool = False,
        max_image_pixels: int | None = MAX_IMAGE_PIXELS,
        pin_memory: bool = True,
        normalize_on_device: bool = True,
        decode_once: bool = True,
        cache_dir: str | None = None,
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        predict_dir: str | None = None,
        decode_device: Literal["cpu", "cuda"] = "cpu",
        holdout: int = 0,
        _spec: DatasetSpec | None = None,
    ) -> None:
        super().__init__()
        if dataset not in DATASETS:
            raise ValueError(f"unknown dataset {dataset!r}; choose one of {sorted(DATASETS)}")
        for name, value, low in (
            ("img_size", img_size, 1),
            ("batch_size", batch_size, 1),
            ("num_workers", 0 if num_workers is None else num_workers, 0),
            ("synthetic_num_classes", synthetic_num_classes, 1),
            ("synthetic_size", synthetic_size, 1),
            ("holdout", holdout, 0),
        ):
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        if decode_device not in ("cpu", "cuda"):
            raise ValueError(f"decode_device must be 'cpu' or 'cuda', got {decode_device!r}")
        if decode_device == "cuda" and dataset != "streaming":
            raise DataError("--data.decode_device cuda decodes shards: it needs --data.dataset streaming")
        if decode_device == "cuda" and not torch.cuda.is_available():
            raise DataError(
                "--data.decode_device cuda needs a CUDA GPU and none is visible; use --data.decode_device cpu"
            )
        self.save_hyperparameters(ignore=["_spec"])
        self.spec: DatasetSpec = _spec if _spec is not None else DATASETS[dataset]
        if holdout and self.spec.folder is None:
            raise DataError(
                f"--data.holdout holds images out of a folder's train/: dataset {dataset} is not one; use "
                "--data.dataset imagefolder with a folder of train/<class>/ images, or leave --data.holdout out"
            )
        self.holdout = holdout
        self.dataset = dataset
        self.data_dir = data_dir
        self.img_size = img_size
        self.batch_size = batch_size
        self._num_workers = num_workers
        self.download = download
        self.augment = augment
        self.seed = seed
        self.synthetic_num_classes = synthetic_num_classes
        self.synthetic_size = synthetic_size
        self.skip_corrupt = skip_corrupt
        self.max_image_pixels = max_image_pixels
        self.pin_memory = pin_memory
        self.normalize_on_device = normalize_on_device
        self.decode_once = decode_once
        self.cache_dir = cache_dir
        self.predict_dir = predict_dir
        self.decode_device = decode_device
        self._pipeline: Pipeline | None = None
        self._stats: tuple[Stats, Stats] | None = (tuple(mean), tuple(std)) if mean is not None else None  # type: ignore[assignment]
        self._preset: Preset | None = self.spec.preset
        self._classes: list[str] | None = None
        self.layout: FolderLayout | None = checked_layout(self.spec, data_dir)

    @classmethod
    def from_checkpoint_metadata(cls, meta: dict[str, Any], like: ImageDataModule) -> ImageDataModule:
        """The data a checkpoint describes by itself (image size, class names, statistics, eval transform: the
        metadata of :mod:`vit.checkpoints.metadata`), with no dataset: only ``like.predict_dir``'s images are read.
        The loader settings (batch size, workers, ``skip_corrupt``, ...) are ``like``'s.

        Args:
            meta: The checkpoint's metadata (``img_size``, ``num_classes``, ``class_names``, ``mean``, ``std``,
                ``eval_transform``).
            like: The data module built from the command line.
        """
        names = meta.get("class_names") or [str(i) for i in range(int(meta["num_classes"]))]
        spec = predict_only_spec(names, tuple(meta["mean"]), tuple(meta["std"]), meta["eval_transform"])
        settings = {key: like.hparams[key] for key in _LOADER_SETTINGS if key in like.hparams}
        return cls(
            img_size=int(meta["img_size"][0]),
            mean=tuple(meta["mean"]),
            std=tuple(meta["std"]),
            predict_dir=like.predict_dir,
            _spec=spec,
            **settings,
        )

    # ----------------------------------------------------------------------------------------- what the data is
    @property
    def num_classes(self) -> int:
        """Number of classes, known before ``setup``."""
        return self.spec.num_classes or len(self.class_names)

    @property
    def class_names(self) -> list[str]:
        """Class names indexed by label (CIFAR-100 reads them from its ``meta`` file on first access)."""
        if self._classes is None:
            self._classes = self.spec.classes(self)
        return list(self._classes)

    @property
    def preset(self) -> Preset:
        """The augmentation family: ``cifar``, ``digits`` or ``imagenet`` (folders and synthetic: by image size;
        shards: their source dataset's, or for a prepared folder by the size its images are stored at)."""
        root = (self.data_dir or "").rstrip("/")
        if self._preset is None and self.spec.streaming:
            self._preset = DATASETS[read_meta(root)["dataset"]].preset
        if self._preset is None:
            if self.spec.streaming:  # a prepared folder
                size = stored_image_size(f"{root}/train")
            else:
                size = folder_image_size(self.layout) if self.layout is not None else self.img_size
            self._preset = "cifar" if size <= SMALL_IMAGE_MAX else "imagenet"
        return self._preset

    @property
    def decoded(self) -> bool:
        """Whether the splits are decoded once into tensors and augmented in batches."""
        small = self.preset in ("cifar", "digits")
        return self.decode_once and small and self.spec.decodable and self.decode_device == "cpu"

    @property
    def mean(self) -> Stats:
        """Per-channel mean in [0, 1] the images are normalised with."""
        return self._statistics()[0]

    @property
    def std(self) -> Stats:
        """Per-channel standard deviation in [0, 1] the images are normalised with."""
        return self._statistics()[1]

    def _statistics(self) -> tuple[Stats, Stats]:
        if self._stats is None:
            if self.spec.mean is not None and self.spec.std is not None:
                self._stats = (self.spec.mean, self.spec.std)
            elif self.spec.streaming:  # recorded by vit data prepare
                meta = read_meta(self.data_dir or "")
                self._stats = (tuple(meta["mean"]), tuple(meta["std"]))  # type: ignore[assignment]
            elif self.preset != "imagenet":  # a folder of CIFAR-size images: its own statistics, from its train split
                self._stats = self.pipeline.decoded_train().channel_stats()
            else:
                self._stats = (IMAGENET_MEAN, IMAGENET_STD)
        return self._stats

    @property
    def cifar_root(self) -> str:
        """Where CIFAR is read from and downloaded to."""
        return self.data_dir if self.data_dir is not None else "data"

    @property
    def num_workers(self) -> int:
        """Loader worker processes of the per-image path (see ``num_workers`` in the class docstring)."""
        if self._num_workers is not None:
            return self._num_workers
        devices = self.trainer.num_devices if self.trainer is not None else 1
        return default_num_workers(devices)

    @property
    def predict_paths(self) -> list[str]:
        """The file behind each predict item, in loader order (``predict_dir``), or ``[]`` for the val split."""
        if self.predict_dir is None:
            return []
        if self.predict_dataset is None:
            self.setup("predict")
        assert self.predict_dataset is not None
        return [self.predict_dataset.path(i) for i in range(len(self.predict_dataset))]

    # ------------------------------------------------------------------------------------------- the pipeline
    @property
    def pipeline(self) -> Pipeline:
        """How the data is loaded (:func:`choose_pipeline`), chosen on first use; it holds the splits."""
        if self._pipeline is None:
            self._pipeline = choose_pipeline(self)
        return self._pipeline

    @property
    def train_dataset(self) -> Dataset | None:
        """The train split, once ``setup`` has built it."""
        return self.pipeline.train_dataset

    @property
    def val_dataset(self) -> Dataset | None:
        """The val split (also test and predict without ``predict_dir``), once ``setup`` has built it."""
        return self.pipeline.val_dataset

    @property
    def predict_dataset(self) -> ImageFileDataset | None:
        """``predict_dir``'s images, once ``setup`` has built them."""
        return self.pipeline.predict_dataset

    def prepare_data(self) -> None:
        """Download CIFAR when ``download`` is set, and decode the splits the run needs into the decoded-once cache.

        Lightning runs this on one process per node, then the others wait: under DDP they read the cache in
        :meth:`setup` instead of all decoding the same files at once.
        """
        if self.download and self.spec.download is not None:
            self.spec.download(self.cifar_root)
        self.pipeline.prepare(self.trainer.state.fn if self.trainer is not None else None)

    def setup(self, stage: str | None = None) -> None:
        """Build ``train_dataset`` (for ``fit``), ``val_dataset`` (always) and ``predict_dataset`` (``predict_dir``).

        Args:
            stage: ``fit``, ``validate``, ``test``, ``predict`` or ``None`` (all).
        """
        self.pipeline.setup(stage)

    # ------------------------------------------------------------------------------------------- normalising
    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """Normalise uint8 images from these loaders with the dataset's ``mean`` and ``std``; float passes through.

        Args:
            images: uint8 (C, H, W) or (B, C, H, W) tensor(s), on any device.
        """
        return normalize(images, self.mean, self.std)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Normalise the uint8 images of an ``(images, labels)`` batch once Lightning has moved it to the device
        (JPEG bytes, with ``decode_device="cuda"``, are decoded, cropped and flipped on the GPU first)."""
        training = self.trainer is not None and self.trainer.training
        return self.pipeline.on_device(batch, training)

    # ------------------------------------------------------------------------------------------------ loaders
    def train_dataloader(self) -> DataLoader | DecodedLoader:
        """Shuffled, seeded training batches; the last incomplete batch is dropped."""
        return self.pipeline.train_loader()

    def val_dataloader(self) -> DataLoader | DecodedLoader:
        """Validation batches in a fixed order."""
        return self.pipeline.val_loader()

    def test_dataloader(self) -> DataLoader | DecodedLoader:
        """The val split (CIFAR and digits have no third split)."""
        return self.val_dataloader()

    def predict_dataloader(self) -> DataLoader | DecodedLoader:
        """``predict_dir``'s images (labels -1) through the eval transform, in ``predict_paths`` order; else the
        val split. Batches are ``(images, labels)``."""
        return self.pipeline.predict_loader()
