"""Streaming the shards of ``vit data prepare``: ``litdata.StreamingDataset`` + ``StreamingDataLoader``, resumable.

- :class:`ShardImages` reads one split of a shard folder (local or any URL LitData reads). LitData gives each rank of
  each node (``torch.distributed``, or ``WORLD_SIZE``/``GLOBAL_RANK``) a disjoint part and shuffles per epoch from
  ``seed``. Each sample's crop and flip are drawn from ``(seed, epoch, sample id)``, so an image does not depend on
  the worker that decodes it nor on what came before.
- :func:`read_split` reads a whole split of small images (the ``cifar`` and ``digits`` presets) into memory
  instead, to be decoded once and augmented in batches like a folder of them.
- :class:`ShardLoader` keeps its own state, ``{"epoch", "batches"}``: Lightning stores it in the checkpoint and gives
  it back on resume; the resumed epoch replays the same order (same seed, epoch, world size, workers) and drops the
  batches already handed out, so training goes on at the next sample. LitData's own resume is not used.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from litdata import StreamingDataLoader, StreamingDataset
from torch.utils.data import default_collate

from vit.data.decoded import DecodeRequest, resize_op
from vit.data.jpeg import JpegCrop, decode, jpeg_size


class ShardImages(StreamingDataset):
    """One split of a shard folder as ``(uint8 image (3, img_size, img_size), label)`` items.

    Args:
        input_dir: The split folder (``DEST/train``, ``DEST/val``) or its URL.
        img_size: Height and width of the images.
        train: Shuffle per epoch and give every rank the same number of whole batches; otherwise the stored order,
            every sample.
        seed: Seed of the order and of the crops.
        augment: Random-resized crop + flip (train only); otherwise the eval view.
        jitter: The ImageNet preset's colour jitter (with ``augment``).
        raw: Return the JPEG bytes instead of a decoded image (decoding on the GPU).
        return_ids: Return ``(image, label, sample id)``.
        image_transform: An albumentations pipeline (:func:`~vit.data.build_transforms`, ``normalize=False``)
            applied to the whole decoded image instead of the crop above: small images (the ``cifar`` and
            ``digits`` presets) get the augmentation they get from a folder. Seeded per sample like the crop.
    """

    def __init__(
        self,
        input_dir: str,
        img_size: int,
        train: bool,
        seed: int = 0,
        augment: bool = True,
        jitter: bool = False,
        raw: bool = False,
        return_ids: bool = False,
        image_transform: Callable[..., dict[str, Any]] | None = None,
    ) -> None:
        # Training: every rank gets the same number of whole batches (LitData hands out parts in batch units and,
        # without drop_last, gives one rank an extra, partial batch: under DDP the other ranks would wait for it at
        # the end of every epoch). Fewer than ranks x batch size samples of each shuffled epoch are left out, a
        # different few each epoch. Evaluation keeps every sample; ranks may get unequal parts.
        super().__init__(input_dir, shuffle=train, seed=seed, drop_last=train)
        self.img_size = img_size
        self.train = train
        self.raw = raw
        self.return_ids = return_ids
        self.pipeline = JpegCrop(img_size, train and augment, jitter)
        self.image_transform = image_transform

    def __getitem__(self, index: Any) -> Any:
        item = super().__getitem__(index)
        label, sample_id = int(item["label"]), int(item["id"])
        if self.raw:
            image: Any = bytes(item["image"])
        else:
            rng = np.random.default_rng([self.seed, int(self.current_epoch), sample_id])
            if self.image_transform is None:
                image = self.pipeline(item["image"], rng)
            else:
                self.image_transform.set_random_seed(int(rng.integers(2**31)))
                image = self.image_transform(image=decode(item["image"]))["image"]
        return (image, label, sample_id) if self.return_ids else (image, label)

    def path(self, index: int) -> str:
        """The source file (or ``dataset:split/index``) of the sample at position ``index`` of the split."""
        return os.fsdecode(bytes(super().__getitem__(index)["path"]))


def collate_raw(batch: list[tuple]) -> Any:
    """Collate ``(jpeg bytes, label, ...)`` items: the bytes as a list, the rest as tensors."""
    images = [item[0] for item in batch]
    return [images, *default_collate([item[1:] for item in batch])]


class ShardLoader(StreamingDataLoader):
    """A ``StreamingDataLoader`` whose epochs follow ``epoch_fn`` and that resumes mid-epoch from its own state.

    Args:
        dataset: A :class:`ShardImages` split.
        batch_size: Images per batch.
        num_workers: Worker processes (the resumed run must use as many: the order depends on it).
        epoch_fn: ``() -> epoch`` (the trainer's); ``None``: count the epochs iterated, from 0.
        **kwargs: Passed to ``StreamingDataLoader``.
    """

    def __init__(
        self,
        dataset: ShardImages,
        batch_size: int,
        num_workers: int = 0,
        epoch_fn: Callable[[], int] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, batch_size=batch_size, num_workers=num_workers, **kwargs)
        self._epoch_fn = epoch_fn
        self._epoch = -1
        self._batches_out = 0
        self._resume: tuple[int, int] | None = None

    def __iter__(self) -> Iterator[Any]:
        skip = 0
        if self._resume is not None:  # the first epoch after a restore is the saved one, cut where it stopped
            self._epoch, skip = self._resume
        else:
            self._epoch = self._epoch_fn() if self._epoch_fn is not None else self._epoch + 1
        self._resume = None
        self.restore = False
        self.current_epoch = self._epoch  # LitData adds one and shuffles with it
        self._batches_out = 0
        for batch in super().__iter__():
            self._batches_out += 1
            if self._batches_out > skip:
                yield batch

    def state_dict(self) -> dict[str, int]:  # type: ignore[override]
        """``{"epoch": ..., "batches": ...}``: the epoch being iterated and the batches handed out in it."""
        return {"epoch": int(self._epoch), "batches": int(self._batches_out)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Iterate epoch ``state_dict["epoch"]`` next, from batch ``batches`` on (Lightning restores the state of a
        checkpoint saved mid-epoch before it iterates the loader again).

        Args:
            state_dict: The output of :meth:`state_dict`.
        """
        self._resume = (int(state_dict["epoch"]), int(state_dict["batches"]))


def read_split(input_dir: str, count: int, classes: list[str], img_size: int) -> DecodeRequest:
    """Every sample of one split, decoded, in the order of their source (sample id): small images to be held in
    memory as one tensor (:mod:`vit.data.decoded`). Every rank reads the whole split; its loader takes its part.

    Args:
        input_dir: The split folder or its URL.
        count: Its number of samples (``vit-shards.json``).
        classes: Class names indexed by label.
        img_size: Images of different sizes are resized to it (the eval transform's resize); same-size images
            are kept at their size.
    """
    from vit.data.datasets import DataError

    dataset = StreamingDataset(input_dir)
    decoded = []  # (id, image, label): each sample's bytes are dropped once decoded
    for i in range(count):
        item = dataset[i]
        decoded.append((int(item["id"]), decode(item["image"]), int(item["label"])))
    if not decoded:
        raise DataError(f"{input_dir} holds no samples; prepare the shards again with `vit data prepare`")
    decoded.sort(key=lambda sample: sample[0])
    images = [image for _, image, _ in decoded]
    if len({image.shape for image in images}) > 1:
        op = resize_op(img_size)
        images = [op(image=image)["image"] for image in images]
    labels = [label for _, _, label in decoded]
    return DecodeRequest(classes, np.stack(images), labels, split=os.path.basename(input_dir.rstrip("/")))


def stored_image_size(input_dir: str) -> int:
    """The larger side of the first sample of a split as stored (read from its JPEG header): how a prepared
    folder's shards are judged small or ImageNet-size, as the folder itself is by its first image."""
    height, width = jpeg_size(StreamingDataset(input_dir)[0]["image"])
    return max(height, width)
