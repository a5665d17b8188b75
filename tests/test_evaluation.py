"""vit.evaluation's metrics against loops written from their definitions, across two DDP processes against one, and
``vit test``'s evaluation files against the accuracy and loss Lightning logs."""

from __future__ import annotations

import json
import os
import shlex
import sys

import numpy as np
import pytest
import torch

from vit.evaluation import ClassificationMetrics
from vit.evaluation.report import summary_table, write_evaluation


def _logits(n: int = 600, classes: int = 10, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of a model that is right about 70 % of the time, with varied confidence."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    logits = torch.randn(n, classes, generator=g) * torch.rand(n, 1, generator=g) * 3
    logits[torch.arange(n), labels] += torch.rand(n, generator=g) * 4
    return logits, labels


def _reference(logits: np.ndarray, labels: np.ndarray, n_bins: int = 15) -> dict:
    """Every number by its definition, in float64 loops (Guo et al. 2017 for ECE / MCE, Brier 1950)."""
    n, c = logits.shape
    z = logits - logits.max(1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    pred = probs.argmax(1)
    confusion = np.zeros((c, c), dtype=int)
    for t, p in zip(labels, pred, strict=True):
        confusion[t, p] += 1
    precision = [confusion[k, k] / max(confusion[:, k].sum(), 1) for k in range(c)]
    recall = [confusion[k, k] / max(confusion[k].sum(), 1) for k in range(c)]
    f1 = [2 * p * r / (p + r) if p + r else 0.0 for p, r in zip(precision, recall, strict=True)]
    nll = -np.mean([np.log(probs[i, labels[i]]) for i in range(n)])
    brier = np.mean([sum((probs[i, k] - (k == labels[i])) ** 2 for k in range(c)) for i in range(n)])
    top5 = np.mean([labels[i] in np.argsort(-probs[i])[:5] for i in range(n)])
    conf = probs.max(1)
    count, conf_sum, correct = np.zeros(n_bins), np.zeros(n_bins), np.zeros(n_bins)
    for i in range(n):
        b = min(int(conf[i] * n_bins), n_bins - 1)
        count[b] += 1
        conf_sum[b] += conf[i]
        correct[b] += pred[i] == labels[i]
    gaps = [abs(correct[b] / count[b] - conf_sum[b] / count[b]) if count[b] else 0.0 for b in range(n_bins)]
    return {
        "accuracy": np.mean(pred == labels),
        "top5": top5,
        "confusion": confusion,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "nll": nll,
        "brier": brier,
        "ece": sum(g * count[b] / n for b, g in enumerate(gaps)),
        "mce": max(gaps),
        "count": count,
        "bin_accuracy": [correct[b] / count[b] if count[b] else None for b in range(n_bins)],
    }


def _check_against_reference(result: dict, ref: dict) -> None:
    assert result["accuracy"] == pytest.approx(ref["accuracy"], abs=1e-6)
    assert result["top5"] == pytest.approx(ref["top5"], abs=1e-6)
    assert result["confusion_matrix"] == ref["confusion"].tolist()
    for key in ("precision", "recall", "f1"):
        assert [row[key] for row in result["per_class"]] == pytest.approx(ref[key], abs=1e-6)
        assert result["macro"][key] == pytest.approx(np.mean(ref[key]), abs=1e-6)
    assert [row["support"] for row in result["per_class"]] == ref["confusion"].sum(1).tolist()
    assert result["nll"] == pytest.approx(ref["nll"], abs=1e-6)
    assert result["brier"] == pytest.approx(ref["brier"], abs=1e-6)
    assert result["ece"] == pytest.approx(ref["ece"], abs=1e-5)
    assert result["mce"] == pytest.approx(ref["mce"], abs=1e-5)
    assert result["reliability"]["count"] == ref["count"].astype(int).tolist()
    assert result["reliability"]["accuracy"] == pytest.approx(ref["bin_accuracy"], abs=1e-9)


def test_metrics_equal_their_definitions():
    logits, labels = _logits()
    metrics = ClassificationMetrics(10)
    for start in range(0, len(labels), 64):  # batch by batch, as in a test loop
        metrics.update(logits[start : start + 64], labels[start : start + 64])
    result = metrics.compute([f"c{k}" for k in range(10)])
    _check_against_reference(result, _reference(logits.double().numpy(), labels.numpy()))
    assert result["num_images"] == 600 and result["per_class"][3]["class"] == "c3"
    rows = np.array(result["confusion_matrix_normalized"])
    assert rows.sum(1) == pytest.approx(np.ones(10), abs=1e-5)
    reliability = result["reliability"]
    assert reliability["lower"][0] == 0 and reliability["upper"][-1] == 1 and len(reliability["count"]) == 15
    filled = [i for i, c in enumerate(reliability["count"]) if c]
    assert all(reliability["lower"][i] <= reliability["confidence"][i] <= reliability["upper"][i] for i in filled)


def test_a_confident_wrong_model_has_a_large_ece_and_a_perfect_one_none():
    labels = torch.arange(20) % 4
    perfect = torch.nn.functional.one_hot(labels, 4).float() * 50
    wrong = torch.nn.functional.one_hot((labels + 1) % 4, 4).float() * 50
    for logits, ece, accuracy in ((perfect, 0.0, 1.0), (wrong, 1.0, 0.0)):
        metrics = ClassificationMetrics(4)
        metrics.update(logits, labels)
        result = metrics.compute()
        assert result["ece"] == pytest.approx(ece, abs=1e-6) and result["accuracy"] == accuracy
        assert "top5" not in result  # fewer than 5 classes


def test_evaluation_files_and_table(tmp_path):
    logits, labels = _logits(200)
    metrics = ClassificationMetrics(10)
    metrics.update(logits, labels)
    names = [f"class {k}" for k in range(10)]
    result = {"command": "vit test", "date": "2026-12-05", "machine": "here", **metrics.compute(names)}
    written = write_evaluation(tmp_path, result, names)
    assert sorted(p.name for p in written) == sorted(
        ["evaluation.json", "confusion_matrix.png", "reliability.png", "evaluation.html"]
    )
    assert json.loads((tmp_path / "evaluation.json").read_text()) == json.loads(json.dumps(result))
    for png in ("confusion_matrix.png", "reliability.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "evaluation.html").read_text()
    assert page.count("<td>class ") == 10 and f"{result['ece']:.4f}" in page
    assert "test-time augmentation" not in page  # the accuracy of the images alone says nothing more
    write_evaluation(tmp_path, {**result, "test_time_augment": "flip_translate"}, names)
    assert "accuracy (test-time augmentation: flip_translate)" in (tmp_path / "evaluation.html").read_text()
    table = summary_table(result)
    assert f"accuracy {result['accuracy']:.4f}" in table and f"ECE {result['ece']:.4f}" in table
    assert len(table.splitlines()) == 3 + 10


def test_the_terminal_lists_the_classes_of_lowest_f1_when_there_are_many():
    logits, labels = _logits(2000, classes=30)
    metrics = ClassificationMetrics(30)
    metrics.update(logits, labels)
    result = metrics.compute()
    table = summary_table(result).splitlines()
    listed = [line.split()[0] for line in table[4:]]
    worst = [row["class"] for row in sorted(result["per_class"], key=lambda row: row["f1"])[:20]]
    assert "20 classes of lowest F1 of 30" in table[2] and listed == worst


def _rank(rank: int, world: int, port: int, logits: torch.Tensor, labels: torch.Tensor, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        metrics = ClassificationMetrics(10)
        cut = 347  # uneven shards: 347 and 253 images
        part = slice(0, cut) if rank == 0 else slice(cut, None)
        metrics.update(logits[part], labels[part])
        result = metrics.compute()
        if rank == 0:
            with open(out, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_processes_give_the_numbers_of_one(tmp_path):
    import socket

    import torch.multiprocessing as mp

    logits, labels = _logits()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "rank0.json"
    # fork: the children share the imported modules instead of importing torch again
    mp.start_processes(_rank, args=(2, port, logits, labels, str(out)), nprocs=2, join=True, start_method="fork")
    both = json.loads(out.read_text())
    one = ClassificationMetrics(10)
    one.update(logits, labels)
    alone = one.compute()
    assert both["num_images"] == 600
    assert both["confusion_matrix"] == alone["confusion_matrix"]
    assert both["reliability"]["count"] == alone["reliability"]["count"]
    for key in ("accuracy", "top5", "nll", "brier", "ece", "mce"):
        assert both[key] == pytest.approx(alone[key], abs=1e-6), key
    for key in ("precision", "recall", "f1", "support"):
        assert [r[key] for r in both["per_class"]] == pytest.approx([r[key] for r in alone["per_class"]], abs=1e-6)


@pytest.mark.slow
def test_vit_test_writes_the_evaluation(tmp_path, trained_checkpoint, digits_test_args):
    from vit.cli import cli_main

    cli = cli_main(digits_test_args(trained_checkpoint, tmp_path))
    result = json.loads((tmp_path / "evaluation.json").read_text())
    logged = cli.trainer.callback_metrics
    assert result["accuracy"] == pytest.approx(float(logged["test/acc"]), abs=1e-6)
    assert result["nll"] == pytest.approx(float(logged["test/loss"]), abs=1e-5)
    assert result["num_images"] == 360 and sum(map(sum, result["confusion_matrix"])) == 360
    # the process's own command line (under pytest-xdist a worker's argv is empty: then "vit" alone)
    assert result["command"] == shlex.join(["vit", *sys.argv[1:]]) and result["checkpoint"] == str(trained_checkpoint)
    assert result["temperature"] is None and result["per_class"][0]["class"] == "0"
    assert {"confusion_matrix.png", "reliability.png", "evaluation.html"} <= {p.name for p in tmp_path.iterdir()}
