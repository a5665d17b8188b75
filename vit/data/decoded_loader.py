"""The loader of data decoded once: batches gathered from a resident uint8 tensor and augmented in one batched call.

No worker processes: a batch is one indexing operation on the tensor (on the training device when it fits) plus one
:class:`~vit.data.batch_augment.BatchAugment` call. The order comes from a :class:`~vit.data.sampler.ResumableSampler`
(a function of ``(seed, epoch)``, one disjoint shard per DDP rank), and each batch's augmentation from a generator
seeded with the sampler's seed for the batch's first position; Lightning stores ``state_dict`` (epoch, batches handed
out) in checkpoints and a resumed run skips those batches, so it sees the same batches, augmented the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from vit.data.batch_augment import BatchAugment
from vit.data.decoded import DecodedSplit
from vit.data.sampler import ResumableSampler


def fits_on(device: torch.device, nbytes: int, fraction: float = 0.25) -> bool:
    """Whether ``nbytes`` may live on ``device``: always on the CPU; on a GPU, within ``fraction`` of its free memory.

    Args:
        device: The training device.
        nbytes: Size of the tensors to place.
        fraction: Share of the currently free device memory they may take.
    """
    if device.type != "cuda":
        return device.type == "cpu"
    free, _ = torch.cuda.mem_get_info(device)
    return nbytes <= fraction * free


def enlarge(images: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize of a uint8 batch to ``size`` x ``size`` (half-pixel centres, as OpenCV's INTER_LINEAR).

    Args:
        images: uint8 (B, 3, H, W).
        size: Output height and width.
    """
    out = F.interpolate(images.float(), size=(size, size), mode="bilinear", align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8)


class DecodedLoader:
    """Iterates ``(images uint8 (B, 3, H, W), labels (B,))`` batches of a :class:`DecodedSplit`.

    Args:
        split: The decoded images and labels.
        batch_size: Images per batch.
        sampler: Yields ``(index, seed)`` pairs (order and augmentation seeds of the epoch, this rank's shard).
        augment: Batched augmentation, or ``None`` (evaluation).
        drop_last: Drop the last incomplete batch.
        device: Where batches are gathered and augmented; the split moves there if it fits, else stays on the CPU.
        finish: Applied to the images last (``normalize``, when the batches are not normalised after the transfer).
        size: Height and width of the batches; a split stored smaller (see ``DecodeRequest.decoded_size``) is
            enlarged bilinearly, batch by batch, before the augmentation, as the per-image ``A.Resize`` does.
    """

    batch_sampler = None  # Lightning's loader checks read it: batches come from ``sampler`` directly

    def __init__(
        self,
        split: DecodedSplit,
        batch_size: int,
        sampler: ResumableSampler,
        augment: BatchAugment | None = None,
        drop_last: bool = False,
        device: torch.device | str = "cpu",
        finish: Callable[[torch.Tensor], torch.Tensor] | None = None,
        size: int | None = None,
    ) -> None:
        self.dataset = split
        self.batch_size = batch_size
        self.sampler = sampler
        self.augment = augment
        self.drop_last = drop_last
        self.finish = finish
        self.size = size
        self._batches_out = 0
        device = torch.device(device)
        nbytes = split.images.nbytes + split.labels.nbytes
        self.device = device if fits_on(device, nbytes) else torch.device("cpu")
        self._images = split.images.to(self.device)
        self._labels = split.labels.to(self.device)

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._batches_out = 0
        pairs = list(self.sampler)
        if self.drop_last:
            pairs = pairs[: len(pairs) // self.batch_size * self.batch_size]
        if not pairs:
            return
        order = torch.tensor([index for index, _ in pairs]).to(self.device)  # one copy per epoch, none per step
        seeds = [seed for _, seed in pairs[:: self.batch_size]]
        for start, seed in zip(range(0, len(pairs), self.batch_size), seeds, strict=True):
            index = order[start : start + self.batch_size]
            images, labels = self._images[index], self._labels[index]
            if self.size is not None and images.shape[-1] != self.size:
                images = enlarge(images, self.size)
            if self.augment is not None:
                generator = torch.Generator(device=self.device).manual_seed(seed)
                images = self.augment(images, generator)
            if self.finish is not None:
                images = self.finish(images)
            self._batches_out += 1
            yield images, labels

    def state_dict(self) -> dict[str, int]:
        """``{"epoch": ..., "batches": ...}``: the epoch being iterated and the batches already handed out."""
        return {"epoch": int(self.sampler.epoch), "batches": int(self._batches_out)}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Resume the epoch of ``state_dict`` after its first ``batches`` batches (when it is iterated next).

        Args:
            state_dict: The output of :meth:`state_dict`.
        """
        self.sampler.resume(int(state_dict["epoch"]), int(state_dict["batches"]) * self.batch_size)
