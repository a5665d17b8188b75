"""Resumable, repeatable training order: every epoch's shuffle and every image's augmentation seed are a pure
function of ``(seed, epoch)``, and Lightning checkpoints how far into the epoch the loader got.

A run stopped anywhere (end of an epoch, or mid-epoch at a step checkpoint) and resumed therefore sees exactly the
batches, and exactly the augmentations, of a run that was never stopped, whatever the number of workers:

- :class:`ResumableSampler` draws the epoch's permutation and one augmentation seed per position from a generator
  seeded with ``(seed, epoch)`` (Lightning calls ``set_epoch`` every epoch), and yields ``(index, seed)`` pairs.
- :class:`SeededItems` wraps a dataset: it reseeds the albumentations pipeline with the pair's seed before reading
  the item, so an image's augmentation depends neither on the worker that loads it nor on what that worker loaded
  before.
- :class:`ResumableDataLoader` counts the batches it handed out this epoch; Lightning stores that count in the
  checkpoint (``state_dict``) and gives it back on resume (``load_state_dict``), and the sampler skips them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import albumentations as A
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from vit.data.transforms import seed_transform


def epoch_seed(seed: int, epoch: int) -> int:
    """A 64-bit seed mixing ``seed`` and ``epoch`` (NumPy's ``SeedSequence``: nearby inputs give unrelated seeds).

    Args:
        seed: The run's data seed.
        epoch: The epoch number.
    """
    return int(np.random.SeedSequence([seed % 2**64, epoch]).generate_state(1, dtype=np.uint64)[0])


class ResumableSampler(DistributedSampler):
    """Yields ``(index, augmentation_seed)`` pairs in an order that is a function of ``(seed, epoch)`` only.

    A :class:`~torch.utils.data.DistributedSampler` (one shard per rank, so Lightning does not wrap it under DDP)
    whose order does not depend on any generator state carried over from earlier epochs, and which can skip the
    items of an epoch that were already consumed before a checkpoint.

    Args:
        dataset: The dataset to sample (only its length is used).
        seed: Seed of the shuffle and of the augmentation seeds.
        shuffle: Shuffle each epoch; ``False`` keeps the dataset order (the seeds still change every epoch).
        num_replicas: Number of ranks sharing the data.
        rank: This rank.
        drop_last: Drop the tail that does not divide evenly among ranks instead of padding with repeats.
    """

    def __init__(
        self,
        dataset: Dataset,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        self._resume: tuple[int, int] | None = None

    def resume(self, epoch: int, consumed: int) -> None:
        """Skip the first ``consumed`` items of epoch ``epoch`` when that epoch is iterated next.

        Args:
            epoch: The epoch the skip applies to; iterating any other epoch cancels it.
            consumed: Items of that epoch (on this rank) already used.
        """
        self._resume = (epoch, consumed)

    def __iter__(self) -> Iterator[tuple[int, int]]:  # type: ignore[override]
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
        n = len(self.dataset)  # type: ignore[arg-type]
        order = torch.randperm(n, generator=generator) if self.shuffle else torch.arange(n)
        if self.drop_last:
            order = order[: self.total_size]
        elif self.total_size > n:  # pad with repeats so every rank gets num_samples items (DistributedSampler)
            order = order.repeat(-(-self.total_size // n))[: self.total_size]
        seeds = torch.randint(0, 2**62, (self.total_size,), generator=generator)
        order = order[self.rank : self.total_size : self.num_replicas]
        seeds = seeds[self.rank : self.total_size : self.num_replicas]
        skip = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            skip = self._resume[1]
        self._resume = None
        return iter(list(zip(order[skip:].tolist(), seeds[skip:].tolist(), strict=True)))


class SeededItems(Dataset):
    """A dataset read with ``(index, seed)`` keys: the albumentations pipeline is reseeded with ``seed``, then
    ``dataset[index]`` is returned. Other attributes (``transform``, ``num_skipped``, ...) are the dataset's.

    Args:
        dataset: A dataset whose ``transform`` attribute, if any, is an albumentations pipeline.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        index, seed = key
        transform = getattr(self.dataset, "transform", None)
        if isinstance(transform, A.BaseCompose):
            seed_transform(transform, seed)
        return self.dataset[index]

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not yet set (unpickling in a worker): avoid recursing
            raise AttributeError(name)
        return getattr(self.dataset, name)


class ResumableDataLoader(DataLoader):
    """A DataLoader that Lightning can checkpoint mid-epoch (it has ``state_dict``/``load_state_dict``).

    The state is the sampler's epoch and the number of batches handed out in that epoch, counted where they leave
    the loader (so batches prefetched by workers but never used are not counted). Restoring it makes a
    :class:`ResumableSampler` skip those batches; with any other sampler restoring does nothing.
    """

    _batches_out = 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._batches_out = 0
        for batch in super().__iter__():
            self._batches_out += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        """``{"epoch": ..., "batches": ...}``: the epoch being iterated and the batches already handed out."""
        return {"epoch": int(getattr(self.sampler, "epoch", 0)), "batches": int(self._batches_out)}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Resume the epoch of ``state_dict`` after its first ``batches`` batches (when it is iterated next).

        Args:
            state_dict: The output of :meth:`state_dict`.
        """
        if isinstance(self.sampler, ResumableSampler) and self.batch_size is not None:
            self.sampler.resume(int(state_dict["epoch"]), int(state_dict["batches"]) * self.batch_size)
