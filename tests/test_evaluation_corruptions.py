"""The corruption evaluation wired to vit test: accuracies of a folder in the released CIFAR-10-C layout (written
here) against a per-image loop, and ``vit test --corruptions`` writing them with their grid of examples."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vit.evaluation import CORRUPTIONS, evaluate_corruptions

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def _released_folder(root, per_severity: int = 6, size: int = 32, classes: int = 3):
    """15 ``<corruption>.npy`` files of 5 x ``per_severity`` random uint8 images and a ``labels.npy`` of as many."""
    rng = np.random.default_rng(0)
    root.mkdir()
    for name in CORRUPTIONS:
        np.save(root / f"{name}.npy", rng.integers(0, 256, (5 * per_severity, size, size, 3), dtype=np.uint8))
    np.save(root / "labels.npy", rng.integers(0, classes, 5 * per_severity))
    return root


def _loop_accuracy(model, images: np.ndarray, labels: np.ndarray) -> float:
    """One image at a time: ``(x / 255 - mean) / std``, channels first, the arg max of the logits."""
    correct = 0
    for image, label in zip(images, labels, strict=True):
        x = torch.tensor((image / 255.0 - np.array(MEAN)) / np.array(STD), dtype=torch.float32).permute(2, 0, 1)
        with torch.no_grad():
            correct += int(model(x[None]).argmax(-1).item() == label)
    return correct / len(labels)


def test_released_layout_accuracies_equal_a_loop(tmp_path, tiny_vit, one_thread):
    torch.manual_seed(0)
    model = tiny_vit(num_classes=3).eval()
    folder = _released_folder(tmp_path / "CIFAR-10-C")
    rng = np.random.default_rng(1)
    clean, clean_labels = rng.integers(0, 256, (10, 32, 32, 3), dtype=np.uint8), rng.integers(0, 3, 10)
    report, examples = evaluate_corruptions(
        model, clean, clean_labels, mean=MEAN, std=STD, source=str(folder), batch_size=4, progress=False
    )
    labels = np.load(folder / "labels.npy")
    assert report["clean_accuracy"] == pytest.approx(_loop_accuracy(model, clean, clean_labels))
    assert list(report["accuracy"]) == list(CORRUPTIONS) and report["num_images"] == 6
    for name in ("gaussian_noise", "fog", "jpeg_compression"):
        images = np.load(folder / f"{name}.npy")
        expected = [_loop_accuracy(model, images[s * 6 : (s + 1) * 6], labels[s * 6 : (s + 1) * 6]) for s in range(5)]
        assert report["accuracy"][name] == pytest.approx(expected)
        assert report["drop"][name] == pytest.approx(report["clean_accuracy"] - np.mean(expected))
        assert np.array_equal(examples[name][2], images[12])  # the first image of severity 3
    table = np.array(list(report["accuracy"].values()))
    assert report["mean_corruption_accuracy"] == pytest.approx(table.mean())
    assert report["severity_accuracy"] == pytest.approx(table.mean(0))
    assert report["not_exact"] == {}  # the released files are the authors' pixels


@pytest.mark.slow
def test_vit_test_with_corruptions(tmp_path, trained_checkpoint, digits_test_args):
    from vit.cli import cli_main

    folder = _released_folder(tmp_path / "CIFAR-10-C", per_severity=4, classes=10)
    cli_main(digits_test_args(trained_checkpoint, tmp_path / "run", f"--corruptions={folder}"))
    result = json.loads((tmp_path / "run" / "evaluation.json").read_text())
    corruptions = result["corruptions"]
    assert corruptions["source"] == str(folder) and corruptions["num_images"] == 4
    assert all(len(values) == 5 for values in corruptions["accuracy"].values())
    assert all(v in (0.0, 0.25, 0.5, 0.75, 1.0) for values in corruptions["accuracy"].values() for v in values)
    assert (tmp_path / "run" / "corruptions.png").read_bytes()[:4] == b"\x89PNG"
    assert "Common corruptions" in (tmp_path / "run" / "evaluation.html").read_text()

    with pytest.raises(SystemExit) as exit_info:
        cli_main(digits_test_args(trained_checkpoint, tmp_path / "bad", "--corruptions=no-such-folder"))
    assert exit_info.value.code == 2
    assert not (tmp_path / "bad" / "evaluation.json").exists()


@pytest.mark.slow
def test_corruptions_of_a_two_process_config_test_in_one(tmp_path, trained_checkpoint, digits_test_args, capsys):
    """The CPU recipe tests with two DDP processes; with --corruptions the same command tests in one and says so."""
    from vit.cli import cli_main

    folder = _released_folder(tmp_path / "CIFAR-10-C", per_severity=2, classes=10)
    two = ["--trainer.devices=2", "--trainer.strategy=ddp", "--torch_num_threads=1", f"--corruptions={folder}"]
    cli_main(digits_test_args(trained_checkpoint, tmp_path / "run", *two))
    assert "testing with 1 process instead of the config's 2" in capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "evaluation.json").read_text())["corruptions"]["num_images"] == 2
