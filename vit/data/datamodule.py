"""``ImageDataModule``: one LightningDataModule for CIFAR-10/100, ImageNet, any class-folder tree, digits and
synthetic data, with albumentations augmentation and seeded, repeatable loading."""

from __future__ import annotations

import atexit
import random
import signal
import weakref
from collections.abc import Iterator
from typing import Any, Literal

import albumentations as A
import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data import DataLoader, Dataset, get_worker_info

from vit.data.datasets import (
    CIFAR10_CLASSES,
    IMG_EXTENSIONS,
    DataError,
    FolderLayout,
    ImageFileDataset,
    SyntheticDataset,
    check_image_folder,
    collate_skip_none,
    list_image_files,
    load_cifar,
    load_digits_split,
)
from vit.data.sampler import ResumableDataLoader, ResumableSampler, SeededItems
from vit.data.transforms import Augment, Preset, build_transforms, seed_transform
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
    normalize,
)

DatasetName = Literal["cifar10", "cifar100", "imagenet", "imagefolder", "digits", "synthetic"]

_STATS: dict[str, tuple[Stats, Stats]] = {
    "cifar10": (CIFAR10_MEAN, CIFAR10_STD),
    "cifar100": (CIFAR100_MEAN, CIFAR100_STD),
    "imagenet": (IMAGENET_MEAN, IMAGENET_STD),
    "imagefolder": (IMAGENET_MEAN, IMAGENET_STD),
    "digits": (DIGITS_MEAN, DIGITS_STD),
    "synthetic": (UNIFORM_MEAN, UNIFORM_STD),
}
_PRESETS: dict[str, Preset] = {
    "cifar10": "cifar",
    "cifar100": "cifar",
    "imagenet": "imagenet",
    "imagefolder": "imagenet",
    "digits": "digits",
}
_NUM_CLASSES = {"cifar10": 10, "cifar100": 100, "digits": 10}
SYNTHETIC_CIFAR_MAX_SIZE = 64  # synthetic images up to this size use the CIFAR-style preset, larger the ImageNet one


def seed_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: seed ``random``, numpy and the dataset's albumentations pipeline per worker.

    PyTorch gives worker ``i`` the seed ``base_seed + i``, where ``base_seed`` is drawn from the loader's
    generator, so the seeds differ between workers and epochs yet repeat for a seeded generator. albumentations
    keeps its own random state, copied into every worker, so without this each worker would draw the same
    augmentations.

    Workers also ignore SIGINT and SIGTERM: Ctrl-C and a scheduler's SIGTERM reach the whole process group, and
    the main process must keep its workers while it finishes the step and writes a checkpoint (they exit with it).

    Args:
        worker_id: Index of the worker process (unused: ``torch.initial_seed()`` already includes it).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
    info = get_worker_info()
    transform = getattr(info.dataset, "transform", None) if info is not None else None
    if isinstance(transform, A.BaseCompose):
        seed_transform(transform, seed)


_LOADERS_WITH_WORKERS: weakref.WeakSet[DataLoader] = weakref.WeakSet()


def _stop_persistent_workers() -> None:
    """At exit, stop the workers of the loaders still alive, as Lightning does when its loops end.

    The workers ignore SIGTERM (``seed_worker``), and multiprocessing's exit handler, which runs after this one,
    terminates daemonic children and then joins them: without this, a script that still holds a loader with
    persistent workers would wait for them forever. ``_shutdown_workers`` sends each worker its stop sentinel.
    """
    for loader in list(_LOADERS_WITH_WORKERS):
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()


class SkipReportingDataLoader(ResumableDataLoader):
    """A DataLoader over an ``ImageFileDataset`` that warns, once each full pass is loaded, how many files it skipped.

    The report is made when the last batch arrives (batches arrive in order, so every item has been read by then)
    rather than when the iterator is exhausted: Lightning stops at ``len(loader)`` without asking for more.
    """

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        before = self.dataset.num_skipped
        last = len(self) - 1
        for index, batch in enumerate(super().__iter__()):
            if index == last:
                skipped = self.dataset.num_skipped - before
                if skipped:
                    rank_zero_warn(
                        f"skipped {skipped} unreadable image file(s) out of {len(self.dataset)} in this pass "
                        f"({self.dataset.num_skipped} in total); the log above names each file"
                    )
            yield batch


