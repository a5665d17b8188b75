"""What vit explain prints per image: with --split val the true class, a mark on each mistake and the accuracy."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from vit.explain.console import prediction_lines


def explanation(preds, labels):
    names = ["zero", "one", "two"]
    probs = torch.full((len(preds), 3), 0.1)
    probs[torch.arange(len(preds)), torch.tensor(preds)] = 0.8
    labels = None if labels is None else torch.tensor(labels)
    return SimpleNamespace(preds=torch.tensor(preds), probs=probs, labels=labels, class_name=lambda i: names[i])


def test_split_val_lines_say_the_true_class_mark_mistakes_and_end_with_the_accuracy():
    lines = prediction_lines(explanation([0, 2, 1, 1], [0, 1, 1, -1]), ["val/0", "val/1", "val/2", "val/3"])
    assert lines == [
        "val/0  zero  0.800  true zero",
        "val/1  two   0.800  true one  <- wrong",
        "val/2  one   0.800  true one",
        "val/3  one   0.800",  # -1: the true class is unknown
        "accuracy 66.7%: 1 of 3 images wrong",
    ]


def test_image_files_without_labels_get_the_prediction_alone():
    lines = prediction_lines(explanation([2, 0], None), ["a.png", "digits/b.png"])
    assert lines == ["a.png         two   0.800", "digits/b.png  zero  0.800"]
