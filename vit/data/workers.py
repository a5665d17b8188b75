"""Per-image loading in worker processes: seeding each worker's augmentation stream, stopping persistent workers at
exit, and reporting skipped files. Used for ImageNet-size data and ``synthetic``; data decoded once needs no workers."""

from __future__ import annotations

import atexit
import random
import signal
import weakref
from collections.abc import Iterator
from typing import Any

import albumentations as A
import numpy as np
import torch
from lightning.fabric.utilities.data import suggested_max_num_workers
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data import DataLoader, get_worker_info

from vit.data.sampler import ResumableDataLoader
from vit.data.transforms import seed_transform

MAX_DEFAULT_WORKERS = 8


def default_num_workers(devices: int = 1) -> int:
    """Loader workers per device when none are asked for: the CPUs this process may use, less one for the main
    process, shared between ``devices`` processes, at most 8 (Lightning's own suggestion, so it never warns).

    Args:
        devices: Training processes on this machine.
    """
    return min(MAX_DEFAULT_WORKERS, suggested_max_num_workers(max(1, devices)))


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


def track_workers(loader: DataLoader) -> DataLoader:
    """Register a loader with worker processes so that its persistent workers are stopped at exit.

    Args:
        loader: The loader; returned as is.
    """
    if loader.num_workers > 0:
        if not _LOADERS_WITH_WORKERS:  # registered after multiprocessing's handler, so it runs before it
            atexit.unregister(_stop_persistent_workers)
            atexit.register(_stop_persistent_workers)
        _LOADERS_WITH_WORKERS.add(loader)
    return loader
