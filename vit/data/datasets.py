"""Map-style datasets that yield ``(image, label)`` and the loaders that find data on disk.

- ``ArrayDataset``: in-memory uint8 HWC arrays (CIFAR-10/100 via torchvision, scikit-learn digits).
- ``ImageFileDataset``: image files decoded to RGB by ``load_rgb`` (ImageNet and any class-folder tree).
- ``SyntheticDataset``: seeded random images, for smoke tests and benchmarks.

Every dataset applies an albumentations transform as ``transform(image=array)["image"]``; without one it
returns the uint8 HWC array. Problems with the data on disk raise ``DataError`` with what was expected.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset, default_collate
from torchvision.datasets import CIFAR10, CIFAR100

from vit.errors import DataError  # the data's user errors belong to the package's one hierarchy (and exit status)

log = logging.getLogger(__name__)

Transform = Callable[..., dict[str, Any]]
_CV2_JPEG_FLAGS = cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _apply(transform: Transform | None, image: np.ndarray) -> Any:
    return image if transform is None else transform(image=image)["image"]


class ArrayDataset(Dataset):
    """Images held in memory as one uint8 array of shape (N, H, W, 3).

    Args:
        images: uint8 array (N, H, W, 3).
        labels: N integer class indices.
        classes: Class names, indexed by label.
        transform: Albumentations pipeline applied to each image; ``None`` returns the raw array.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: Sequence[int] | np.ndarray,
        classes: list[str],
        transform: Transform | None = None,
    ) -> None:
        if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
            raise ValueError(f"images must be uint8 (N, H, W, 3), got {images.dtype} {images.shape}")
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = np.asarray(labels, dtype=np.int64)
        self.classes = classes
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return _apply(self.transform, self.images[index]), int(self.labels[index])


MAX_IMAGE_PIXELS = 50_000_000
"""The default limit on an image's pixels (width x height), checked from its header before it is decoded: 50
megapixels admits the photographs of today's 48-50 MP camera sensors (8160x6120 is 49.9 MP), while decoding one
(3 bytes per pixel, plus the copies of a mode conversion) stays well under a gigabyte. PIL's own limit (89 MP with a
warning, an error at twice that) is replaced by this one, so that an image is refused in one sentence naming it."""

MAX_IMAGE_PIXELS_OPTION = "--data.max_image_pixels"
"""The option that raises the limit, named when an image is refused."""


class ImageTooLargeError(OSError):
    """An image whose header claims more pixels than the limit (it is never decoded)."""


def _open_without_pil_limit(data: bytes) -> Image.Image:
    # PIL warns above its own limit and refuses above twice it (Image.MAX_IMAGE_PIXELS is process-wide); load_rgb
    # checks its own limit instead, so PIL's is lifted while the header is read, and restored.
    limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        return Image.open(io.BytesIO(data))
    finally:
        Image.MAX_IMAGE_PIXELS = limit


def load_rgb(path: str | Path, max_pixels: int | None = MAX_IMAGE_PIXELS) -> np.ndarray:
    """Read an image file as a uint8 (H, W, 3) RGB array; grayscale, CMYK, RGBA and palette images are converted.

    RGB and grayscale JPEGs are decoded by OpenCV's libjpeg-turbo: the same pixels PIL gives, about 1.3x as fast
    (PIL's mode conversion and copies are skipped; ``scripts/benchmark.py --suite data`` measures both).
    EXIF orientation is ignored, as PIL does. PIL still reads every header first, so each file gets its format
    check and the pixel limit before it is decoded; PIL decodes all other files. :func:`decode_rgb` reads bytes.

    Args:
        path: Image file readable by PIL.
        max_pixels: The most pixels (width x height) an image may have (:data:`MAX_IMAGE_PIXELS`); ``None``: no
            limit.

    Raises:
        ImageTooLargeError: ``cannot read image <path>: <W>x<H> pixels ...`` above ``max_pixels`` (an ``OSError``).
        OSError: ``cannot read image <path>: <reason>`` when the file is missing, truncated, corrupt, or not an image.
    """
    if os.path.islink(path) and not os.path.exists(path):
        raise OSError(f"cannot read image {path}: a broken symbolic link (to {os.readlink(path)}, which is missing)")
    return decode_rgb(path, path, max_pixels)


