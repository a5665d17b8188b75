"""``--data.holdout N``: validation images taken out of a folder's train/, for choosing settings without the test
images (the split ``vit sweep`` validates on)."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit.data import ImageDataModule
from vit.data.datasets import DataError


def _tree(root: Path, per_class: dict[str, int]) -> Path:
    """train/<class>/NN.png with ``per_class[class]`` images, each pixel the class index and the file number, and
    one test/ image per class."""
    for label, (name, count) in enumerate(per_class.items()):
        for split, n in (("train", count), ("test", 1)):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = np.full((8, 8, 3), (label, i, 0 if split == "train" else 255), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:02d}.png")
    return root


def _files(module: ImageDataModule, train: bool) -> list[tuple[str, int]]:
    """(class folder/file name, label) of a split, from the images the loader yields: each pixel says which file."""
    dataset = module.train_dataset if train else module.val_dataset
    names = module.class_names
    out = []
    for i in range(len(dataset)):
        image, label = dataset[i]
        r, g, b = (int(v) for v in image[:, 0, 0])
        assert b == 0  # never a test/ image
        out.append((f"{names[r]}/{g:02d}.png", int(label)))
    return sorted(out)


def test_holdout_takes_each_classes_share_of_its_last_files_out_of_train(tmp_path):
    """10 of 40 training images (20, 12 and 8 per class): 5, 3 and 2 held out, the last by name; the rest train; the
    two splits partition train/, test/ is never read, and a second module holds out the same files."""
    root = _tree(tmp_path / "data", {"ants": 20, "bees": 12, "cats": 8})
    module = ImageDataModule("imagefolder", str(root), img_size=8, batch_size=4, holdout=10, cache_dir=str(tmp_path))
    module.setup("fit")
    val, train = _files(module, False), _files(module, True)
    expected_val = [(f"{c}/{i:02d}.png", label) for label, (c, n, k) in
                    enumerate((("ants", 20, 5), ("bees", 12, 3), ("cats", 8, 2))) for i in range(n - k, n)]  # fmt: skip
    assert val == sorted(expected_val)
    assert len(train) == 30 and not set(train) & set(val)
    again = ImageDataModule("imagefolder", str(root), img_size=8, batch_size=4, holdout=10, cache_dir=str(tmp_path))
    again.setup("fit")
    assert _files(again, False) == val and _files(again, True) == train


def test_without_holdout_validation_is_the_test_folder(tmp_path):
    """The default: train on all of train/, validate on test/ (the cache of the held-out split is not reused)."""
    root = _tree(tmp_path / "data", {"ants": 6, "bees": 6})
    held = ImageDataModule("imagefolder", str(root), img_size=8, batch_size=2, holdout=4, cache_dir=str(tmp_path))
    held.setup("fit")
    module = ImageDataModule("imagefolder", str(root), img_size=8, batch_size=2, cache_dir=str(tmp_path))
    module.setup("fit")
    assert len(module.train_dataset) == 12 and len(module.val_dataset) == 2
    assert [int(module.val_dataset[i][0][2, 0, 0]) for i in range(2)] == [255, 255]


@pytest.mark.parametrize(("holdout", "word"), [(1, "larger"), (11, "smaller")])
def test_a_holdout_that_empties_a_class_is_one_line_naming_it(tmp_path, holdout, word):
    """1 of 12 rounds to none held out of a class of 6; 11 of 12 leaves a class nothing to train on."""
    root = _tree(tmp_path / "data", {"ants": 6, "bees": 6})
    module = ImageDataModule("imagefolder", str(root), img_size=8, batch_size=2, holdout=holdout,
                             cache_dir=str(tmp_path))  # fmt: skip
    message = f"--data.holdout {holdout} .*class (ants|bees): .*choose a {word} --data.holdout"
    with pytest.raises(DataError, match=message):
        module.setup("fit")


def test_holdout_needs_a_folder_dataset():
    with pytest.raises(DataError, match="--data.holdout .*dataset digits is not one"):
        ImageDataModule("digits", holdout=100)
