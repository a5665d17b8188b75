"""The corruption library's API (vit.evaluation.corruptions): seeds, errors, the 15 x 5 cells generated and cached, and
the released CIFAR-10-C layout read from a small folder of that layout written here. The pixels themselves are
checked against their references in test_corruptions.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vit.errors import DataError, UsageError
from vit.evaluation.corruptions import CORRUPTIONS, corrupt, iter_corrupted


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(11).integers(0, 256, size=(4, 32, 32, 3), dtype=np.uint8)


def test_same_seed_same_pixels_other_seed_other_pixels(images: np.ndarray) -> None:
    for name in ("gaussian_noise", "motion_blur", "frost", "fog"):
        first = corrupt(images, name, 3, seed=4)
        np.testing.assert_array_equal(first, corrupt(images.copy(), name, 3, seed=4))
        assert not np.array_equal(first, corrupt(images, name, 3, seed=5))
        assert first.dtype == np.uint8 and first.shape == images.shape


def test_threads_do_not_change_the_pixels(images: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    from vit.evaluation import corruptions

    monkeypatch.setattr(corruptions, "BLOCK_PIXELS", 32 * 32)  # one image per block: 4 blocks, 4 generators
    for name in ("shot_noise", "glass_blur", "snow", "jpeg_compression"):
        one = corrupt(images, name, 4, seed=2, workers=1)
        np.testing.assert_array_equal(one, corrupt(images, name, 4, seed=2, workers=3))


def test_every_corruption_keeps_shape_and_changes_the_image(images: np.ndarray) -> None:
    for name in CORRUPTIONS:
        out = corrupt(images[:2], name, 5)
        assert out.shape == (2, 32, 32, 3) and out.dtype == np.uint8, name
        assert not np.array_equal(out, images[:2]), name


def test_bad_arguments_are_one_clear_error(images: np.ndarray) -> None:
    with pytest.raises(UsageError, match="unknown corruption 'fogg'"):
        corrupt(images, "fogg", 1)
    with pytest.raises(UsageError, match="severity 6"):
        corrupt(images, "fog", 6)
    with pytest.raises(DataError, match=r"uint8 images of shape \(N, H, W, 3\)"):
        corrupt(images.astype(np.float32), "fog", 1)


# ------------------------------------------------------------------------------------ iter_corrupted
def test_generated_cells_come_in_order_and_are_cached(images: np.ndarray, tmp_path: Path) -> None:
    small, labels = images[:3], np.array([4, 1, 7])
    cells = [(n, s, x.copy(), y) for n, s, x, y in iter_corrupted("cifar10-c", small, labels, progress=False)]
    assert [(n, s) for n, s, _, _ in cells] == [(n, s) for n in CORRUPTIONS for s in range(1, 6)]
    assert all(np.array_equal(y, labels) for *_, y in cells)
    np.testing.assert_array_equal(cells[17][2], corrupt(small, cells[17][0], cells[17][1]))

    first = list(iter_corrupted("cifar10-c", small, labels, progress=False, cache_dir=tmp_path))
    assert len(list(tmp_path.glob("*.npy"))) == 75
    again = list(iter_corrupted("cifar10-c", small, labels, progress=False, cache_dir=tmp_path))
    assert all(isinstance(x, np.memmap) for _, _, x, _ in again)
    for (_, _, a, _), (_, _, b, _), (_, _, c, _) in zip(cells, first, again, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_a_damaged_cache_file_is_computed_again(images: np.ndarray, tmp_path: Path) -> None:
    small, labels = images[:2], np.array([0, 1])
    next(iter_corrupted("cifar10-c", small, labels, progress=False, cache_dir=tmp_path))
    (cached,) = tmp_path.glob("gaussian_noise-1-*.npy")
    cached.write_bytes(b"not a numpy file")
    _, _, x, _ = next(iter_corrupted("cifar10-c", small, labels, progress=False, cache_dir=tmp_path))
    np.testing.assert_array_equal(x, corrupt(small, "gaussian_noise", 1))
    assert np.load(cached).shape == small.shape


def write_released(folder: Path, n: int = 4, labels: int | None = None) -> dict[str, np.ndarray]:
    """A folder in the released CIFAR-10-C layout: for each corruption 5 x ``n`` images whose first pixel encodes
    the corruption, severity and image, and ``labels.npy``."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for k, name in enumerate(CORRUPTIONS):
        x = np.zeros((5 * n, 32, 32, 3), dtype=np.uint8)
        x[:, 0, 0, 0], x[:, 0, 0, 1], x[:, 0, 0, 2] = k, np.repeat(np.arange(1, 6), n), np.tile(np.arange(n), 5)
        np.save(folder / f"{name}.npy", x)
        arrays[name] = x
    np.save(folder / "labels.npy", np.tile(np.arange(n) % 10, 5).astype(np.uint8)[: labels or 5 * n])
    return arrays


