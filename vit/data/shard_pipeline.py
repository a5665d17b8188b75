"""The pipelines of ``vit data prepare``'s shards streamed with LitData (:mod:`vit.data.streaming`).

:class:`ShardPipeline` decodes and augments each image in loader workers (libjpeg-turbo at a reduced DCT scale, or
the small-image presets' albumentations pipeline); :class:`GpuDecodePipeline` (``--data.decode_device cuda``) hands
batches of JPEG bytes to the GPU, which decodes, crops and flips them (:func:`vit.data.jpeg.decode_batch_cuda`).
Shards of small images are decoded once instead (:mod:`vit.data.decoded_pipeline`) unless ``decode_once`` is off or
the GPU decodes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from vit.data.jpeg import decode_batch_cuda
from vit.data.pipeline import Pipeline, global_rank
from vit.data.streaming import ShardImages, ShardLoader, collate_raw
from vit.data.transforms import build_transforms


class ShardPipeline(Pipeline):
    """Shards streamed per image: each rank its part, shuffled per epoch, decoded and augmented in loader workers."""

    raw = False  # the loaders hand out JPEG bytes, decoded on the device

    def build(self, train: bool) -> ShardImages:
        host = self.host
        root = (host.data_dir or "").rstrip("/")
        return ShardImages(
            f"{root}/{'train' if train else 'val'}",
            host.img_size,
            train=train,
            seed=host.seed,
            augment=host.augment != "none",
            jitter=train and host.augment != "none",
            raw=self.raw,
            image_transform=self.image_transform(train),
        )

    def image_transform(self, train: bool) -> Any:
        """Small images get the albumentations pipeline they get from a folder (uint8); ImageNet-size ones the
        reduced-scale JPEG crop of :class:`~vit.data.jpeg.JpegCrop` (``None``).

        Args:
            train: The training augmentation; otherwise the eval transform.
        """
        host = self.host
        if host.preset == "imagenet":
            return None
        return build_transforms(host.preset, host.img_size, train, host.mean, host.std, host.augment, normalize=False)

    def loader(self, dataset: ShardImages, train: bool) -> ShardLoader:  # type: ignore[override]
        # LitData gives each rank its part and shuffles per epoch; the epoch is the trainer's, so a resumed run
        # replays the same order
        host = self.host
        trainer = host.trainer
        return ShardLoader(
            dataset,
            batch_size=host.batch_size,
            num_workers=host.num_workers,
            epoch_fn=(lambda: trainer.current_epoch) if train and trainer is not None else None,
            collate_fn=collate_raw if self.raw else None,
            pin_memory=host.pin_memory and torch.cuda.is_available() and not self.raw,
            drop_last=train,
        )


class GpuDecodePipeline(ShardPipeline):
    """Shards whose JPEG bytes travel to the GPU in batches, decoded, cropped and flipped there (nvJPEG): the
    random-resized crop for every image size, small ones included."""

    raw = True

    def __init__(self, host: Any) -> None:
        super().__init__(host)
        self._rng: np.random.Generator | None = None

    def image_transform(self, train: bool) -> None:
        return None

    def on_device(self, batch: Any, training: bool) -> Any:
        """Decode a batch of JPEG bytes on the GPU (random-resized crop + flip when training), then normalise.

        Args:
            batch: ``[list of JPEG bytes, labels]``, or a batch of images (``predict_dir``'s, decoded per file).
            training: Whether the trainer is fitting.
        """
        if isinstance(batch, (list, tuple)) and isinstance(batch[0], list):
            host = self.host
            if self._rng is None:
                self._rng = np.random.default_rng([host.seed, global_rank(host)])
            train = training and host.augment != "none"
            batch = [decode_batch_cuda(batch[0], host.img_size, train, self._rng), *batch[1:]]
        return super().on_device(batch, training)
