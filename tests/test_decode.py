"""JPEG decoding of the shard pipeline: pixels against PIL's decoder, crop boxes, reduced DCT scale vs full decode."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image
from sklearn.datasets import load_sample_images

from vit.data.jpeg import (
    RATIO,
    Crop,
    JpegCrop,
    crop_resize,
    crop_resize_batch,
    decode,
    draw_crop,
    encode_jpeg,
    eval_crop,
    jpeg_size,
    resize_flip,
    shrink,
)


@pytest.fixture(scope="module")
def photo() -> bytes:
    image = load_sample_images().images[0][:375, :500]  # a 375x500 photograph, as ImageNet's
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _pil(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def test_decode_matches_pil_within_jpeg_tolerance(photo: bytes) -> None:
    ours, reference = decode(photo).astype(int), _pil(photo).astype(int)
    assert ours.shape == reference.shape == (375, 500, 3)
    assert jpeg_size(photo) == (375, 500)
    diff = np.abs(ours - reference)
    assert diff.mean() < 1.0 and diff.max() <= 8  # IDCT/upsampling rounding differences only


def test_reduced_scale_keeps_the_minimum_size(photo: bytes) -> None:
    assert decode(photo, 94, 125).shape == (94, 125, 3)  # 1/4 scale
    assert decode(photo, 95, 125).shape[0] >= 95
    assert decode(photo, 376, 0).shape == (375, 500, 3)  # never above full size


@pytest.mark.parametrize(("height", "width"), [(375, 500), (500, 375), (32, 32), (20, 300), (300, 20)])
def test_crops_lie_inside_the_image(height: int, width: int) -> None:
    rng = np.random.default_rng(0)
    flips = 0
    for _ in range(300):
        crop = draw_crop(rng, height, width)
        assert crop.top >= 0 and crop.top + crop.height <= height
        assert crop.left >= 0 and crop.left + crop.width <= width
        assert crop.height >= 1 and crop.width >= 1
        # the aspect ratio is in range up to the rounding of the box to whole pixels
        assert (crop.width - 0.5) / (crop.height + 0.5) <= RATIO[1] <= 4 / 3
        assert (crop.width + 0.5) / (crop.height - 0.5) >= RATIO[0] or crop.height == 1
        flips += crop.flip
    assert 100 < flips < 200


def test_reduced_scale_crop_equals_full_decode_and_resize(photo: bytes) -> None:
    rng = np.random.default_rng(1)
    full = _pil(photo)
    checked = 0
    for _ in range(40):
        crop = draw_crop(rng, 375, 500)
        ours = crop_resize(photo, crop, 64).astype(float)
        region = full[crop.top : crop.top + crop.height, crop.left : crop.left + crop.width]
        reference = cv2.resize(region, (64, 64), interpolation=cv2.INTER_AREA)
        if crop.flip:
            reference = reference[:, ::-1]
        assert ours.shape == (64, 64, 3)
        # resampling filters differ in the finest texture, and at a reduced scale the box edges sit on the decoded
        # grid (under half an output pixel away): compare what a 3x3 blur keeps
        blur = lambda x: cv2.GaussianBlur(np.asarray(x, dtype=np.float32), (3, 3), 0)  # noqa: E731
        assert np.abs(blur(ours) - blur(reference)).mean() < 6.0, crop
        checked += min(crop.height, crop.width) >= 128  # decoded at 1/2 or less
    assert checked > 10


def test_eval_view_is_the_centre_crop(photo: bytes) -> None:
    out = JpegCrop(64, train=False)(photo, np.random.default_rng(0)).permute(1, 2, 0).numpy().astype(float)
    crop, _ = eval_crop(375, 500, 64)
    assert (crop.height, crop.width) == (328, 328) and crop.top == 23 and crop.left == 86
    full = _pil(photo)[23 : 23 + 328, 86 : 86 + 328]
    reference = cv2.resize(full, (64, 64), interpolation=cv2.INTER_AREA).astype(np.float32)
    blur = lambda x: cv2.GaussianBlur(np.asarray(x, dtype=np.float32), (3, 3), 0)  # noqa: E731
    assert np.abs(blur(out) - blur(reference)).mean() < 6.0  # decoded at 1/4 scale: see the test above


def test_train_view_is_seeded_and_sized(photo: bytes) -> None:
    pipeline = JpegCrop(48, train=True, jitter=True)
    first = pipeline(photo, np.random.default_rng([3, 1]))
    again = pipeline(photo, np.random.default_rng([3, 1]))
    other = pipeline(photo, np.random.default_rng([3, 2]))
    assert first.shape == (3, 48, 48) and first.dtype.is_floating_point is False
    assert np.array_equal(first.numpy(), again.numpy())
    assert not np.array_equal(first.numpy(), other.numpy())


def test_shrink_never_upscales() -> None:
    image = np.zeros((300, 400, 3), dtype=np.uint8)
    assert shrink(image, 256).shape == (256, 341, 3)
    assert shrink(image, 300) is image and shrink(image, 1000) is image
    data = encode_jpeg(shrink(image, 64))
    assert jpeg_size(data) == (64, 85)


def test_encoded_samples_are_chroma_subsampled() -> None:
    photo = load_sample_images().images[0][:375, :500]
    data = encode_jpeg(photo)
    assert simplejpeg.decode_jpeg_header(data)[3] == "420"  # as cameras write them; 4:4:4 decodes ~1.6x slower
    buffer = io.BytesIO()  # PIL's 4:2:0 quality-90 JPEG of the same pixels: the loss to expect
    Image.fromarray(photo).save(buffer, format="JPEG", quality=90, subsampling=2)
    reference = np.abs(_pil(buffer.getvalue()).astype(int) - photo).mean()
    assert np.abs(decode(data).astype(int) - photo).mean() < 1.05 * reference
    assert abs(len(data) - len(buffer.getvalue())) < 0.05 * len(data)


def test_small_images_can_keep_full_chroma() -> None:
    photo = cv2.resize(load_sample_images().images[1][100:196, 200:296], (32, 32), interpolation=cv2.INTER_AREA)
    full, half = encode_jpeg(photo, full_chroma=True), encode_jpeg(photo)
    assert simplejpeg.decode_jpeg_header(full)[3] == "444" and simplejpeg.decode_jpeg_header(half)[3] == "420"
    error = {name: np.abs(decode(data).astype(int) - photo).mean() for name, data in (("444", full), ("420", half))}
    assert error["444"] < 0.9 * error["420"], error  # 16x16 chroma loses colour detail at 32 px


@pytest.mark.parametrize("size", [64, 224])
def test_resize_flip_equals_opencv_resize_and_flip(size: int) -> None:
    """The one-warp resize + flip of the CPU path against cv2.resize (bilinear) then a left-right flip, on crops
    that shrink and enlarge, of odd sizes, one pixel wide and the whole photograph."""
    photo = load_sample_images().images[1]
    rng = np.random.default_rng(5)
    boxes = [draw_crop(rng, *photo.shape[:2]) for _ in range(20)]
    boxes += [Crop(0, 0, *photo.shape[:2]), Crop(10, 20, 1, 37), Crop(5, 5, 41, 1), Crop(100, 200, 33, 29)]
    for crop in boxes:
        for flip in (False, True):
            region = photo[crop.top : crop.top + crop.height, crop.left : crop.left + crop.width]
            reference = cv2.resize(region, (size, size), interpolation=cv2.INTER_LINEAR)
            if flip:
                reference = reference[:, ::-1]
            diff = np.abs(resize_flip(region, size, flip).astype(int) - reference.astype(int))
            # warpAffine places taps on a 1/32 pixel grid, resize on 1/2048: a few levels on the sharpest edges
            assert diff.mean() < 0.3 and diff.max() <= 4, (crop, flip, diff.mean(), diff.max())


@pytest.mark.parametrize("size", [64, 224])
def test_batched_crop_equals_opencv_per_image(size: int) -> None:
    """The GPU path's batched crop (here on CPU tensors) against OpenCV's bilinear resize of each crop: images of
    four shapes in one batch, random-resized crops with flips, the eval view, a one-pixel box and the whole image."""
    photo = load_sample_images().images[1]
    shapes = [(256, 341), (341, 256), (256, 256), (40, 300)]
    images = [cv2.resize(photo, (w, h), interpolation=cv2.INTER_AREA) for h, w in shapes]
    rng = np.random.default_rng(4)
    batch, crops = [], []
    for image in images:
        h, w = image.shape[:2]
        boxes = [draw_crop(rng, h, w) for _ in range(6)]
        boxes += [eval_crop(h, w, size)[0], Crop(h - 1, w - 1, 1, 1, flip=True), Crop(0, 0, h, w, flip=True)]
        batch += [torch.from_numpy(image).permute(2, 0, 1)] * len(boxes)
        crops += boxes
    assert any(c.flip for c in crops) and not all(c.flip for c in crops)
    out = crop_resize_batch(batch, crops, size)
    assert out.shape == (len(crops), 3, size, size) and out.dtype == torch.uint8
    for got, image, crop in zip(out, [b.permute(1, 2, 0).numpy() for b in batch], crops, strict=True):
        region = image[crop.top : crop.top + crop.height, crop.left : crop.left + crop.width]
        reference = cv2.resize(region, (size, size), interpolation=cv2.INTER_LINEAR)
        if crop.flip:
            reference = reference[:, ::-1]
        diff = np.abs(got.permute(1, 2, 0).numpy().astype(int) - reference.astype(int))
        assert diff.max() <= 1, crop  # OpenCV's 11-bit fixed-point weights against float weights