def test_released_layout_is_read_by_severity_memory_mapped(tmp_path: Path) -> None:
    write_released(tmp_path / "CIFAR-10-C")
    cells = list(iter_corrupted(tmp_path / "CIFAR-10-C", None, None, progress=False))
    assert [(n, s) for n, s, _, _ in cells] == [(n, s) for n in CORRUPTIONS for s in range(1, 6)]
    for name, severity, x, y in cells:
        assert isinstance(x, np.memmap) and x.shape == (4, 32, 32, 3) and x.flags.writeable
        assert (x[:, 0, 0, 0] == CORRUPTIONS.index(name)).all() and (x[:, 0, 0, 1] == severity).all()
        np.testing.assert_array_equal(x[:, 0, 0, 2], np.arange(4))
        np.testing.assert_array_equal(y, np.arange(4))
    x[:] = 0  # copy-on-write: the file keeps its pixels
    assert np.load(tmp_path / "CIFAR-10-C" / "jpeg_compression.npy")[-1, 0, 0, 0] == len(CORRUPTIONS) - 1


def test_released_labels_may_be_given_once(tmp_path: Path) -> None:
    write_released(tmp_path, labels=4)
    _, _, _, y = list(iter_corrupted(tmp_path, None, None, progress=False))[-1]
    np.testing.assert_array_equal(y, np.arange(4))


@pytest.mark.parametrize("damage", ["missing", "float", "labels", "not npy", "not a folder"])
def test_released_layout_problems_name_the_file(tmp_path: Path, damage: str) -> None:
    write_released(tmp_path)
    culprit = tmp_path / "fog.npy"
    if damage == "missing":
        culprit.unlink()
    elif damage == "float":
        np.save(culprit, np.zeros((20, 32, 32, 3), dtype=np.float32))
    elif damage == "labels":
        culprit = tmp_path / "labels.npy"
        np.save(culprit, np.zeros(7, dtype=np.uint8))
    elif damage == "not npy":
        culprit.write_text("hello")
    else:
        culprit = tmp_path / "nowhere"
    folder = culprit if damage == "not a folder" else tmp_path
    with pytest.raises(DataError, match=str(culprit)):
        next(iter_corrupted(folder, None, None, progress=False))


@pytest.mark.slow
def test_the_library_imports_without_torch() -> None:
    code = "import sys, vit.evaluation.corruptions; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_the_benchmark_times_every_cell_on_a_folder_of_images(images: np.ndarray, tmp_path: Path) -> None:
    from PIL import Image

    from vit.bench.corruption_suite import run_corruption_suite

    for i, image in enumerate(images[:3]):
        (tmp_path / "test" / f"class{i}").mkdir(parents=True)
        Image.fromarray(image).save(tmp_path / "test" / f"class{i}" / "0.png")
    report: dict = {}
    run_corruption_suite(report=report, data_dir=str(tmp_path), images=3, json_path=str(tmp_path / "r.json"))
    entry = report["corruption"]
    assert entry["images"] == 3 and len(entry["cells"]) == 75 and entry["checks"][0]["passed"]
    assert [t["corruption"] for t in entry["per_corruption"]] == list(CORRUPTIONS)
    assert sum(t["share"] for t in entry["per_corruption"]) == pytest.approx(1.0)
    assert all(t["hot_spots"] for t in entry["per_corruption"])
    assert (tmp_path / "r.json").is_file()