def decode_rgb(data: bytes | str | Path, name: str | Path, max_pixels: int | None = MAX_IMAGE_PIXELS) -> np.ndarray:
    """:func:`load_rgb` of a file's contents (or of a file), ``name`` naming it in the messages."""
    try:
        data = np.fromfile(data, dtype=np.uint8) if isinstance(data, (str, Path)) else np.frombuffer(data, np.uint8)
        with _open_without_pil_limit(data) as image:
            width, height = image.size
            if max_pixels is not None and width * height > max_pixels:
                raise ImageTooLargeError(
                    f"cannot read image {name}: {width}x{height} pixels ({width * height / 1e6:g} megapixels) is "
                    f"above the limit of {max_pixels:,} pixels ({max_pixels / 1e6:g} megapixels)"
                )
            if image.format == "JPEG" and image.mode in ("RGB", "L"):
                decoded = cv2.imdecode(data, _CV2_JPEG_FLAGS)
                if decoded is None:
                    raise OSError("the JPEG data is truncated or corrupt")
                return decoded
            if image.mode == "P" and "transparency" in image.info:
                image = image.convert("RGBA")  # PIL warns when a palette with transparency goes straight to RGB
            return np.asarray(image.convert("RGB"))
    except ImageTooLargeError:
        raise
    except UnidentifiedImageError:  # its message names the BytesIO object, not the file
        raise OSError(f"cannot read image {name}: not an image file (no image format PIL knows)") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise OSError(f"cannot read image {name}: {err}") from err


def unreadable_message(err: OSError) -> str:
    """What to do about a file :func:`load_rgb` refused, for the ``--data.*`` options of the data module."""
    if isinstance(err, ImageTooLargeError):
        return (
            f"{err}: raise the limit with {MAX_IMAGE_PIXELS_OPTION} (e.g. {MAX_IMAGE_PIXELS_OPTION} 200000000), or "
            "pass --data.skip_corrupt true to skip such files."
        )
    return f"{err}. Delete or replace the file, or pass --data.skip_corrupt true to skip unreadable files."


