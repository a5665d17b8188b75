"""``ImageDataModule``: one LightningDataModule for CIFAR-10/100, ImageNet, any class-folder tree, digits and
synthetic data, with seeded, resumable loading.

What differs between datasets is one :class:`~vit.data.specs.DatasetSpec` each (``vit.data.specs.DATASETS``), looked
up once here. Small images (CIFAR, digits, class folders of CIFAR-size images, shards of them) are decoded once
into a uint8 tensor (:mod:`vit.data.decoded`) and augmented in batches (:mod:`vit.data.batch_augment`) on the
training device; ImageNet-size images and ``synthetic`` are decoded and augmented per image with albumentations in
worker processes, and ImageNet-size shards streamed (:mod:`vit.data.streaming`).
"""

from __future__ import annotations

from typing import Any, Literal

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data import DataLoader, Dataset

from vit.data.batch_augment import BatchAugment
from vit.data.datasets import (
    ArrayDataset,
    DataError,
    FolderLayout,
    ImageFileDataset,
    check_image_folder,
    collate_skip_none,
    list_predict_files,
    load_rgb,
)
from vit.data.decoded import DecodedSplit, DecodeRequest
from vit.data.decoded_loader import DecodedLoader
from vit.data.sampler import ResumableDataLoader, ResumableSampler, SeededItems
from vit.data.specs import DATASETS, SMALL_IMAGE_MAX, DatasetName, DatasetSpec, folder_image_size
from vit.data.streaming import ShardImages, ShardLoader, collate_raw
from vit.data.transforms import Augment, Preset, build_transforms, seed_transform
from vit.data.workers import SkipReportingDataLoader, default_num_workers, seed_worker, track_workers
from vit.normalize import IMAGENET_MEAN, IMAGENET_STD, Stats, normalize


