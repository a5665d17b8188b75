"""Compare W&B runs: a table of the settings that differ, best val/acc, final loss and throughput, and a plot.

    vit compare runs/                                 # every fit run under a folder (offline)
    vit compare runs/quickstart/RUN_A runs/quickstart/RUN_B
    vit compare runs/ --all                           # also validate/predict runs and crashed ones
    vit compare --project ENTITY/PROJECT [--group quickstart] [--last 10]   # online, W&B API

Offline runs (``wandb/offline-run-*/run-*.wandb``) are read back with wandb's own tool, ``wandb leet inspect``, so
nothing needs a network. Only fit runs that finished are compared unless ``--all`` is given; the parts of a resumed run
(the same W&B run id, or the same run folder ``runs/<config>/<run name>/``) count as one run. Settings are compared key
by key in the nested run config that ``vit fit`` logs (``model.lr``, ``data.dataset``, ...); only the keys whose
values differ between the runs are shown, beside the attention each run used (``global``, ``window``, ``sliding``).
The plot (``--plot``, default ``runs/compare/<metric>.png``) draws every run's curve of the metric against the epoch, or
with ``--x minutes`` against the minutes of run time (``runs/compare/<metric>_minutes.png``).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from vit.compare.report import X_AXES, attention, best, differing_keys, last, plot, series, table, throughput
from vit.compare.runs import Run, find_run_files, merge_resumed, read_offline_runs, read_online_runs
from vit.errors import ArgumentParser, InputError, fail

__all__ = [
    "X_AXES",
    "InputError",
    "Run",
    "attention",
    "best",
    "differing_keys",
    "find_run_files",
    "last",
    "main",
    "merge_resumed",
    "plot",
    "read_offline_runs",
    "read_online_runs",
    "select",
    "series",
    "table",
    "throughput",
]


def select(runs: list[Run], everything: bool = False) -> tuple[list[Run], str | None]:
    """The runs to compare (finished fit runs, or all with ``everything``) and a note on what was left out."""
    if everything:
        return runs, None
    kept, left = [], Counter()
    for run in runs:
        if not run.is_fit():
            left[f"{run.kind or 'non-fit'}"] += 1
        elif run.state != "finished":
            left[run.state] += 1
        else:
            kept.append(run)
    if not left:
        return kept, None
    what = ", ".join(f"{count} {reason}" for reason, count in sorted(left.items()))
    return kept, f"left out {sum(left.values())} run(s): {what}; --all shows them"


def default_plot(metric: str, x_axis: str = "epoch") -> Path:
    """``runs/compare/<metric>.png`` (``val/acc`` -> ``val_acc``; ``val_acc_minutes.png`` against time), beside the
    runs and never in the repository root."""
    suffix = "" if x_axis == "epoch" else f"_{x_axis}"
    return Path("runs") / "compare" / f"{metric.replace('/', '_')}{suffix}.png"


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (2 for bad input, with one ``error:`` line)."""
    parser = ArgumentParser(
        prog="vit compare",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("runs", nargs="*", help="offline run folders, run-*.wandb files, or folders holding runs")
    parser.add_argument("--project", help="compare the runs of this online W&B project (ENTITY/PROJECT) instead")
    parser.add_argument("--group", help="with --project: only runs of this group (config name)")
    parser.add_argument("--last", type=int, default=None, help="with --project: only the N most recent runs")
    parser.add_argument("--metric", default="val/acc", help="metric to rank and plot (default: val/acc)")
    parser.add_argument("--all", action="store_true", help="also validate/test/predict runs and unfinished runs")
    parser.add_argument(
        "--plot", type=Path, default=None, help="PNG to write (default: runs/compare/<metric>[_minutes].png)"
    )
    parser.add_argument(
        "--x", dest="x_axis", choices=sorted(X_AXES), default="epoch", help="plot against the epoch or the minutes"
    )
    args = parser.parse_args(argv)
    try:
        if args.project and args.runs:
            raise InputError("give either run folders or --project, not both")
        if args.project:
            runs = read_online_runs(args.project, args.group, args.last, args.metric)
        elif args.runs:
            runs = read_offline_runs(args.runs)
        else:
            raise InputError("nothing to compare: pass offline run folders (e.g. runs/) or --project ENTITY/PROJECT")
        runs, note = select(runs, args.all)
        if not runs:
            raise InputError(f"no finished fit run to compare ({(note or '').removeprefix('left out ')})")
    except InputError as err:
        fail(err)
    print(table(runs, args.metric, status=args.all))
    if note:
        print(note, file=sys.stderr)
    path = args.plot or default_plot(args.metric, args.x_axis)
    if plot(runs, args.metric, path, args.x_axis):
        print(f"\nwrote {path}")
    else:
        print(f"\nno run logged {args.metric}: no plot written", file=sys.stderr)
    return 0
