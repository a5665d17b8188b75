"""What the commands print names what it is: the page a person opens after a fit, how a fit ended (recorded for
``vit compare``), counts in words (``1 image``, never ``1 images``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from lightning.pytorch.trainer.states import TrainerFn

from vit.callbacks import run_summary
from vit.text import plural


@pytest.mark.parametrize(
    ("count", "noun", "many", "text"),
    [(1, "image", None, "1 image"), (0, "image", None, "0 images"), (3, "configuration", None, "3 configurations"),
     (1, "class", "classes", "1 class"), (2, "class", "classes", "2 classes"), (1437, "image", None, "1,437 images")],
)  # fmt: skip
def test_plural(count, noun, many, text):
    assert plural(count, noun, many) == text


def test_a_sweep_of_one_configuration_says_so():
    import optuna

    from vit.sweep.halving import Plan, open_sweep
    from vit.sweep.report import Row, summary
    from vit.sweep.space import sampler, suggest
    from vit.sweep.spec import parse_sweep

    raw = {"program": "scripts/fit.py", "method": "random", "metric": {"name": "val/acc", "goal": "maximize"},
           "parameters": {"model.lr": {"values": [0.001, 0.002]}}}  # fmt: skip
    sweep = parse_sweep(raw)
    plan = Plan(sweep, [], 3, 3, [], 0, raw)
    study, _ = open_sweep(optuna.storages.InMemoryStorage(), plan, sampler(sweep, 0))
    trial = study.ask()
    suggest(trial, sweep)
    study.tell(trial, 0.5)
    line = summary([Row(0, t) for t in study.trials], plan)
    assert line.startswith("1 of 3 configurations, 1 trial: 1 done")  # "1 trial", and how many were planned
    assert line.endswith("; best val/acc (last) 0.5000 (rung 0, trial 0)")  # the trial's value: its fit's last


def test_the_end_of_a_fit_names_the_newest_explorer_page(tmp_path):
    folder = tmp_path / "rollout"
    folder.mkdir()
    for name in (
        "attnlrp_epoch_000.png",
        "distance_epoch_001.png",
        "explorer_epoch_000.html",
        "explorer_epoch_001.html",
    ):
        (folder / name).write_text("x")
    (line,) = run_summary.explanation_lines(folder)
    page = folder / "explorer_epoch_001.html"
    assert line == f"explanations: {page}  (open in a browser; each epoch's maps as PNGs beside it)"
    (folder / "explorer_epoch_000.html").unlink()
    (folder / "explorer_epoch_001.html").unlink()  # explorer: false in the callback: the maps alone
    assert run_summary.explanation_lines(folder) == [f"explanation maps (PNGs of each epoch): {folder}"]
    assert run_summary.explanation_lines(tmp_path / "none") == []


@pytest.mark.parametrize(
    ("exception", "status"),
    [(KeyboardInterrupt(), "interrupted"), (SystemExit(143), "interrupted"), (RuntimeError("bug"), "failed")],
)
def test_a_fit_records_how_it_ended_for_vit_compare(monkeypatch, exception, status):
    written = []
    monkeypatch.setattr(run_summary, "log_summary", lambda trainer, values: written.append(dict(values)))
    trainer = SimpleNamespace(is_global_zero=True, state=SimpleNamespace(fn=TrainerFn.FITTING))
    callback = run_summary.RunSummary(flops=False)
    callback.on_exception(trainer, None, exception)
    assert written == [{"run/status": status}]
