"""vit explain's estimate: the first images timed through the same call, scaled to all, said before the run."""

from __future__ import annotations

import torch

from vit.explain import estimate


def test_the_first_batch_is_timed_and_scaled_to_every_image(monkeypatch, capsys):
    calls = []

    def explain(model, pixels, methods, labels=None, show_progress=True, steps=16):
        calls.append((len(pixels), None if labels is None else labels.tolist(), show_progress, steps))
        return len(pixels)

    clock = iter([100.0, 103.0])  # the first 4 images take 3 s
    monkeypatch.setattr(estimate.time, "perf_counter", lambda: next(clock))
    call = estimate.estimated(explain, "--faithfulness, --heads", probe=4)
    assert call("model", torch.zeros(90, 3), ["attnlrp"], labels=torch.arange(90), show_progress=True, steps=8) == 90
    assert calls == [(4, [0, 1, 2, 3], False, 8), (90, list(range(90)), True, 8)]
    assert capsys.readouterr().err == (
        "estimate: about 1 min 8 s for --faithfulness, --heads on 90 images (the first 4 took 3.0 s, at this load; "
        "overlays and report after); --limit N for fewer\n"
    )  # 3 s / 4 images x 90 = 67.5 s


def test_short_runs_and_runs_without_long_options_are_not_estimated(capsys):
    calls = []

    def explain(model, pixels, methods, **kwargs):
        calls.append(len(pixels))

    estimate.estimated(explain, "--sanity", probe=4)(None, torch.zeros(7, 3), [])
    estimate.estimated(explain, "", probe=4)(None, torch.zeros(90, 3), [])
    assert calls == [7, 90] and capsys.readouterr().err == ""


def test_durations_read_as_a_person_would_say_them():
    assert [estimate.duration(s) for s in (0.4, 59.5, 61, 3599, 3600, 3725)] == [
        "0 s", "1 min 0 s", "1 min 1 s", "59 min 59 s", "1 h 0 min", "1 h 2 min",
    ]  # fmt: skip
