"""The data suite's pipelines, each of ours beside its torchvision v2 twin, so that what is compared is read in one
place: the CIFAR preset (per image, and batched as the decoded-once loader runs it), JPEG files decoded and cropped,
and shard samples cropped at a reduced DCT scale. Albumentations, OpenCV, torchvision and ``vit.data`` are imported
inside the functions: :mod:`vit.bench.data_suite` calls them when the suite runs.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

BATCH = 512  # images per call of the batched augmentation
SHARDS = "vit.data shards"
# Row labels of the data table (the checks select rows by them).
CIFAR = "CIFAR preset (pad-crop, flip, normalise)"
CROP = "JPEG -> RRC 224 -> flip -> normalise"
DECODE = "JPEG decode only"
JITTER = "JPEG -> imagenet train preset (+ colour jitter)"
STRONG = "CIFAR strong preset (+ colour, affine, grey, cutout)"
SHARD_CROP = "shard -> RRC 224 -> flip"
MINE, TV, LOADER = "albumentations (ours)", "torchvision v2", "load_rgb (cv2)"
BATCHED = f"BatchAugment (ours, batch {BATCH})"

# (name, implementation, decoder, where the normalisation runs, fn, input kind)
Pipeline = tuple[str, str, str, str, Callable[[Any], Any], str]


def chw(image: Any) -> torch.Tensor:
    """An ``(H, W, C)`` array as a ``(C, H, W)`` tensor (a view)."""
    return torch.from_numpy(image).permute(2, 0, 1)


def ours(preset: str, size: int, mean: Any, std: Any, normalize: bool, jitter: bool = True) -> Any:
    """Our albumentations training preset, without its colour jitter when ``jitter`` is false."""
    import albumentations as A

    from vit.data import build_transforms

    transform = build_transforms(preset, size, True, mean, std, seed=0, normalize=normalize)  # type: ignore[arg-type]
    if not jitter:
        transform = A.Compose([t for t in transform.transforms if not isinstance(t, A.ColorJitter)], seed=0)
    return transform


def cifar_pipelines(cifar_images: Sequence[Any], *, seed: int = 0) -> tuple[list[Pipeline], torch.Tensor]:
    """The CIFAR rows (per image, and batched on a whole uint8 batch), and the batch they read."""
    from torchvision.transforms import v2

    from vit.data import CIFAR10_MEAN, CIFAR10_STD, BatchAugment

    # ImageDataModule's workers stop at uint8 ("device": normalised after the copy to the accelerator);
    # normalize_on_device=False and torchvision's usual recipe normalise in the worker.
    cifar_device = ours("cifar", 32, CIFAR10_MEAN, CIFAR10_STD, normalize=False)
    cifar_worker = ours("cifar", 32, CIFAR10_MEAN, CIFAR10_STD, normalize=True)
    tv_cifar = v2.Compose(
        [
            v2.Resize((32, 32), antialias=True),
            v2.Pad(4, padding_mode="reflect"),  # = cv2.BORDER_REFLECT_101
            v2.RandomCrop(32),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(CIFAR10_MEAN, CIFAR10_STD),
        ]
    )
    generator = torch.Generator().manual_seed(seed)
    basic_batch, strong_batch = BatchAugment("cifar", 32, "basic"), BatchAugment("cifar", 32, "strong")
    batch = torch.stack([chw(cifar_images[i % len(cifar_images)]) for i in range(BATCH)]).contiguous()
    pipelines: list[Pipeline] = [
        (CIFAR, MINE, "–", "device", lambda im: cifar_device(image=im)["image"], "cifar"),
        (CIFAR, MINE, "–", "worker", lambda im: cifar_worker(image=im)["image"], "cifar"),
        (CIFAR, TV, "–", "worker", lambda im: tv_cifar(chw(im)), "cifar"),
        (CIFAR, BATCHED, "–", "device", lambda b: basic_batch(b, generator), "batch"),
        (STRONG, BATCHED, "–", "device", lambda b: strong_batch(b, generator), "batch"),
    ]
    return pipelines, batch


def jpeg_pipelines() -> list[Pipeline]:
    """The JPEG-file rows: decoding alone, decode -> crop -> flip -> normalise, and the preset with colour jitter."""
    import cv2
    import numpy as np
    from PIL import Image
    from torchvision.io import decode_jpeg, read_file
    from torchvision.transforms import InterpolationMode, v2

    from vit.data import IMAGENET_MEAN, IMAGENET_STD, load_rgb

    def pil_rgb(path: Path) -> Any:  # what load_rgb did before it decoded JPEGs with torchvision
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))

    def cv2_rgb(path: Path) -> Any:
        return cv2.cvtColor(cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)

    def tv_decode(path: Path) -> torch.Tensor:
        return decode_jpeg(read_file(str(path)))

    crop_device = ours("imagenet", 224, IMAGENET_MEAN, IMAGENET_STD, normalize=False, jitter=False)
    crop_worker = ours("imagenet", 224, IMAGENET_MEAN, IMAGENET_STD, normalize=True, jitter=False)
    preset_device = ours("imagenet", 224, IMAGENET_MEAN, IMAGENET_STD, normalize=False)
    tv_ops = [
        v2.RandomResizedCrop(224, scale=(0.08, 1.0), interpolation=InterpolationMode.BICUBIC, antialias=True),
        v2.RandomHorizontalFlip(),
    ]
    tv_tail = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    tv_crop_device = v2.Compose(tv_ops)
    tv_crop_worker = v2.Compose(tv_ops + tv_tail)
    tv_preset = v2.Compose(tv_ops + [v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4)], p=0.8)] + tv_tail)
    return [
        (DECODE, "vit.data", LOADER, "–", load_rgb, "jpeg"),
        (DECODE, "PIL", "Image.convert('RGB')", "–", pil_rgb, "jpeg"),
        (DECODE, "OpenCV", "cv2.imdecode", "–", cv2_rgb, "jpeg"),
        (CROP, MINE, LOADER, "device", lambda p: crop_device(image=load_rgb(p))["image"], "jpeg"),
        (CROP, MINE, LOADER, "worker", lambda p: crop_worker(image=load_rgb(p))["image"], "jpeg"),
        (CROP, MINE, "PIL", "worker", lambda p: crop_worker(image=pil_rgb(p))["image"], "jpeg"),
        (CROP, TV, "decode_jpeg", "device", lambda p: tv_crop_device(tv_decode(p)), "jpeg"),
        (CROP, TV, "decode_jpeg", "worker", lambda p: tv_crop_worker(tv_decode(p)), "jpeg"),
        (JITTER, MINE, LOADER, "device", lambda p: preset_device(image=load_rgb(p))["image"], "jpeg"),
        (JITTER, TV, "decode_jpeg", "worker", lambda p: tv_preset(tv_decode(p)), "jpeg"),
    ]


def shard_pipelines(seed: int) -> list[Pipeline]:
    """The shard rows: crop -> flip from a shard sample with three decoders, and the preset with colour jitter."""
    import cv2
    import numpy as np
    from PIL import Image

    from vit.data.jpeg import JpegCrop, draw_crop, jpeg_size

    shard_rng = np.random.default_rng(seed)
    shard_train = JpegCrop(224, train=True)
    shard_preset = JpegCrop(224, train=True, jitter=True)

    def shard_cv2(data: bytes) -> torch.Tensor:  # full-size OpenCV decode, then the same crop
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_RGB)
        c = draw_crop(shard_rng, *image.shape[:2])
        out = cv2.resize(image[c.top : c.top + c.height, c.left : c.left + c.width], (224, 224))
        return chw(np.ascontiguousarray(out[:, ::-1]) if c.flip else out)

    def shard_pil_draft(data: bytes) -> torch.Tensor:  # PIL at the reduced scale draft() allows for the crop
        c = draw_crop(shard_rng, *jpeg_size(data))
        with Image.open(io.BytesIO(data)) as image:
            full_w, full_h = image.size
            f = min(1.0, max(224 / c.height, 224 / c.width))
            image.draft("RGB", (int(full_w * f), int(full_h * f)))
            sx, sy = image.size[0] / full_w, image.size[1] / full_h
            box = (c.left * sx, c.top * sy, (c.left + c.width) * sx, (c.top + c.height) * sy)
            out = np.asarray(image.convert("RGB").resize((224, 224), Image.BILINEAR, box=box))
        return chw(np.ascontiguousarray(out[:, ::-1]) if c.flip else out)

    return [
        (SHARD_CROP, SHARDS, "simplejpeg, reduced DCT", "device", lambda d: shard_train(d, shard_rng), "shard"),
        (SHARD_CROP, SHARDS, "cv2.imdecode, full", "device", shard_cv2, "shard"),
        (SHARD_CROP, SHARDS, "PIL draft", "device", shard_pil_draft, "shard"),
        (JITTER, SHARDS, "simplejpeg, reduced DCT", "device", lambda d: shard_preset(d, shard_rng), "shard"),
    ]
