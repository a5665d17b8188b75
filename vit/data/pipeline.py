"""How a dataset is loaded: one :class:`Pipeline` object per way, chosen once by the data module.

- :class:`PerImagePipeline` (here): images decoded and augmented one by one with albumentations in loader workers
  (ImageNet-size files and arrays, generated ``synthetic`` data, and everything with ``--data.decode_once false``).
- :class:`~vit.data.decoded_pipeline.DecodedPipeline`: small images decoded once into a uint8 tensor and augmented
  in batches on the training device.
- :class:`~vit.data.shard_pipeline.ShardPipeline`: the shards of ``vit data prepare`` streamed with LitData, and
  :class:`~vit.data.shard_pipeline.GpuDecodePipeline`, which decodes their JPEG bytes on the GPU.

A pipeline builds the splits (``train_dataset``, ``val_dataset``, ``predict_dataset``), their loaders and what
happens to a batch once it is on the device. It reads its settings (``--data.*``) and the trainer from its
:class:`Host`, the :class:`~vit.data.ImageDataModule`. ``predict_dir``'s images are always read file by file,
whatever the pipeline of the dataset.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data import DataLoader, Dataset

from vit.data.datasets import ArrayDataset, DataError, ImageFileDataset, collate_skip_none, list_predict_files, load_rgb
from vit.data.decoded import DecodedSplit, DecodeRequest
from vit.data.sampler import ResumableDataLoader, ResumableSampler, SeededItems
from vit.data.specs import DatasetSpec, FolderLayout, folder_image_size
from vit.data.transforms import Augment, Preset, build_transforms, seed_transform
from vit.data.workers import SkipReportingDataLoader, seed_worker, track_workers
from vit.normalize import Stats


class Host(Protocol):
    """What a pipeline reads from its data module: the ``--data.*`` settings, what the data is, and the trainer."""

    spec: DatasetSpec
    img_size: int
    batch_size: int
    augment: Augment
    seed: int
    skip_corrupt: bool
    max_image_pixels: int | None
    pin_memory: bool
    normalize_on_device: bool
    cache_dir: str | None
    predict_dir: str | None
    data_dir: str | None
    layout: FolderLayout | None
    trainer: Any

    @property
    def num_workers(self) -> int: ...

    @property
    def preset(self) -> Preset: ...

    @property
    def mean(self) -> Stats: ...

    @property
    def std(self) -> Stats: ...

    @property
    def class_names(self) -> list[str]: ...

    def normalize(self, images: torch.Tensor) -> torch.Tensor: ...


def _readable(path: str, max_pixels: int | None) -> bool:
    try:
        load_rgb(path, max_pixels)
        return True
    except OSError as err:
        rank_zero_warn(f"skipping unreadable image {path}: {err}")
        return False


class Pipeline:
    """The splits of one dataset and their loaders; subclasses say how the splits are built and loaded.

    Args:
        host: The data module whose settings and trainer the pipeline reads.
    """

    def __init__(self, host: Host) -> None:
        self.host = host
        self.train_dataset: Dataset | None = None
        self.val_dataset: Dataset | None = None
        self.predict_dataset: ImageFileDataset | None = None

    # --------------------------------------------------------------------------------------------- the splits
    def build(self, train: bool) -> Dataset:
        """The train split, or the val split.

        Args:
            train: Which split.
        """
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        """Build ``train_dataset`` (for ``fit``), ``val_dataset`` (always) and ``predict_dataset`` (``predict_dir``).

        A predict-only spec (a checkpoint's description) has no train or val split: only ``predict_dir`` is read.

        Args:
            stage: ``fit``, ``validate``, ``test``, ``predict`` or ``None`` (all).
        """
        host = self.host
        if not host.spec.predict_only:
            if self.train_dataset is None and stage in ("fit", None):
                self.train_dataset = self.build(train=True)
            if self.val_dataset is None:
                self.val_dataset = self.build(train=False)
        elif host.predict_dir is None:  # nothing but predict_dir to read: the spec's source says so
            host.spec.source(host, False)
        if self.predict_dataset is None and host.predict_dir is not None and stage in ("predict", None):
            samples = list_predict_files(host.predict_dir)
            if host.skip_corrupt:  # left out up front, so that predict_paths stays aligned with the predictions
                samples = [sample for sample in samples if _readable(sample[0], host.max_image_pixels)]
            transform = self.transform(train=False)
            self.predict_dataset = ImageFileDataset(samples, host.class_names, transform, False, host.max_image_pixels)

    def prepare(self, stage: str | None) -> None:
        """Work done once per node before ``setup`` on every process (the decoded-once cache); here: none.

        Args:
            stage: The trainer's stage, or ``None``.
        """

    def transform(self, train: bool) -> Any:
        """The per-image albumentations pipeline of a split (uint8 out unless normalising in the workers).

        Args:
            train: The training augmentation, seeded; otherwise the eval transform.
        """
        host = self.host
        return build_transforms(
            host.preset,
            host.img_size,
            train,
            host.mean,
            host.std,
            host.augment,
            seed=host.seed if train else None,
            normalize=not host.normalize_on_device,
        )

    def decoded_train(self) -> DecodedSplit:
        """The train split decoded once (and cached), for a folder's own statistics, whatever trains on it."""
        host = self.host
        source = host.spec.source(host, True)
        assert isinstance(source, DecodeRequest)
        return decode_split(source, host)

    # -------------------------------------------------------------------------------------------- the loaders
    def loader(self, dataset: Dataset, train: bool) -> Any:
        """The loader of a split built by :meth:`build`.

        Args:
            dataset: The split.
            train: Shuffled, augmented, last incomplete batch dropped.
        """
        raise NotImplementedError

    def train_loader(self) -> Any:
        """Shuffled, seeded training batches; the last incomplete batch is dropped."""
        if self.train_dataset is None:
            self.setup("fit")
        dataset = self.train_dataset
        assert dataset is not None
        if len(dataset) < self.host.batch_size:  # type: ignore[arg-type]
            raise DataError(
                f"the training set has {len(dataset)} images, fewer than batch_size={self.host.batch_size}, "  # type: ignore[arg-type]
                "so every batch would be dropped; lower --data.batch_size"
            )
        return self.loader(dataset, train=True)

    def val_loader(self) -> Any:
        """Validation batches in a fixed order."""
        if self.val_dataset is None:
            self.setup("validate")
        assert self.val_dataset is not None
        return self.loader(self.val_dataset, train=False)

    def predict_loader(self) -> Any:
        """``predict_dir``'s images (labels -1) through the eval transform, file by file; else the val split."""
        if self.host.predict_dir is None:
            return self.val_loader()
        if self.predict_dataset is None:
            self.setup("predict")
        return file_loader(self.host, self.predict_dataset, train=False)  # type: ignore[arg-type]

    def on_device(self, batch: Any, training: bool) -> Any:
        """An ``(images, labels)`` batch once Lightning has moved it to the device: uint8 images are normalised
        there (``normalize_on_device``); anything else passes through.

        Args:
            batch: The batch on the device.
            training: Whether the trainer is fitting (augmentation on the device, where a pipeline has one).
        """
        if self.host.normalize_on_device and isinstance(batch, (list, tuple)) and isinstance(batch[0], torch.Tensor):
            return type(batch)([self.host.normalize(batch[0]), *batch[1:]])
        return batch


def global_rank(host: Host) -> int:
    """This process's rank among all devices (0 without a trainer).

    Args:
        host: The data module.
    """
    return host.trainer.global_rank if host.trainer is not None else 0


def rank_sampler(host: Host, dataset: Dataset, train: bool) -> ResumableSampler:
    """Order and augmentations a function of ``(seed, epoch)``, one shard per rank, resumable mid-epoch.

    Args:
        host: The data module.
        dataset: The split.
        train: Shuffled.
    """
    world_size = host.trainer.world_size if host.trainer is not None else 1
    return ResumableSampler(dataset, seed=host.seed, shuffle=train, num_replicas=world_size, rank=global_rank(host))


def decode_split(source: DecodeRequest, host: Host) -> DecodedSplit:
    """A split decoded once at the size :meth:`DecodeRequest.decoded_size` picks (or read from its disk cache).

    Args:
        source: What the spec hands over: pixels in memory, or files.
        host: The data module's settings (image size, cache folder, ``skip_corrupt``; a folder's layout).
    """
    native = source.images.shape[1] if source.images is not None else folder_image_size(host.layout)  # type: ignore[arg-type]
    return source.decode(source.decoded_size(host.img_size, native), host.cache_dir, host.skip_corrupt)


def file_loader(host: Host, dataset: Dataset, train: bool, generator: torch.Generator | None = None) -> DataLoader:
    """A ``DataLoader`` of a per-image split: worker processes, resumable and seeded when training, unreadable files
    skipped and counted with ``skip_corrupt``.

    Args:
        host: The data module's settings.
        dataset: A per-image split.
        train: Shuffled with a resumable sampler, last incomplete batch dropped.
        generator: Seeds the workers' augmentation streams.
    """
    skipping = host.skip_corrupt and isinstance(dataset, ImageFileDataset)
    loader_cls = SkipReportingDataLoader if skipping else ResumableDataLoader if train else DataLoader
    sampler = None
    if train:
        sampler = rank_sampler(host, dataset, train=True)
        dataset = SeededItems(dataset)
    num_workers = host.num_workers
    loader = loader_cls(
        dataset,
        batch_size=host.batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_skip_none if skipping else None,
        pin_memory=host.pin_memory and torch.cuda.is_available(),
        drop_last=train,
        generator=generator,
        worker_init_fn=seed_worker,
        persistent_workers=num_workers > 0,
    )
    return track_workers(loader)


class PerImagePipeline(Pipeline):
    """Images decoded and augmented one by one with albumentations in loader worker processes: ImageNet-size files,
    in-memory arrays and generated ``synthetic`` images (and every dataset with ``--data.decode_once false``)."""

    def build(self, train: bool) -> Dataset:
        host = self.host
        source = host.spec.source(host, train)
        if not isinstance(source, DecodeRequest):  # generated per item (synthetic): a ready dataset
            source.transform = self.transform(train)  # type: ignore[attr-defined]
            return source
        if source.images is not None:
            return ArrayDataset(source.images, source.labels, source.classes, self.transform(train))  # type: ignore[arg-type]
        samples: Any = source.samples
        return ImageFileDataset(
            samples, source.classes, self.transform(train), host.skip_corrupt, host.max_image_pixels
        )

    def loader(self, dataset: Dataset, train: bool) -> DataLoader:
        if not train:
            return file_loader(self.host, dataset, train=False)
        seed = self.host.seed + global_rank(self.host)  # distinct augmentation streams per rank, repeatable per run
        if self.host.num_workers == 0:  # workers reseed their own copy in seed_worker; here the main process draws
            seed_transform(dataset.transform, seed)  # type: ignore[attr-defined]
        return file_loader(self.host, dataset, train=True, generator=torch.Generator().manual_seed(seed))
