"""``vit calibrate --ckpt_path CKPT [--out FILE]``: fit a checkpoint's temperature (Guo et al. 2017) on half of its
validation split and write a calibrated copy; the checkpoint itself is never changed.

The temperature is fitted by NLL with L-BFGS on half of the run's validation split (every other image) and reported
on the other half (:func:`vit.evaluation.calibration.calibrate_checkpoint`). ``CKPT`` (or the first positional
argument) is a ``.ckpt``, a run folder, or ``last`` / ``best`` of the newest run of ``--config``, as in every
subcommand (:mod:`vit.checkpoints.naming`); it is never changed: the copy,
``<name>-calibrated.ckpt`` beside it unless ``--out`` says otherwise, carries the temperature in its inference
description, and ``vit test``, ``vit predict``, ``vit export``, :func:`vit.load` and :class:`vit.Predictor` use it.
The report (``evaluation.json``, ``reliability.png`` before / after) goes to a new ``calibrate-<time>`` folder of the
checkpoint's run.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from ..checkpoints.files import check_checkpoint_path
from ..checkpoints.naming import add_checkpoint_arguments, find_checkpoint
from ..errors import EXIT_OK, ArgumentParser, UsageError, add_switch


def build_parser(prog: str = "vit calibrate") -> ArgumentParser:
    parser = ArgumentParser(
        prog=prog, doc=__doc__, renamed={"--data_dir": "--data.data_dir", "--no-progress": "--progress false"}
    )
    parser.add_argument("checkpoint", nargs="?", help="the checkpoint, unless --ckpt_path names it (never changed)")
    add_checkpoint_arguments(parser, required=False)
    parser.add_argument(
        "--out", default=None, help="the calibrated checkpoint to write, a new file (default: <name>-calibrated.ckpt)"
    )
    parser.add_argument(
        "--report_dir", default=None, help="folder of the report (default: calibrate-<time> in the run)"
    )
    parser.add_argument(
        "--data.data_dir", dest="data_dir", default=None, help="the run's data set folder, when it is not where it was"
    )
    parser.add_argument("--batch_size", type=int, default=256, help="images per forward pass (default 256)")
    add_switch(parser, "--progress", default=True, help="show a progress bar (default: true)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "vit calibrate") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if (args.ckpt_path or args.checkpoint) is None:
        parser.error("name the checkpoint: --ckpt_path CKPT or CKPT first (a .ckpt, a run folder, last or best)")
    checkpoint = Path(find_checkpoint(args.ckpt_path or args.checkpoint, config=args.config, runs_dir=args.runs_dir))
    check_checkpoint_path(checkpoint)
    out = Path(args.out) if args.out else checkpoint.with_name(f"{checkpoint.stem}-calibrated.ckpt")
    if out.exists():
        raise UsageError(f"{out} exists: pass --out with a new file name (calibrate never overwrites a file)")
    if out.resolve() == checkpoint.resolve():
        raise UsageError("--out is the checkpoint itself: calibrate writes a new file and leaves the checkpoint as is")
    if args.batch_size < 1:
        raise UsageError(f"--batch_size must be >= 1, got {args.batch_size}")
    from .calibration import calibrate_checkpoint

    command = shlex.join([*prog.split(), *(argv if argv is not None else [])])
    result = calibrate_checkpoint(
        checkpoint,
        out,
        report_dir=args.report_dir,
        data_dir=args.data_dir,
        batch_size=args.batch_size,
        progress=args.progress,
        command=command,
    )
    report = result["calibration"]
    before, after = report["before"], report["after"]
    print(
        f"temperature {report['temperature']:.4f}, fitted on {report['fitted_on']['count']} val images "
        f"(NLL {report['fit_nll']['before']:.4f} -> {report['fit_nll']['after']:.4f})\n"
        f"on the other {report['reported_on']['count']}: ECE {before['ece']:.4f} -> {after['ece']:.4f}, "
        f"NLL {before['nll']:.4f} -> {after['nll']:.4f}, accuracy {after['accuracy']:.4f} (unchanged)\n"
        f"calibrated checkpoint: {out}\nreport: {result['folder']}/evaluation.json"
    )
    return EXIT_OK