class ImageDataModule(pl.LightningDataModule):
    """Image classification data: loading, albumentations augmentation and seeded DataLoaders.

    ``num_classes``, ``class_names``, ``mean`` and ``std`` are known right after construction (folder datasets
    list their class folders here), so the CLI can link ``data.num_classes`` into the model. Datasets are built
    in ``setup`` as ``train_dataset`` and ``val_dataset``; validation, test and predict all use the val split
    (CIFAR's test split, ``val/`` or ``test/`` of a folder tree).

    Args:
        dataset: ``cifar10``/``cifar100`` (torchvision, python version), ``imagenet`` (``train/<wnid>/``,
            ``val/<wnid>/``), ``imagefolder`` (``train/<class>/`` + ``val/`` or ``test/``), ``digits``
            (scikit-learn's 8x8 handwritten digits, offline) or ``synthetic`` (seeded random images).
        data_dir: Dataset root. CIFAR: the folder holding ``cifar-10-batches-py/`` or ``cifar-100-python/``
            (default ``data``). Required for ``imagenet`` and ``imagefolder``; unused by ``digits``, ``synthetic``.
        img_size: Height and width of the images fed to the model.
        batch_size: Images per batch, per device.
        num_workers: DataLoader worker processes; 0 loads in the main process.
        download: Download CIFAR into ``data_dir`` when it is missing.
        augment: Training augmentation: ``none`` (eval pipeline), ``basic`` (crop + flip, or random-resized crop
            + flip + colour jitter for ImageNet-style data) or ``strong`` (adds colour/affine ops and dropout).
        seed: Seed of the train shuffle, the albumentations pipelines and the worker seeds; the same seed gives
            the same batches.
        synthetic_num_classes: Number of classes of the ``synthetic`` dataset.
        synthetic_size: Training images of the ``synthetic`` dataset; its val split has a quarter as many.
        skip_corrupt: Skip image files that cannot be read (logging each one and a count after every pass) instead
            of stopping with an error naming the file.
        pin_memory: Pin batches in page-locked memory for faster host-to-GPU copies (ignored without CUDA).
        normalize_on_device: Workers return uint8 images and ``on_after_batch_transfer`` normalises them once they
            are on the device, as timm's prefetching loader does: no float work in the workers and a quarter of the
            bytes to copy. Batches from these loaders reach the model normalised when this data module is given
            to the Trainer; a loop of your own calls ``normalize(images)``. ``False`` normalises in the workers.
    """

    def __init__(
        self,
        dataset: DatasetName = "cifar10",
        data_dir: str | None = None,
        img_size: int = 32,
        batch_size: int = 128,
        num_workers: int = 4,
        download: bool = False,
        augment: Augment = "basic",
        seed: int = 0,
        synthetic_num_classes: int = 10,
        synthetic_size: int = 1024,
        skip_corrupt: bool = False,
        pin_memory: bool = True,
        normalize_on_device: bool = True,
    ) -> None:
        super().__init__()
        if dataset not in _STATS:
            raise ValueError(f"unknown dataset {dataset!r}; choose one of {sorted(_STATS)}")
        for name, value, low in (
            ("img_size", img_size, 1),
            ("batch_size", batch_size, 1),
            ("num_workers", num_workers, 0),
            ("synthetic_num_classes", synthetic_num_classes, 1),
            ("synthetic_size", synthetic_size, 1),
        ):
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        self.save_hyperparameters()
        self.dataset = dataset
        self.data_dir = data_dir
        self.img_size = img_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.download = download
        self.augment = augment
        self.seed = seed
        self.synthetic_num_classes = synthetic_num_classes
        self.synthetic_size = synthetic_size
        self.skip_corrupt = skip_corrupt
        self.pin_memory = pin_memory
        self.normalize_on_device = normalize_on_device
        self.train_dataset: Dataset | None = None
        self.val_dataset: Dataset | None = None
        self._layout: FolderLayout | None = None
        if dataset in ("imagenet", "imagefolder"):
            self._layout = check_image_folder(data_dir, dataset)
            if self._layout.missing_in_val:
                rank_zero_warn(
                    f"class folders in {self._layout.train_dir} but not in {self._layout.val_dir}: "
                    f"{self._layout.missing_in_val}; they will never be validated"
                )

    # ----------------------------------------------------------------------------------------- what the data is
    @property
    def num_classes(self) -> int:
        """Number of classes, known before ``setup``."""
        if self._layout is not None:
            return len(self._layout.classes)
        if self.dataset == "synthetic":
            return self.synthetic_num_classes
        return _NUM_CLASSES[self.dataset]

    @property
    def class_names(self) -> list[str]:
        """Class names indexed by label (CIFAR-100 reads them from its ``meta`` file on first access)."""
        if self._layout is not None:
            return list(self._layout.classes)
        if self.dataset == "cifar10":
            return list(CIFAR10_CLASSES)
        if self.dataset == "cifar100":
            if self.val_dataset is None:
                self.setup("validate")
            return list(self.val_dataset.classes)
        if self.dataset == "digits":
            return [str(d) for d in range(10)]
        return [f"class_{i}" for i in range(self.synthetic_num_classes)]

    @property
    def mean(self) -> Stats:
        """Per-channel mean in [0, 1] the images are normalised with."""
        return _STATS[self.dataset][0]

    @property
    def std(self) -> Stats:
        """Per-channel standard deviation in [0, 1] the images are normalised with."""
        return _STATS[self.dataset][1]

    @property
    def preset(self) -> Preset:
        """The augmentation family: ``cifar``, ``digits`` or ``imagenet``."""
        if self.dataset == "synthetic":
            return "cifar" if self.img_size <= SYNTHETIC_CIFAR_MAX_SIZE else "imagenet"
        return _PRESETS[self.dataset]

    @property
    def cifar_root(self) -> str:
        """Where CIFAR is read from and downloaded to."""
        return self.data_dir if self.data_dir is not None else "data"

    # ------------------------------------------------------------------------------------------- building data
    def prepare_data(self) -> None:
        """Download CIFAR when ``download`` is set (Lightning runs this on one process per node)."""
        if self.download and self.dataset in ("cifar10", "cifar100"):
            for train in (True, False):
                load_cifar(self.dataset, self.cifar_root, train=train, download=True)

    def setup(self, stage: str | None = None) -> None:
        """Build ``train_dataset`` (for ``fit``) and ``val_dataset`` (always); already built ones are kept.

        Args:
            stage: ``fit``, ``validate``, ``test``, ``predict`` or ``None`` (all).
        """
        if self.train_dataset is None and stage in ("fit", None):
            self.train_dataset = self._build(train=True)
        if self.val_dataset is None:
            self.val_dataset = self._build(train=False)

    def _build(self, train: bool) -> Dataset:
        transform = build_transforms(
            self.preset,
            self.img_size,
            train,
            self.mean,
            self.std,
            self.augment,
            seed=self.seed if train else None,
            normalize=not self.normalize_on_device,
        )
        if self.dataset in ("cifar10", "cifar100"):
            return load_cifar(self.dataset, self.cifar_root, train, download=False, transform=transform)
        if self.dataset == "digits":
            return load_digits_split(train, transform)
        if self.dataset == "synthetic":
            num_val = max(1, self.synthetic_size // 4)
            return SyntheticDataset(
                self.synthetic_size if train else num_val,
                self.synthetic_num_classes,
                self.img_size,
                seed=self.seed,
                offset=0 if train else self.synthetic_size,
                transform=transform,
            )
        assert self._layout is not None
        split_dir = self._layout.train_dir if train else self._layout.val_dir
        samples, ignored = list_image_files(split_dir, self._layout.classes)
        if ignored:
            rank_zero_warn(
                f"ignored {len(ignored)} file(s) without an image extension under {split_dir}: {ignored[:5]}"
            )
        if not samples:
            raise DataError(f"no image files ({', '.join(IMG_EXTENSIONS)}) under {split_dir}/<class>/")
        if train:
            empty = sorted(set(self._layout.classes) - {self._layout.classes[label] for _, label in samples})
            if empty:
                rank_zero_warn(f"class folders without images in {split_dir}: {empty}")
        return ImageFileDataset(samples, self._layout.classes, transform, skip_corrupt=self.skip_corrupt)

    # ------------------------------------------------------------------------------------------- normalising
    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """Normalise uint8 images from these loaders with the dataset's ``mean`` and ``std``; float passes through.

        Args:
            images: uint8 (C, H, W) or (B, C, H, W) tensor(s), on any device.
        """
        return normalize(images, self.mean, self.std)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Normalise the uint8 images of an ``(images, labels)`` batch once Lightning has moved it to the device."""
        if self.normalize_on_device and isinstance(batch, (list, tuple)) and isinstance(batch[0], torch.Tensor):
            return type(batch)([self.normalize(batch[0]), *batch[1:]])
        return batch

    # ------------------------------------------------------------------------------------------------ loaders
    def _global_rank(self) -> int:
        return self.trainer.global_rank if self.trainer is not None else 0

    def _loader(self, dataset: Dataset, train: bool, generator: torch.Generator | None = None) -> DataLoader:
        skipping = self.skip_corrupt and isinstance(dataset, ImageFileDataset)
        loader_cls = SkipReportingDataLoader if skipping else ResumableDataLoader if train else DataLoader
        sampler = None
        if train:  # order and augmentations a function of (seed, epoch), resumable mid-epoch (vit.data.sampler)
            world_size = self.trainer.world_size if self.trainer is not None else 1
            sampler = ResumableSampler(dataset, seed=self.seed, num_replicas=world_size, rank=self._global_rank())
            dataset = SeededItems(dataset)
        loader = loader_cls(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            collate_fn=collate_skip_none if skipping else None,
            pin_memory=self.pin_memory and torch.cuda.is_available(),
            drop_last=train,
            generator=generator,
            worker_init_fn=seed_worker,
            persistent_workers=self.num_workers > 0,
        )
        if self.num_workers > 0:
            if not _LOADERS_WITH_WORKERS:  # registered after multiprocessing's handler, so it runs before it
                atexit.unregister(_stop_persistent_workers)
                atexit.register(_stop_persistent_workers)
            _LOADERS_WITH_WORKERS.add(loader)
        return loader

    def train_dataloader(self) -> DataLoader:
        """Shuffled, seeded training batches; the last incomplete batch is dropped."""
        if self.train_dataset is None:
            self.setup("fit")
        dataset = self.train_dataset
        if len(dataset) < self.batch_size:
            raise DataError(
                f"the training set has {len(dataset)} images, fewer than batch_size={self.batch_size}, "
                "so every batch would be dropped; lower --data.batch_size"
            )
        seed = self.seed + self._global_rank()  # distinct augmentation streams per rank, repeatable per run
        if self.num_workers == 0:  # workers reseed their own copy in seed_worker; here the main process draws
            seed_transform(dataset.transform, seed)
        return self._loader(dataset, train=True, generator=torch.Generator().manual_seed(seed))

    def val_dataloader(self) -> DataLoader:
        """Validation batches in a fixed order."""
        if self.val_dataset is None:
            self.setup("validate")
        return self._loader(self.val_dataset, train=False)

    def test_dataloader(self) -> DataLoader:
        """The val split (CIFAR and digits have no third split)."""
        return self.val_dataloader()

    def predict_dataloader(self) -> DataLoader:
        """The val split, in order; batches are ``(images, labels)``."""
        return self.val_dataloader()
