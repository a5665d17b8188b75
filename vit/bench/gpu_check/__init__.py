"""The GPU check: one call of at most 10 minutes on one H100/H200-class GPU without network.

    scripts/gpu_check.sh OUTDIR              # writes OUTDIR/*.json, *.log, check.json and summary.txt
    DRY_RUN=1 scripts/gpu_check.sh OUTDIR    # every step with tiny settings on the CPU: checks the plumbing

Recipes first, in this order (:mod:`~vit.bench.gpu_check.plan`):

1. the CIFAR-10 speedrun on the real CIFAR-10 JPEGs with a time budget (``model.schedule time``, 2 min 45 s), then
   the test accuracy of its final weights;
2. ``vit_small.yaml`` with a time budget (1 min 45 s) on the same images, then its test accuracy;
3. the speedrun and ``vit_small`` at twice their learning rate for 40 s each (about 600 steps of their step
   schedules): the loss must stay finite (1x is the runs above);
4. ``vit_small_imagenet.yaml`` for one minute on shards made from real photographs, decoded on the GPU;

then, while the budget lasts, the benchmarks: our ViT against timm's, attention patterns, explanation methods, the
data pipelines, GPU JPEG decoding and the compiled model suite (last: its compilation time varies most).

Each step runs in a process of its own under its own limit (SIGTERM, then SIGKILL 10 s later), never eating into the
seconds that the steps after it keep back; a step that would get less than 10 s is skipped. As each step ends, its
``NAME.json`` (the step's own result, or the runner's record of it where the step wrote none: status, exit, limit,
wall time), ``check.json`` (every step so far) and ``summary.txt`` are written, so a step that fails or times out,
or the call itself ending, loses nothing measured before it. A recipe's JSON holds its arguments, the validation
curve, the steps and epochs its budget bought, the fit's wall time and the whole process's, images/s, the test
accuracy, and the phases outside the budget (imports, data ready, first step, each validation, test).

The repository is not pip-installed on the GPU machine: everything runs from the repository root with ``python -m``,
and this package imports only the standard library until the carried wheels are installed and the modules checked.
What a machine without network lacks comes beside the repository before the call:

- ``data/cifar10-jpeg.tar.gz``: the CIFAR-10 JPEGs (``train|test/<class>/*.jpg``) as one tarball (``/data/`` is
  git-ignored);
- ``.whl/*.whl``: wheels of the packages missing there, installed first with ``pip --no-index --no-deps`` (a dry run
  installs them too: run it in an environment made like the GPU machine's). Where Python 3.12 has only PyTorch,
  torchvision, timm, Lightning, torchmetrics, OpenCV, matplotlib and scikit-learn, these are the 25 that pip's
  resolver adds for ``albumentations jsonargparse[signatures] simplejpeg litdata`` (``docs/performance.md`` has the
  command): albumentations, albucore, simsimd, stringzilla, pydantic, pydantic_core, annotated-types,
  typing-inspection, jsonargparse, docstring_parser, typeshed_client, simplejpeg, litdata, boto3, botocore,
  s3transfer, jmespath, obstore, tifffile, requests, urllib3, certifi, charset-normalizer, python-dateutil, six.

Before the steps, the check imports every module some step needs, names the missing ones, and skips the steps that
need them at once.

Environment: ``PYTHON`` (default: python, else python3), ``BUDGET_S`` (default 570; 1710 in a dry run),
``CIFAR_TAR`` (default ``data/cifar10-jpeg.tar.gz``), ``WHEELS`` (default ``.whl``), ``DRY_RUN`` (1: the CPU, tiny
settings, every limit three times longer), ``ONLY`` (step names, e.g. ``"speedrun vit_small"``: those steps alone,
with the data they need and nothing kept back for the others), ``SPEEDRUN_TIME`` (the speedrun's
``trainer.max_time``, default ``00:00:02:45``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from vit.errors import ArgumentParser, VitError, exit_with

from .plan import FIRST_RECIPES, needed_modules, plan_steps, wheels_step
from .runner import Check, Step, chosen_steps, read_settings, scratch_folder, step_limit

__all__ = ["Check", "Step", "build_parser", "main", "step_limit"]

STEP_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true", "PYTHONUNBUFFERED": "1"}
"""Set for every step: W&B never reaches for a network, and logs are written as they come."""


def build_parser(prog: str = "scripts/gpu_check.sh") -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", metavar="OUTDIR", help="a new folder for the results")
    parser.add_argument("--cwd", default=".", help=argparse.SUPPRESS)  # the shell entry's caller's folder
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "scripts/gpu_check.sh") -> int:
    """Run the check from the repository root; returns 0 whatever the steps did (``summary.txt`` says)."""
    args = build_parser(prog).parse_args(argv)
    before = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # its step is stopped too
    try:
        settings = read_settings(Path(args.cwd, args.outdir).resolve(), os.environ)
        with scratch_folder() as scratch:
            steps = chosen_steps(plan_steps(settings, Path(scratch)), settings.only, always=("environment",))
            check = Check(settings, {**os.environ, **STEP_ENV}, modules_reserve_s=FIRST_RECIPES)
            wheels = wheels_step(settings)
            if wheels:
                check.run(wheels)
            check.check_modules(needed_modules(steps))
            for step in steps:
                check.run(step)
            check.note(f"total {check.elapsed():.0f}s of {settings.budget_s}s; results in {settings.out}")
    except VitError as err:
        exit_with(err)
    finally:
        signal.signal(signal.SIGTERM, before)
    return 0