class ImageFileDataset(Dataset):
    """Image files with integer labels, decoded with ``load_rgb`` on every access.

    Paths are stored as one numpy bytes array, not a list of Python strings, so forked DataLoader workers do not
    copy them page by page as reference counts change.

    Args:
        samples: ``(path, label)`` pairs.
        classes: Class names, indexed by label.
        transform: Albumentations pipeline applied to each image; ``None`` returns the raw array.
        skip_corrupt: Return ``None`` for a file PIL cannot read (drop it with ``collate_skip_none``) and count it
            in ``num_skipped``; otherwise raise ``DataError`` naming the file.
        max_pixels: The pixel limit of :func:`load_rgb`.
    """

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        classes: list[str],
        transform: Transform | None = None,
        skip_corrupt: bool = False,
        max_pixels: int | None = MAX_IMAGE_PIXELS,
    ) -> None:
        self.max_pixels = max_pixels
        self._paths = np.array([os.fsencode(path) for path, _ in samples], dtype=np.bytes_)
        self.labels = np.array([label for _, label in samples], dtype=np.int64)
        self.classes = classes
        self.transform = transform
        self.skip_corrupt = skip_corrupt
        # Shared memory, so that increments made in DataLoader worker processes are seen by the main process.
        self._skipped = torch.zeros((), dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return len(self._paths)

    def path(self, index: int) -> str:
        """The file behind sample ``index``.

        Args:
            index: Sample index.
        """
        return os.fsdecode(self._paths[index])

    @property
    def num_skipped(self) -> int:
        """How many unreadable files were skipped so far, across all worker processes."""
        return int(self._skipped.item())

    def __getitem__(self, index: int) -> tuple[Any, int] | None:
        path = self.path(index)
        try:
            image = load_rgb(path, self.max_pixels)
        except OSError as err:
            if not self.skip_corrupt:
                raise DataError(unreadable_message(err)) from None
            self._skipped += 1
            log.warning("skipping unreadable image %s: %s", path, err)
            return None
        return _apply(self.transform, image), int(self.labels[index])


def collate_skip_none(batch: list[Any]) -> Any:
    """``default_collate`` after dropping the ``None`` items that ``ImageFileDataset`` returns for skipped files.

    Args:
        batch: Items from the dataset, some of them ``None``.
    """
    items = [item for item in batch if item is not None]
    if not items:
        raise DataError(f"all {len(batch)} images of a batch were unreadable; check the warnings for their paths")
    return default_collate(items)


class SyntheticDataset(Dataset):
    """Random uint8 images with random labels, each a pure function of ``(seed, offset + index)``.

    Each class has its own tint mixed into the noise, so a model can fit the labels (a loss that falls is a
    useful smoke test) while the images still look like noise.

    Args:
        num_samples: Number of items.
        num_classes: Labels are drawn from ``range(num_classes)``.
        img_size: Height and width of the generated images.
        seed: Seed shared by the train and val splits (same class tints).
        offset: Index offset, so that two splits with the same seed hold different images.
        transform: Albumentations pipeline applied to each image; ``None`` returns the raw array.
    """

    def __init__(
        self,
        num_samples: int,
        num_classes: int,
        img_size: int,
        seed: int = 0,
        offset: int = 0,
        transform: Transform | None = None,
    ) -> None:
        if num_samples < 1 or num_classes < 1 or img_size < 1:
            raise ValueError(f"need positive sizes, got {num_samples=}, {num_classes=}, {img_size=}")
        self.num_samples = num_samples
        self.img_size = img_size
        self.seed = seed
        self.offset = offset
        self.classes = [f"class_{i}" for i in range(num_classes)]
        self.transform = transform
        self._tints = np.random.default_rng([seed, 2**32 - 1]).integers(0, 256, (num_classes, 3), dtype=np.uint16)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[Any, int]:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for {self.num_samples} samples")
        rng = np.random.default_rng([self.seed, self.offset + index])
        label = int(rng.integers(len(self.classes)))
        noise = rng.integers(0, 256, (self.img_size, self.img_size, 3), dtype=np.uint16)
        image = ((noise + self._tints[label]) // 2).astype(np.uint8)
        return _apply(self.transform, image), label


def load_cifar(
    name: Literal["cifar10", "cifar100"],
    root: str | Path,
    train: bool,
    download: bool = False,
    transform: Transform | None = None,
) -> ArrayDataset:
    """Load a CIFAR split with torchvision (python pickle version) into an ``ArrayDataset``.

    Args:
        name: ``"cifar10"`` or ``"cifar100"`` (100 fine labels).
        root: Folder that holds (or will hold) ``cifar-10-batches-py/`` or ``cifar-100-python/``.
        train: The 50,000-image training split; otherwise the 10,000-image test split.
        download: Fetch and extract the archive from cs.toronto.edu first when it is not already there.
        transform: Albumentations pipeline applied to each image.
    """
    cls = CIFAR10 if name == "cifar10" else CIFAR100
    files = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    where = f"{Path(root) / cls.base_folder}/{{{','.join(files)}}}"
    try:
        data = cls(str(root), train=train, download=download)
    except RuntimeError as err:  # torchvision: "Dataset not found or corrupted"
        raise DataError(
            f"{name} not found or incomplete under {root}: expected the python version of the dataset at {where}. "
            f"Pass --data.download true to fetch it, or point --data.data_dir at the folder that contains "
            f"{cls.base_folder}/."
        ) from err
    except OSError as err:  # no network, refused connection, disk full, unreadable file, ...
        if not download:
            raise DataError(f"cannot read {name} from {where}: {err}") from err
        raise DataError(
            f"downloading {name} to {root} failed ({err}). Without network access, copy the python version of "
            f"the dataset ({cls.url}) and extract it so that {where} exist."
        ) from err
    return ArrayDataset(np.ascontiguousarray(data.data), data.targets, list(data.classes), transform)


def load_digits_split(train: bool, transform: Transform | None = None) -> ArrayDataset:
    """scikit-learn's bundled handwritten digits (1,797 8x8 images, values 0..16) as uint8 RGB, split 80/20.

    The split is stratified and fixed (``random_state=0``): 1,437 train and 360 val images. Images stay 8x8;
    the transform resizes them to ``img_size``.

    Args:
        train: The 80 % training part; otherwise the 20 % validation part.
        transform: Albumentations pipeline applied to each image.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    gray = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # (1797, 8, 8)
    index = np.arange(len(gray))
    train_idx, val_idx = train_test_split(index, test_size=0.2, stratify=digits.target, random_state=0)
    chosen = np.sort(train_idx if train else val_idx)
    images = np.repeat(gray[chosen, :, :, None], 3, axis=-1)
    return ArrayDataset(images, digits.target[chosen], [str(d) for d in digits.target_names], transform)


@dataclass
class FolderLayout:
    """A checked ``train/`` + ``val/`` (or ``test/``) tree of class folders.

    Args:
        train_dir: The ``train/`` folder.
        val_dir: The ``val/`` (or ``test/``) folder.
        classes: Sorted class folder names of ``train/``; label ``i`` is ``classes[i]``.
        missing_in_val: Classes with a folder in ``train/`` but none in ``val/``.
    """

    train_dir: Path
    val_dir: Path
    classes: list[str]
    missing_in_val: list[str] = field(default_factory=list)


def _class_dirs(folder: Path) -> list[str]:
    return sorted(entry.name for entry in os.scandir(folder) if entry.is_dir() and not entry.name.startswith("."))


def check_image_folder(data_dir: str | Path | None, kind: Literal["imagenet", "imagefolder"]) -> FolderLayout:
    """Check a class-folder tree by listing its folders (no file is opened) and return its layout.

    Args:
        data_dir: Root holding ``train/<class>/`` and ``val/<class>/`` (``imagefolder`` also accepts ``test/``).
        kind: ``"imagenet"`` (``train/<wnid>/*.JPEG``, ``val/<wnid>/*.JPEG``) or ``"imagefolder"``.
    """
    expected = (
        "<data_dir>/train/<wnid>/*.JPEG and <data_dir>/val/<wnid>/*.JPEG (1000 class folders named by WordNet id)"
        if kind == "imagenet"
        else "<data_dir>/train/<class>/<image> and <data_dir>/val/<class>/<image> (or test/ instead of val/)"
    )
    if data_dir is None:
        raise DataError(f"--data.data_dir is required for dataset {kind}; expected {expected}")
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"data_dir {root} does not exist or is not a folder; expected {expected}")
    train_dir = root / "train"
    if not train_dir.is_dir():
        raise DataError(f"no train/ folder in {root}; expected {expected}")
    splits = ("val",) if kind == "imagenet" else ("val", "test")
    val_dir = next((root / s for s in splits if (root / s).is_dir()), None)
    if val_dir is None:
        raise DataError(f"no {' or '.join(s + '/' for s in splits)} folder in {root}; expected {expected}")
    classes = _class_dirs(train_dir)
    if not classes:
        raise DataError(f"{train_dir} has no class folders; expected {expected}")
    val_classes = _class_dirs(val_dir)
    if not val_classes:
        hint = (
            " (ImageNet's validation images come flat: sort them into val/<wnid>/ first)" if kind == "imagenet" else ""
        )
        raise DataError(f"{val_dir} has no class folders{hint}; expected {expected}")
    unknown = sorted(set(val_classes) - set(classes))
    if unknown:
        raise DataError(
            f"{val_dir} has class folders that {train_dir} lacks: {unknown}. Class folders must match between "
            f"train/ and {val_dir.name}/ (labels come from the sorted train/ folder names)."
        )
    missing = sorted(set(classes) - set(val_classes))
    return FolderLayout(train_dir, val_dir, classes, missing)


def list_image_files(split_dir: Path, classes: list[str]) -> tuple[list[tuple[str, int]], list[str]]:
    """Walk ``split_dir/<class>/`` (recursively, sorted) for image files.

    Returns ``(samples, ignored)``: ``(path, label)`` pairs for files with an image extension, and the paths of
    other files (notes, CSV files, ...), which are left out. Hidden files are left out silently.

    Args:
        split_dir: ``train/``, ``val/`` or ``test/`` folder.
        classes: Class names; label ``i`` is ``classes[i]``. Classes without a folder here contribute nothing.
    """
    samples: list[tuple[str, int]] = []
    ignored: list[str] = []
    for label, name in enumerate(classes):
        class_dir = split_dir / name
        if not class_dir.is_dir():
            continue
        for folder, _, files in sorted(os.walk(class_dir, followlinks=True)):
            for file in sorted(files):
                if file.startswith("."):
                    continue
                path = os.path.join(folder, file)
                if file.lower().endswith(IMG_EXTENSIONS):
                    samples.append((path, label))
                else:
                    ignored.append(path)
    return samples, ignored


def list_predict_files(folder: str | Path) -> list[tuple[str, int]]:
    """Every image file under ``folder`` (recursively, sorted, hidden files left out) with label -1 (unknown).

    Args:
        folder: Any folder of images.

    Raises:
        DataError: The folder does not exist or holds no image file.
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise DataError(f"predict_dir {root} does not exist or is not a folder")
    paths = []
    for current, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        paths += [
            os.path.join(current, f) for f in files if not f.startswith(".") and f.lower().endswith(IMG_EXTENSIONS)
        ]
    if not paths:
        raise DataError(f"no image files ({', '.join(IMG_EXTENSIONS)}) under {root}")
    return [(path, -1) for path in sorted(paths)]