def _readable(path: str) -> bool:
    try:
        load_rgb(path)
        return True
    except OSError as err:
        rank_zero_warn(f"skipping unreadable image {path}: {err}")
        return False


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
        pin_memory: bool = True,
        normalize_on_device: bool = True,
        decode_once: bool = True,
        cache_dir: str | None = None,
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        predict_dir: str | None = None,
        decode_device: Literal["cpu", "cuda"] = "cpu",
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
        self.save_hyperparameters()
        self.spec: DatasetSpec = DATASETS[dataset]
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
        self.pin_memory = pin_memory
        self.normalize_on_device = normalize_on_device
        self.decode_once = decode_once
        self.cache_dir = cache_dir
        self.predict_dir = predict_dir
        self.decode_device = decode_device
        self._gpu_rng: Any = None
        self.train_dataset: Dataset | None = None
        self.val_dataset: Dataset | None = None
        self.predict_dataset: ImageFileDataset | None = None
        self._stats: tuple[Stats, Stats] | None = (tuple(mean), tuple(std)) if mean is not None else None  # type: ignore[assignment]
        self._preset: Preset | None = self.spec.preset
        self.layout: FolderLayout | None = None
        self._classes: list[str] | None = None
        if self.spec.folder is not None:
            self.layout = check_image_folder(data_dir, self.spec.folder)
            if self.layout.missing_in_val:
                rank_zero_warn(
                    f"class folders in {self.layout.train_dir} but not in {self.layout.val_dir}: "
                    f"{self.layout.missing_in_val}; they will never be validated"
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
            from vit.data.prepare import read_meta

            self._preset = DATASETS[read_meta(root)["dataset"]].preset
        if self._preset is None:
            if self.spec.streaming:  # a prepared folder
                from vit.data.streaming import stored_image_size

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
                from vit.data.prepare import read_meta

                meta = read_meta(self.data_dir or "")
                self._stats = (tuple(meta["mean"]), tuple(meta["std"]))  # type: ignore[assignment]
            elif self.preset != "imagenet":  # a folder of CIFAR-size images: its own statistics, from its train split
                self._stats = self._decoded_train().channel_stats()
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

    # ------------------------------------------------------------------------------------------- building data
    def prepare_data(self) -> None:
        """Download CIFAR when ``download`` is set, and decode the splits the run needs into the decoded-once cache.

        Lightning runs this on one process per node, then the others wait: under DDP they read the cache in
        :meth:`setup` instead of all decoding the same files at once.
        """
        if self.download and self.spec.download is not None:
            self.spec.download(self.cifar_root)
        if self.decoded:
            stage = self.trainer.state.fn if self.trainer is not None else None
            self.setup(stage if stage is not None else "fit")
            self._statistics()  # a folder's own statistics come from its train split (decoded and cached here)

    def setup(self, stage: str | None = None) -> None:
        """Build ``train_dataset`` (for ``fit``), ``val_dataset`` (always) and ``predict_dataset`` (``predict_dir``).

        Args:
            stage: ``fit``, ``validate``, ``test``, ``predict`` or ``None`` (all).
        """
        if self.train_dataset is None and stage in ("fit", None):
            self.train_dataset = self._build(train=True)
        if self.val_dataset is None:
            self.val_dataset = self._build(train=False)
        if self.predict_dataset is None and self.predict_dir is not None and stage in ("predict", None):
            samples = list_predict_files(self.predict_dir)
            if self.skip_corrupt:  # left out up front, so that predict_paths stays aligned with the predictions
                samples = [sample for sample in samples if _readable(sample[0])]
            self.predict_dataset = ImageFileDataset(samples, self.class_names, self._transform(train=False))

    def _transform(self, train: bool) -> Any:
        return build_transforms(
            self.preset,
            self.img_size,
            train,
            self.mean,
            self.std,
            self.augment,
            seed=self.seed if train else None,
            normalize=not self.normalize_on_device,
        )

    def _build(self, train: bool) -> Dataset:
        if self.spec.streaming and not self.decoded:
            root = (self.data_dir or "").rstrip("/")
            jitter = train and self.augment != "none"
            transform = None
            if self.preset != "imagenet" and self.decode_device != "cuda":  # small images: as from a folder
                transform = build_transforms(
                    self.preset, self.img_size, train, self.mean, self.std, self.augment, normalize=False
                )
            return ShardImages(
                f"{root}/{'train' if train else 'val'}",
                self.img_size,
                train=train,
                seed=self.seed,
                augment=self.augment != "none",
                jitter=jitter,
                raw=self.decode_device == "cuda",
                image_transform=transform,
            )
        source = self.spec.source(self, train)
        if not isinstance(source, DecodeRequest):  # synthetic: generated per item
            source.transform = self._transform(train)
            return source
        if self.decoded:
            native = source.images.shape[1] if source.images is not None else folder_image_size(self.layout)
            return source.decode(source.decoded_size(self.img_size, native), self.cache_dir, self.skip_corrupt)
        if source.images is not None:
            return ArrayDataset(source.images, source.labels, source.classes, self._transform(train))
        return ImageFileDataset(source.samples, source.classes, self._transform(train), self.skip_corrupt)

    def _decoded_train(self) -> DecodedSplit:
        # the train split decoded once (and cached), also when the per-image path trains on it
        if isinstance(self.train_dataset, DecodedSplit):
            return self.train_dataset
        if self.decoded:
            self.setup("fit")
            assert isinstance(self.train_dataset, DecodedSplit)
            return self.train_dataset
        source = self.spec.source(self, True)
        assert isinstance(source, DecodeRequest)
        native = source.images.shape[1] if source.images is not None else folder_image_size(self.layout)
        return source.decode(source.decoded_size(self.img_size, native), self.cache_dir, self.skip_corrupt)

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
        if isinstance(batch, (list, tuple)) and isinstance(batch[0], list):
            from vit.data.jpeg import decode_batch_cuda

            if self._gpu_rng is None:
                self._gpu_rng = np.random.default_rng([self.seed, self._global_rank()])
            train = self.trainer is not None and self.trainer.training and self.augment != "none"
            batch = [decode_batch_cuda(batch[0], self.img_size, train, self._gpu_rng), *batch[1:]]
        if self.normalize_on_device and isinstance(batch, (list, tuple)) and isinstance(batch[0], torch.Tensor):
            return type(batch)([self.normalize(batch[0]), *batch[1:]])
        return batch

    # ------------------------------------------------------------------------------------------------ loaders
    def _global_rank(self) -> int:
        return self.trainer.global_rank if self.trainer is not None else 0

    def _sampler(self, dataset: Dataset, train: bool) -> ResumableSampler:
        # order and augmentations a function of (seed, epoch), one shard per rank, resumable mid-epoch
        world_size = self.trainer.world_size if self.trainer is not None else 1
        return ResumableSampler(
            dataset, seed=self.seed, shuffle=train, num_replicas=world_size, rank=self._global_rank()
        )

    def _decoded_loader(self, split: DecodedSplit, train: bool) -> DecodedLoader:
        device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        augment = None
        if train and self.augment != "none":
            fill = tuple(255.0 * m for m in self.mean)
            augment = BatchAugment(self.preset, self.img_size, self.augment, fill)
        finish = None if self.normalize_on_device else self.normalize
        sampler = self._sampler(split, train)
        return DecodedLoader(
            split, self.batch_size, sampler, augment, drop_last=train, device=device, finish=finish, size=self.img_size
        )

    def _loader(self, dataset: Dataset, train: bool, generator: torch.Generator | None = None) -> DataLoader:
        skipping = self.skip_corrupt and isinstance(dataset, ImageFileDataset)
        loader_cls = SkipReportingDataLoader if skipping else ResumableDataLoader if train else DataLoader
        sampler = None
        if train:
            sampler = self._sampler(dataset, train=True)
            dataset = SeededItems(dataset)
        num_workers = self.num_workers
        loader = loader_cls(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=num_workers,
            collate_fn=collate_skip_none if skipping else None,
            pin_memory=self.pin_memory and torch.cuda.is_available(),
            drop_last=train,
            generator=generator,
            worker_init_fn=seed_worker,
            persistent_workers=num_workers > 0,
        )
        return track_workers(loader)

    def _shard_loader(self, dataset: ShardImages, train: bool) -> ShardLoader:
        # LitData gives each rank its part and shuffles per epoch; the epoch is the trainer's, so a resumed run
        # replays the same order
        trainer = self.trainer
        return ShardLoader(
            dataset,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            epoch_fn=(lambda: trainer.current_epoch) if train and trainer is not None else None,
            collate_fn=collate_raw if dataset.raw else None,
            pin_memory=self.pin_memory and torch.cuda.is_available() and not dataset.raw,
            drop_last=train,
        )

    def train_dataloader(self) -> DataLoader | DecodedLoader:
        """Shuffled, seeded training batches; the last incomplete batch is dropped."""
        if self.train_dataset is None:
            self.setup("fit")
        dataset = self.train_dataset
        if len(dataset) < self.batch_size:
            raise DataError(
                f"the training set has {len(dataset)} images, fewer than batch_size={self.batch_size}, "
                "so every batch would be dropped; lower --data.batch_size"
            )
        if isinstance(dataset, DecodedSplit):
            return self._decoded_loader(dataset, train=True)
        if isinstance(dataset, ShardImages):
            return self._shard_loader(dataset, train=True)
        seed = self.seed + self._global_rank()  # distinct augmentation streams per rank, repeatable per run
        if self.num_workers == 0:  # workers reseed their own copy in seed_worker; here the main process draws
            seed_transform(dataset.transform, seed)
        return self._loader(dataset, train=True, generator=torch.Generator().manual_seed(seed))

    def val_dataloader(self) -> DataLoader | DecodedLoader:
        """Validation batches in a fixed order."""
        if self.val_dataset is None:
            self.setup("validate")
        if isinstance(self.val_dataset, DecodedSplit):
            return self._decoded_loader(self.val_dataset, train=False)
        if isinstance(self.val_dataset, ShardImages):
            return self._shard_loader(self.val_dataset, train=False)
        return self._loader(self.val_dataset, train=False)

    def test_dataloader(self) -> DataLoader | DecodedLoader:
        """The val split (CIFAR and digits have no third split)."""
        return self.val_dataloader()

    def predict_dataloader(self) -> DataLoader | DecodedLoader:
        """``predict_dir``'s images (labels -1) through the eval transform, in ``predict_paths`` order; else the
        val split. Batches are ``(images, labels)``."""
        if self.predict_dir is None:
            return self.val_dataloader()
        if self.predict_dataset is None:
            self.setup("predict")
        return self._loader(self.predict_dataset, train=False)
