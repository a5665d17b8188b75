"""Compare W&B runs: a table of the settings that differ, best val/acc, final loss and throughput, and a plot.

    python scripts/compare.py wandb/                              # every offline run under a folder
    python scripts/compare.py wandb/offline-run-A wandb/offline-run-B
    python scripts/compare.py --project ENTITY/PROJECT [--group quickstart] [--last 10]   # online, W&B API

Offline runs (``wandb/offline-run-*/run-*.wandb``) are read back with wandb's own tool, ``wandb leet inspect``
(its ``--summary --json`` state for config and summary, its ``--json`` records for the history), so nothing needs
a network. Settings are compared key by key in the nested run config that ``scripts/fit.py`` logs (``model.lr``,
``data.dataset``, ``trainer.max_epochs``, ...); only the keys whose values differ between the runs are shown. The
plot (``--plot``, default ``val_acc.png``) draws every run's validation-accuracy curve against the epoch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IGNORED_PREFIXES = ("_wandb", "trainer.logger", "config", "trainer.default_root_dir", "checkpoint.dirpath")
"""Config keys never compared: W&B's own, the logger's settings (run name, save folder), the config file paths and
where outputs were written."""


class InputError(Exception):
    """Bad input: a message for the user, exit status 2."""


@dataclass
class Run:
    """One run as read back: flat dotted config, final summary, and the history rows that hold a metric."""

    name: str
    source: str
    group: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"lr": 1}}`` -> ``{"model.lr": 1}``; W&B's ``{"value": x}`` wrappers are unwrapped."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and set(value) == {"value"}:
            value = value["value"]
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


# ------------------------------------------------------------------------------------------------ offline runs
def find_run_files(paths: Iterable[str]) -> list[Path]:
    """The ``run-*.wandb`` files of the given run folders, ``.wandb`` files, or folders holding runs (recursively).

    Raises:
        InputError: For a path that does not exist, or that holds no run.
    """
    files: dict[Path, None] = {}
    for item in paths:
        path = Path(item)
        if not path.exists():
            raise InputError(f"{path} does not exist; pass W&B run folders (wandb/offline-run-*) or a folder with runs")
        if path.is_file():
            if path.suffix != ".wandb":
                raise InputError(
                    f"{path} is not a W&B run: expected a run-*.wandb file or a wandb/offline-run-* folder"
                )
            found = [path]
        else:
            found = sorted(p for p in path.rglob("run-*.wandb") if p.is_file())
            if not found:
                raise InputError(
                    f"{path} is not a W&B run and holds none: expected wandb/offline-run-*/run-*.wandb under it"
                )
        for file in found:
            files.setdefault(file.resolve(), None)  # wandb/latest-run is a link to one of the others
    return list(files)


def _wandb_cli() -> list[str]:
    return [sys.executable, "-m", "wandb"]


def _inspect(file: Path, *flags: str) -> str:
    env = {**os.environ, "WANDB_SILENT": "true"}
    result = subprocess.run(
        [*_wandb_cli(), "leet", "inspect", *flags, str(file)], capture_output=True, text=True, env=env, timeout=300
    )
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        if any("No such command" in line for line in detail):
            raise InputError("reading offline runs needs `wandb leet inspect` (wandb >= 0.31): pip install -U wandb")
        raise InputError(f"cannot read W&B run {file}: {detail[-1] if detail else f'exit status {result.returncode}'}")
    return result.stdout


def read_offline_run(file: Path) -> Run:
    """Read an offline run back with ``wandb leet inspect`` (state as JSON, then the records for the history)."""
    with ThreadPoolExecutor(2) as pool:
        state_job = pool.submit(_inspect, file, "--summary", "--json")
        records_job = pool.submit(_inspect, file, "--json")
        state_text, records_text = state_job.result(), records_job.result()
    try:
        state = json.loads(state_text)
        records = [json.loads(line) for line in records_text.splitlines() if line.strip()]
    except json.JSONDecodeError as err:
        raise InputError(f"cannot read W&B run {file}: wandb leet printed no JSON ({err})") from None
    group = ""
    history = []
    for record in records:
        if record.get("type") == "run":
            group = record["run"].get("run_group", "")
        elif record.get("type") == "history":
            history.append(record["history"].get("item", {}))
    name = state.get("name") or state.get("run_id") or file.parent.name
    return Run(name, str(file.parent), group, flatten(state.get("config") or {}), state.get("summary") or {}, history)


# ------------------------------------------------------------------------------------------------- online runs
def read_online_runs(project: str, group: str | None, last: int | None, metric: str) -> list[Run]:
    """Runs of ``ENTITY/PROJECT`` through ``wandb.Api()`` (needs a login and a network)."""
    import wandb

    runs = []
    try:
        api = wandb.Api(timeout=30)
        filters = {"group": group} if group else None
        for run in api.runs(project, filters=filters, order="-created_at", per_page=min(last or 50, 200)):
            history = [*run.scan_history(keys=[metric, "epoch"]), *run.scan_history(keys=["train/loss_epoch", "epoch"])]
            config, summary = flatten(dict(run.config)), dict(run.summary_metrics)
            runs.append(Run(run.name, run.url, run.group or "", config, summary, history))
            if last and len(runs) >= last:
                break
    except Exception as err:  # no login, no network, no such project
        raise InputError(f"cannot read W&B project {project}: {type(err).__name__}: {err}") from None
    if not runs:
        raise InputError(f"no runs in W&B project {project}" + (f" with group {group!r}" if group else ""))
    return runs


# ------------------------------------------------------------------------------------------------ comparison
def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def series(run: Run, metric: str) -> tuple[list[float], list[float]]:
    """``(x, y)`` of a metric over the run: x is the epoch (else the global step, else W&B's step)."""
    xs, ys = [], []
    for index, row in enumerate(run.history):
        y = _number(row.get(metric))
        if y is None:
            continue
        for key in ("epoch", "trainer/global_step", "_step"):
            x = _number(row.get(key))
            if x is not None:
                break
        else:
            x = float(index)
        xs.append(x)
        ys.append(y)
    return xs, ys


def best(run: Run, metric: str) -> float | None:
    """Highest value of ``metric`` in the history, else the summary's (``{"max": v}`` with a defined summary)."""
    _, ys = series(run, metric)
    if ys:
        return max(ys)
    value = run.summary.get(metric)
    if isinstance(value, Mapping):
        value = value.get("max", value.get("last"))
    return _number(value)


def last(run: Run, metrics: Iterable[str]) -> float | None:
    """Last logged value of the first of ``metrics`` the run has (history, then summary)."""
    for metric in metrics:
        _, ys = series(run, metric)
        if ys:
            return ys[-1]
        value = _number(run.summary.get(metric))
        if value is not None:
            return value
    return None


def throughput(run: Run) -> float | None:
    """Training images/s: ``train/throughput`` of the run summary, else the mean of ``train/img_per_sec``."""
    value = _number(run.summary.get("train/throughput"))
    if value is not None:
        return value
    _, ys = series(run, "train/img_per_sec")
    return sum(ys) / len(ys) if ys else _number(run.summary.get("train/img_per_sec"))


def differing_keys(runs: list[Run]) -> list[str]:
    """Config keys whose values are not the same in every run (a key missing from some runs differs)."""
    keys = sorted({key for run in runs for key in run.config if not key.startswith(IGNORED_PREFIXES)})
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


def table(runs: list[Run], metric: str) -> str:
    """Aligned text table: run name, the differing config keys, best ``metric``, final loss, throughput."""
    keys = differing_keys(runs)
    header = ["run", *keys, f"best {metric}", "final train/loss", "img/s"]
    rows = [
        [
            run.name,
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


def plot(runs: list[Run], metric: str, path: Path) -> bool:
    """Draw every run's ``metric`` against the epoch into a PNG; False when no run logged it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(7, 4.5), dpi=100)
    ax = figure.add_subplot()
    drawn = 0
    for run in runs:
        xs, ys = series(run, metric)
        if ys:
            ax.plot(xs, ys, marker="o", markersize=3, label=run.name)
            drawn += 1
    if not drawn:
        return False
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} of {drawn} run(s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure).print_png(str(path))
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("runs", nargs="*", help="offline run folders, run-*.wandb files, or folders holding runs")
    parser.add_argument("--project", help="compare the runs of this online W&B project (ENTITY/PROJECT) instead")
    parser.add_argument("--group", help="with --project: only runs of this group (config name)")
    parser.add_argument("--last", type=int, default=None, help="with --project: only the N most recent runs")
    parser.add_argument("--metric", default="val/acc", help="metric to rank and plot (default: val/acc)")
    parser.add_argument("--plot", type=Path, default=Path("val_acc.png"), help="PNG to write (default: val_acc.png)")
    args = parser.parse_args(argv)
    try:
        if args.project and args.runs:
            raise InputError("give either run folders or --project, not both")
        if args.project:
            runs = read_online_runs(args.project, args.group, args.last, args.metric)
        elif args.runs:
            files = find_run_files(args.runs)
            with ThreadPoolExecutor(min(4, len(files))) as pool:
                runs = list(pool.map(read_offline_run, files))
        else:
            raise InputError("nothing to compare: pass offline run folders (e.g. wandb/) or --project ENTITY/PROJECT")
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table(runs, args.metric))
    if plot(runs, args.metric, args.plot):
        print(f"\nwrote {args.plot}")
    else:
        print(f"\nno run logged {args.metric}: no plot written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
