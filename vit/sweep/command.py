"""``vit sweep``: parse the options, check the sweep file, start the workers, show progress, report (see
:mod:`vit.sweep`). Only the standard library and the sweep file reader are imported before the options are checked."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from vit.errors import ArgumentParser, UsageError

from .budget import BUDGET_KEYS, rung_budgets
from .spec import Sweep, parse_sweep, read_sweep


def build_parser(prog: str = "vit sweep") -> argparse.ArgumentParser:
    """The options of ``vit sweep``; the package docstring is its help text."""
    import vit.sweep

    doc = vit.sweep.__doc__ or ""
    parser = ArgumentParser(
        prog=prog,
        usage=f"{prog} FILE [options] [-- VIT FIT ARGUMENTS]",
        doc=doc,
    )
    parser.add_argument("file", type=Path, help="a W&B sweep file (configs/sweeps/*.yaml)")
    parser.add_argument("--budget", help="time of every trial (5m), or of each rung of successive halving (5m,15m,45m)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes on this machine (default 1)")
    parser.add_argument("--storage", help="an SQLAlchemy URL (postgresql://...) for workers on many machines")
    parser.add_argument(
        "--name",
        help="the sweep's name: its folder, Optuna study and W&B group (default: the file's name, else its stem)",
    )
    parser.add_argument("--out", type=Path, help="the sweep folder (default runs/sweeps/<name>)")
    parser.add_argument("--trials", type=int, help="configurations of rung 0 (default: run_cap, or the whole grid)")
    parser.add_argument("--eta", type=int, help="keep the best 1/eta of a rung (default: early_terminate's eta, or 3)")
    parser.add_argument(
        "--max_retry",
        type=int,
        default=2,
        help="runs again of a trial whose worker died (default 2; an interrupted one: always)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    parser.add_argument("--heartbeat", type=int, default=30, help="seconds between heartbeats (--storage only)")
    parser.add_argument(
        "--baseline", action="store_true", help="the first trial runs the command's own config, as the sweep's baseline"
    )
    parser.add_argument(
        "--report", action="store_true", help="print the table and write best.yaml and the figures only"
    )
    return parser


def rung_zero_size(sweep: Sweep, trials: int | None) -> int:
    """Configurations of rung 0: ``--trials``, else ``run_cap``; a grid has at most its combinations.

    Raises:
        UsageError: For a random or Bayesian sweep with neither (W&B would run it forever).
    """
    count = trials or sweep.run_cap
    if sweep.method == "grid":
        combinations = math.prod(len(p.grid()) for p in sweep.searched)
        return min(count or combinations, combinations)
    if not count:
        raise UsageError(f"{sweep.source}: run_cap: method {sweep.method} needs run_cap in the file, or --trials N")
    return count


def check(args: argparse.Namespace, sweep: Sweep) -> list[float]:
    """The rung budgets, after the checks that need no study."""
    for option in ("workers", "trials", "max_retry", "heartbeat"):
        value = getattr(args, option)
        if value is not None and value < (0 if option == "max_retry" else 1):
            raise UsageError(f"--{option} {value}: must be at least {0 if option == 'max_retry' else 1}")
    if args.eta is not None and args.eta < 2:
        raise UsageError(f"--eta {args.eta}: the halving factor must be at least 2")
    budgets = rung_budgets(args.budget, args.eta or sweep.eta or 3, sweep.rungs)
    if sweep.eta is not None and not budgets:  # early_terminate: hyperband was asked for
        raise UsageError(f"{sweep.source}: early_terminate: hyperband needs --budget (the first rung's time, e.g. 5m)")
    if budgets:
        for p in sweep.parameters:
            if p.name in BUDGET_KEYS:
                raise UsageError(f"{sweep.source}: parameters.{p.name}: --budget sets it for every trial; remove one")
    return budgets


def main(argv: Sequence[str] | None = None, prog: str = "vit sweep") -> int:
    """The command line; returns the exit status (2 for bad input, with one ``error:`` line)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = build_parser(prog).parse_args(argv[: len(argv) - len(extra) - (1 if "--" in argv else 0)])
    sweep = read_sweep(args.file)
    if args.name:  # in the file's keys, so that the study's record and the workers have it
        sweep = parse_sweep({**sweep.raw, "name": args.name}, sweep.source)
    budgets = check(args, sweep)
    count = rung_zero_size(sweep, args.trials)
    folder = args.out or Path("runs", "sweeps", sweep.name)
    baseline = None
    if not args.report:  # every parameter and value against the config, before anything is created
        from .check import baseline_params, check_against_config

        check_against_config(sweep, [*sweep.fit_args, *extra], budgets[0] if budgets else None)
        if args.baseline:
            baseline = baseline_params(sweep, [*sweep.fit_args, *extra], budgets[0] if budgets else None)
    from .driver import Sweeper

    plan_args = {"budgets": budgets, "count": count, "eta": args.eta or sweep.eta or 3, "seed": args.seed,
                 "baseline": baseline}  # fmt: skip
    sweeper = Sweeper(sweep, plan_args, [*sweep.fit_args, *extra], folder, args.storage, args.max_retry,
                      args.heartbeat)  # fmt: skip
    if args.report:
        return sweeper.report()
    return sweeper.run(args.workers)
