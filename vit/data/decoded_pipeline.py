"""The pipeline of small images decoded once: a uint8 tensor per split, augmented in batches on the device.

CIFAR, digits, class folders of images up to 64 px and shards of them are decoded once (:mod:`vit.data.decoded`,
cached on disk), kept on the training device when they fit and augmented there in one batched call per batch
(:mod:`vit.data.batch_augment`, :mod:`vit.data.decoded_loader`).
"""

from __future__ import annotations

import torch

from vit.data.batch_augment import BatchAugment
from vit.data.decoded import DecodedSplit, DecodeRequest
from vit.data.decoded_loader import DecodedLoader
from vit.data.pipeline import Pipeline, decode_split, rank_sampler


class DecodedPipeline(Pipeline):
    """Splits decoded once into uint8 tensors (cached on disk); batches gathered and augmented on the device."""

    train_dataset: DecodedSplit | None
    val_dataset: DecodedSplit | None

    def build(self, train: bool) -> DecodedSplit:
        source = self.host.spec.source(self.host, train)
        assert isinstance(source, DecodeRequest)  # only decodable specs choose this pipeline
        return decode_split(source, self.host)

    def prepare(self, stage: str | None) -> None:
        """Decode the splits the run needs into the cache, and a folder's statistics from its train split.

        Lightning runs this on one process per node, then the others wait: under DDP they read the cache in
        ``setup`` instead of all decoding the same files at once.

        Args:
            stage: The trainer's stage, or ``None`` (``fit``).
        """
        self.setup(stage if stage is not None else "fit")
        _ = self.host.mean  # a folder's own statistics come from its train split (decoded and cached here)

    def decoded_train(self) -> DecodedSplit:
        self.setup("fit")
        assert self.train_dataset is not None
        return self.train_dataset

    def loader(self, dataset: DecodedSplit, train: bool) -> DecodedLoader:  # type: ignore[override]
        host = self.host
        device = host.trainer.strategy.root_device if host.trainer is not None else torch.device("cpu")
        augment = None
        if train and host.augment != "none":
            fill = tuple(255.0 * m for m in host.mean)
            augment = BatchAugment(host.preset, host.img_size, host.augment, fill)
        finish = None if host.normalize_on_device else host.normalize
        sampler = rank_sampler(host, dataset, train)
        return DecodedLoader(
            dataset,
            host.batch_size,
            sampler,
            augment,
            drop_last=train,
            device=device,
            finish=finish,
            size=host.img_size,
        )
