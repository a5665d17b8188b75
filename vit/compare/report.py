"""What a comparison shows: metric curves, best and final values, throughput, the attention used, a table, a plot."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, get_args

from vit.compare.runs import X_AXES, Run, number
from vit.runs import AttentionKind, attention_of
from vit.text import plural

IGNORED_PREFIXES = ("_wandb", "trainer.logger", "config", "trainer.default_root_dir", "checkpoint.dirpath")
"""Config keys never compared: W&B's own, the logger's settings (run name, save folder), the config file paths and
where outputs were written."""
FILE_SUFFIXES = ("_path", "_dir", "dirpath")
"""Settings that only name where files are (``ckpt_path``, ``runs_dir``, ``data.data_dir``): a resumed run's
``ckpt_path`` or another copy of the same data set is no difference between two runs, and a path fills a column."""

ATTENTION_KINDS = get_args(AttentionKind)


def series(run: Run, metric: str, x_axis: str = "epoch") -> tuple[list[float], list[float]]:
    """``(x, y)`` of a metric over the run.

    With ``x_axis="epoch"`` x is the epoch (else the global step, else W&B's step); a point logged again at the same
    x (a resumed run repeating the epoch it was stopped in) keeps the later value. With ``"minutes"`` x is W&B's
    ``_runtime`` in minutes (:func:`~vit.compare.runs.merge_resumed` continues it across the parts of a resumed run).
    """
    if x_axis not in X_AXES:
        raise ValueError(f"x_axis must be one of {sorted(X_AXES)}, got {x_axis!r}")
    points: dict[float, float] = {}
    for index, row in enumerate(run.history):
        y = number(row.get(metric))
        if y is None:
            continue
        if x_axis == "minutes":
            runtime = number(row.get("_runtime"))
            if runtime is None:
                continue
            x = runtime / 60
        else:
            for key in ("epoch", "trainer/global_step", "_step"):
                x = number(row.get(key))
                if x is not None:
                    break
            else:
                x = float(index)
        points.pop(x, None)  # re-insert: the later value and the later position
        points[x] = y
    return list(points), list(points.values())


def best(run: Run, metric: str) -> float | None:
    """Highest value of ``metric`` in the history, else the summary's (``{"max": v}`` with a defined summary)."""
    _, ys = series(run, metric)
    if ys:
        return max(ys)
    value = run.summary.get(metric)
    if isinstance(value, Mapping):
        value = value.get("max", value.get("last"))
    return number(value)


def last(run: Run, metrics: Iterable[str]) -> float | None:
    """Last logged value of the first of ``metrics`` the run has (history, then summary)."""
    for metric in metrics:
        _, ys = series(run, metric)
        if ys:
            return ys[-1]
        value = number(run.summary.get(metric))
        if value is not None:
            return value
    return None


def throughput(run: Run) -> float | None:
    """Training images/s over the fit: the summary's ``train/img_per_sec`` (``vit fit`` writes its mean over the fit
    there), the older ``train/throughput``, else the mean of the logged ``train/img_per_sec``."""
    for key in ("train/img_per_sec", "train/throughput"):
        value = number(run.summary.get(key))
        if value is not None:
            return value
    _, ys = series(run, "train/img_per_sec")
    return sum(ys) / len(ys) if ys else None


def attention(run: Run) -> str | None:
    """The attention the run's model used: ``linear``, ``global`` (``window_size`` 0), ``window`` (block) or
    ``sliding``.

    From the run's tags (``vit fit`` tags each run with it), else from the config: ``model.model_overrides`` over the
    preset named by ``model.model`` (read with ``vit.models.model_config``); ``None`` when neither says.
    """
    for tag in run.tags:
        if tag in ATTENTION_KINDS:
            return tag
    overrides = {
        key.removeprefix("model.model_overrides."): value
        for key, value in run.config.items()
        if key.startswith("model.model_overrides.")
    }
    settings = dict(overrides)
    if not {"window_size", "linear_attention"} <= settings.keys() and isinstance(run.config.get("model.model"), str):
        try:
            from vit.models import model_config

            settings = {**model_config(run.config["model.model"]), **overrides}
        except (ImportError, ValueError, TypeError):
            return None
    if "window_size" not in settings and not settings.get("linear_attention"):
        return None
    return attention_of(settings)


def differing_keys(runs: list[Run]) -> list[str]:
    """Config keys whose values are not the same in every run (a key missing from some runs differs), less those
    never compared (:data:`IGNORED_PREFIXES`) and those that only name files (:data:`FILE_SUFFIXES`)."""
    keys = sorted(
        key
        for key in {key for run in runs for key in run.config}
        if not key.startswith(IGNORED_PREFIXES) and not key.rsplit(".", 1)[-1].endswith(FILE_SUFFIXES)
    )
    missing = object()
    return [
        key
        for key in keys
        if len({json.dumps(run.config.get(key, missing), sort_keys=True, default=repr) for run in runs}) > 1
    ]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def table(runs: list[Run], metric: str, status: bool = False) -> str:
    """Aligned text table: run name, attention, the differing config keys, the best ``metric`` (``val/acc (best)``),
    the last training loss (``train/loss (last)``), throughput.

    Args:
        runs: The runs, one row each.
        metric: The metric whose best value is shown.
        status: Also show each run's job type and state (for ``--all``).
    """
    keys = differing_keys(runs)
    extra = ["job", "state"] if status else []
    header = ["run", "attention", *extra, *keys, f"{metric} (best)", "train/loss (last)", "img/s"]
    rows = [
        [
            run.name,
            _cell(attention(run)),
            *([run.kind or ("fit" if run.is_fit() else "-"), run.state] if status else []),
            *(_cell(run.config.get(key)) for key in keys),
            _cell(best(run, metric)),
            _cell(last(run, ["train/loss_epoch", "train/loss"])),
            _cell(throughput(run)),
        ]
        for run in runs
    ]
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)) for line in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def plot(runs: list[Run], metric: str, path: Path, x_axis: str = "epoch") -> bool:
    """Draw every run's ``metric`` against the epoch (or the minutes of run time, ``x_axis="minutes"``) into a PNG
    (legend: name and attention); False when none has it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(7, 4.5), dpi=100)
    ax = figure.add_subplot()
    drawn = 0
    for run in runs:
        xs, ys = series(run, metric, x_axis)
        if ys:
            kind = attention(run)
            ax.plot(xs, ys, marker="o", markersize=3, label=f"{run.name} ({kind})" if kind else run.name)
            drawn += 1
    if not drawn:
        return False
    if x_axis == "epoch":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(X_AXES[x_axis])
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} of {plural(drawn, 'run')}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure).print_png(str(path))
    return True


def default_plot(metric: str, x_axis: str = "epoch", when: datetime | None = None) -> Path:
    """``runs/compare/<metric>-<MMDD-HHMMSS>.png`` (``val/acc`` -> ``val_acc``; ``val_acc_minutes-...`` against
    time): a new file per comparison, beside the runs and never in the repository root."""
    suffix = "" if x_axis == "epoch" else f"_{x_axis}"
    return Path("runs") / "compare" / f"{metric.replace('/', '_')}{suffix}-{when or datetime.now():%m%d-%H%M%S}.png"
