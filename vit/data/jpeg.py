"""JPEG decoding that can feed a GPU: libjpeg-turbo at a reduced DCT scale, then random-resized crop + flip.

A JPEG can be decoded at 1/2, 1/4 or 1/8 of its size almost for free (libjpeg-turbo skips the high-frequency DCT
coefficients), so the random-resized crop (Szegedy et al., "Going deeper with convolutions", 2015) is drawn on the
header's size first and the file is decoded at the smallest scale that still gives the crop at least ``img_size``
pixels each way. simplejpeg (libjpeg-turbo) is the decoder: on 500x375 photographs it is faster than OpenCV and
PIL with ``draft`` (``python -m vit.bench --suite data`` measures all three).

:func:`decode_batch_cuda` does the same on the GPU for a batch of JPEG bytes (``torchvision.io.decode_jpeg`` with
``device="cuda"``), cropping, resizing and flipping the whole batch there at once (:func:`crop_resize_batch`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import simplejpeg
import torch

from vit.data.transforms import EVAL_CROP_FRACTION

SCALE = (0.08, 1.0)  # Inception crop: area fraction
RATIO = (3.0 / 4.0, 4.0 / 3.0)  # and aspect ratio (torchvision's and timm's defaults)


@dataclass(frozen=True)
class Crop:
    """A crop box in the coordinates of the full-size image, and whether it is flipped left-right."""

    top: int
    left: int
    height: int
    width: int
    flip: bool = False


def jpeg_size(data: bytes) -> tuple[int, int]:
    """``(height, width)`` of a JPEG, from its header only."""
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    return int(height), int(width)


def encode_jpeg(image: np.ndarray, quality: int = 90, full_chroma: bool = False) -> bytes:
    """Encode a uint8 (H, W, 3) RGB array as JPEG bytes (libjpeg-turbo).

    Args:
        image: The pixels.
        quality: JPEG quality.
        full_chroma: 4:4:4 chroma, for small images decoded once (on a 32 px image 4:2:0 halves the colour to
            16 x 16); ``False``: 4:2:0, as cameras write photographs, which decodes faster.
    """
    subsampling = "444" if full_chroma else "420"
    return simplejpeg.encode_jpeg(
        np.ascontiguousarray(image), quality=quality, colorspace="RGB", colorsubsampling=subsampling
    )


def shrink(image: np.ndarray, short_side: int) -> np.ndarray:
    """``image`` resized (area filter) so that its shorter side is at most ``short_side``; never upscaled."""
    height, width = image.shape[:2]
    if min(height, width) <= short_side:
        return image
    factor = short_side / min(height, width)
    size = (max(1, round(width * factor)), max(1, round(height * factor)))
    return cv2.resize(image, size, interpolation=cv2.INTER_AREA)


def draw_crop(rng: np.random.Generator, height: int, width: int, flip: bool = True) -> Crop:
    """Draw an Inception random-resized crop box (area 8-100 %, aspect 3/4-4/3) inside a ``height`` x ``width``
    image, torchvision's algorithm: ten tries, then the largest centred box of a valid aspect ratio.

    Args:
        rng: The generator drawn from.
        height: Image height.
        width: Image width.
        flip: Draw a left-right flip with probability 1/2.
    """
    area = height * width
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    box = None
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            box = (int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w)
            break
    if box is None:  # fallback: the whole image, clipped to the aspect range
        aspect = width / height
        if aspect < RATIO[0]:
            w, h = width, round(width / RATIO[0])
        elif aspect > RATIO[1]:
            h, w = height, round(height * RATIO[1])
        else:
            w, h = width, height
        box = ((height - h) // 2, (width - w) // 2, h, w)
    return Crop(*box, flip=bool(flip and rng.random() < 0.5))


def decode(data: bytes, min_height: int = 0, min_width: int = 0) -> np.ndarray:
    """Decode JPEG bytes to uint8 (H, W, 3) RGB at the smallest DCT scale (1, 1/2, 1/4, 1/8) that keeps the image
    at least ``min_height`` x ``min_width`` (0: full size).

    Args:
        data: JPEG bytes.
        min_height: Smallest acceptable height of the decoded image.
        min_width: Smallest acceptable width.
    """
    return simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=min_height, min_width=min_width)


def crop_resize(data: bytes, crop: Crop, size: int) -> np.ndarray:
    """Decode ``data`` at the smallest scale at which ``crop`` still has ``size`` pixels each way, cut the crop
    (scaled to that decode) and resize it to ``size`` x ``size``; flipped when ``crop.flip``.

    Args:
        data: JPEG bytes.
        crop: A box in full-size coordinates (:func:`draw_crop`).
        size: Output height and width.
    """
    height, width = jpeg_size(data)
    factor = max(size / crop.height, size / crop.width)  # the decode may shrink the crop by this much
    if factor >= 0.5:  # no DCT scale would keep the crop at size: a plain full decode
        image = decode(data)
    else:
        image = decode(data, math.ceil(height * factor), math.ceil(width * factor))
    sy, sx = image.shape[0] / height, image.shape[1] / width
    # the box on the decoded grid (exact at full scale; at a reduced scale its edges move by under one decoded
    # pixel). What the DCT scale left is a shrink of less than 2x, so bilinear suffices.
    top, left = int(crop.top * sy), int(crop.left * sx)
    bottom = min(image.shape[0], max(top + 1, round((crop.top + crop.height) * sy)))
    right = min(image.shape[1], max(left + 1, round((crop.left + crop.width) * sx)))
    return resize_flip(image[top:bottom, left:right], size, crop.flip)


def resize_flip(region: np.ndarray, size: int, flip: bool) -> np.ndarray:
    """``region`` resized (bilinear, half-pixel centres, edges clamped: ``cv2.resize``'s sampling) to ``size`` x
    ``size`` and flipped left-right when ``flip``, in one ``cv2.warpAffine``: on a 224 px output it costs under half
    of ``cv2.resize`` + ``cv2.flip`` (``python -m vit.bench --suite data``), with the same pixels within a few
    levels on the sharpest edges (its taps lie on a 1/32 pixel grid)."""
    h, w = region.shape[:2]
    sy, sx = h / size, w / size
    # output pixel (x, y) reads the source at (sx * (x + 0.5) - 0.5, sy * (y + 0.5) - 0.5), mirrored when flipped
    if flip:
        matrix = [[-sx, 0.0, w - 0.5 * sx - 0.5], [0.0, sy, 0.5 * sy - 0.5]]
    else:
        matrix = [[sx, 0.0, 0.5 * sx - 0.5], [0.0, sy, 0.5 * sy - 0.5]]
    return cv2.warpAffine(
        region,
        np.array(matrix),
        (size, size),
        flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_REPLICATE,
    )


def eval_crop(height: int, width: int, size: int) -> tuple[Crop, float]:
    """The evaluation view: resize the shorter side to ``size / 0.875`` and centre-crop ``size``; returns the
    centre box in full-size coordinates (its shorter side ``0.875`` of the image's) and the resize factor."""
    factor = size / EVAL_CROP_FRACTION / min(height, width)
    side = min(min(height, width), round(size / factor))
    return Crop((height - side) // 2, (width - side) // 2, side, side), factor


class JpegCrop:
    """Per-image CPU pipeline on JPEG bytes: (train) random-resized crop + flip + the preset's colour jitter, or
    (eval) shorter side to ``img_size / 0.875`` + centre crop; returns a uint8 (3, img_size, img_size) tensor.

    Args:
        img_size: Output height and width.
        train: Random-resized crop + flip (+ jitter); otherwise the eval view.
        jitter: Colour jitter (brightness, contrast, saturation 0.4, p=0.8: the ImageNet preset), train only.
    """

    def __init__(self, img_size: int, train: bool, jitter: bool = False) -> None:
        self.img_size = img_size
        self.train = train
        self._jitter = None
        if jitter and train:
            import albumentations as A

            self._jitter = A.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.0, p=0.8)

    def __call__(self, data: bytes, rng: np.random.Generator) -> torch.Tensor:
        """Decode and augment ``data``, drawing the crop (and flip, jitter) from ``rng``."""
        height, width = jpeg_size(data)
        if self.train:
            crop = draw_crop(rng, height, width)
        else:
            crop, _ = eval_crop(height, width, self.img_size)
        image = crop_resize(data, crop, self.img_size)
        if self._jitter is not None:
            self._jitter.set_random_seed(int(rng.integers(2**31)))
            image = self._jitter(image=image)["image"]
        return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)


def crop_resize_batch(images: Sequence[torch.Tensor], crops: Sequence[Crop], size: int) -> torch.Tensor:
    """Cut ``crops[i]`` out of ``images[i]``, resize it to ``size`` x ``size`` and flip it where the crop says, for
    a whole batch of images of different sizes at once: a uint8 (B, 3, size, size) tensor on the images' device.

    The pixels of ``cv2.resize`` (bilinear, half-pixel centres, edges
    clamped to the crop): the images are laid end to end in one buffer and every output pixel gathers its four
    neighbours from it, so a batch costs a handful of kernels whatever its size.

    Args:
        images: uint8 (3, H_i, W_i) tensors on one device.
        crops: One box per image, in its coordinates (:func:`draw_crop`, :func:`eval_crop`).
        size: Output height and width.
    """
    device = images[0].device
    flat = torch.cat([image.reshape(3, -1) for image in images], dim=1)
    sizes = [image.shape[1] * image.shape[2] for image in images]
    offsets = torch.tensor([0, *sizes[:-1]], device=device).cumsum(0)
    widths = torch.tensor([image.shape[2] for image in images], device=device)
    boxes = torch.tensor([(c.top, c.left, c.height, c.width) for c in crops], device=device)
    flips = torch.tensor([c.flip for c in crops], device=device)
    centres = torch.arange(size, device=device, dtype=torch.float32) + 0.5

    def taps(length: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Lower and upper source index and the upper's weight, per image and output position, inside the crop."""
        position = (centres[None] * (length[:, None] / size) - 0.5).clamp(min=0)
        position = torch.minimum(position, (length[:, None] - 1).float())
        low = position.floor().long()
        return low, torch.minimum(low + 1, length[:, None] - 1), position - low

    y0, y1, wy = taps(boxes[:, 2])
    x0, x1, wx = taps(boxes[:, 3])
    x0, x1, wx = (torch.where(flips[:, None], t.flip(-1), t) for t in (x0, x1, wx))  # flip: columns read backwards

    def pick(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The (3, B, size, size) pixels at crop rows ``y`` (B, size) and crop columns ``x`` (B, size)."""
        row = offsets[:, None] + (boxes[:, :1] + y) * widths[:, None]
        return flat[:, row[:, :, None] + (boxes[:, 1:2] + x)[:, None, :]].float()

    wy, wx = wy[None, :, :, None], wx[None, :, None, :]
    top = pick(y0, x0) * (1 - wx) + pick(y0, x1) * wx
    bottom = pick(y1, x0) * (1 - wx) + pick(y1, x1) * wx
    out = top * (1 - wy) + bottom * wy
    return out.round_().clamp_(0, 255).to(torch.uint8).permute(1, 0, 2, 3).contiguous()


def decode_batch_cuda(
    datas: Sequence[bytes], img_size: int, train: bool, generator: np.random.Generator
) -> torch.Tensor:
    """Decode a batch of JPEG bytes on the GPU (nvJPEG via ``torchvision.io.decode_jpeg``) and crop, resize and
    flip the whole batch there (:func:`crop_resize_batch`): a uint8 (B, 3, img_size, img_size) CUDA tensor.

    Args:
        datas: JPEG bytes, one per image.
        img_size: Output height and width.
        train: Random-resized crop + flip; otherwise the eval view.
        generator: Draws the crops and flips.

    Raises:
        DataError: without CUDA.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    from vit.data.datasets import DataError

    if not torch.cuda.is_available():
        raise DataError("--data.decode_device cuda needs a CUDA GPU and none is visible; use --data.decode_device cpu")
    encoded = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]
    images = decode_jpeg(encoded, mode=ImageReadMode.RGB, device="cuda")
    shapes = [image.shape[1:] for image in images]
    if train:
        crops = [draw_crop(generator, height, width) for height, width in shapes]
    else:
        crops = [eval_crop(height, width, img_size)[0] for height, width in shapes]
    return crop_resize_batch(images, crops, img_size)
