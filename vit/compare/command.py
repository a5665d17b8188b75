"""``vit compare``: parse the options, read the runs, print the table and write the plot (see :mod:`vit.compare`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from vit.compare.runs import X_AXES, read_offline_runs, read_online_runs, select
from vit.errors import ArgumentParser, InputError, fail


def build_parser(prog: str = "vit compare") -> argparse.ArgumentParser:
    """The options of ``vit compare``; the package docstring is its help text."""
    import vit.compare

    doc = vit.compare.__doc__ or ""
    parser = ArgumentParser(
        prog=prog,
        doc=doc,
    )
    parser.add_argument("runs", nargs="*", help="offline run folders, run-*.wandb files, or folders holding runs")
    parser.add_argument("--project", help="compare the runs of this online W&B project (ENTITY/PROJECT) instead")
    parser.add_argument("--group", help="with --project: only runs of this group (config name)")
    parser.add_argument("--last", type=int, default=None, help="with --project: only the N most recent runs")
    parser.add_argument("--metric", default="val/acc", help="metric to rank and plot (default: val/acc)")
    parser.add_argument("--all", action="store_true", help="also validate/test/predict runs and unfinished runs")
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="PNG to write (default: runs/compare/<metric>[_minutes]-<MMDD-HHMMSS>.png, a new one each time)",
    )
    parser.add_argument(
        "--x", dest="x_axis", choices=sorted(X_AXES), default="epoch", help="plot against the epoch or the minutes"
    )
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "vit compare") -> int:
    """The command line; returns the exit status (2 for bad input, with one ``error:`` line)."""
    args = build_parser(prog).parse_args(argv)
    sweeps = _sweep_reports(args.runs)
    try:
        if args.project and args.runs:
            raise InputError("give either run folders or --project, not both")
        if args.project:
            runs = read_online_runs(args.project, group=args.group, last=args.last, metric=args.metric)
        elif sweeps and not any(next(Path(p).rglob("run-*.wandb"), None) for p in args.runs):
            return 0  # sweep folders whose trials logged to no W&B run: their tables are the comparison
        elif args.runs:
            runs = read_offline_runs(args.runs)
        else:
            raise InputError("nothing to compare: pass offline run folders (e.g. runs/) or --project ENTITY/PROJECT")
        runs, note = select(runs, everything=args.all)
        if not runs:
            raise InputError(f"no finished fit run to compare ({(note or '').removeprefix('left out ')})")
    except InputError as err:
        fail(err)
    from vit.compare.report import default_plot, plot, table

    print(table(runs, args.metric, status=args.all))
    if note:
        print(note, file=sys.stderr)
    path = args.plot or default_plot(args.metric, x_axis=args.x_axis)
    if plot(runs, args.metric, path, x_axis=args.x_axis):
        print(f"\nwrote {path}")
    else:
        print(f"\nno run logged {args.metric}: no plot written", file=sys.stderr)
    return 0


def _sweep_reports(paths: Sequence[str]) -> list[str]:
    """The hook for ``vit sweep`` folders among ``paths``: print each one's table of trials
    (:func:`vit.sweep.report.folder_report`) before their runs are compared; returns the tables printed."""
    reports = []
    for path in paths:
        if Path(path, "plan.json").is_file():  # only then is vit.sweep (and Optuna) imported
            from vit.sweep.report import folder_report

            reports.append(folder_report(path))
            print(reports[-1] + "\n")
    return reports
