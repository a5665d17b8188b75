"""``vit data prepare``: write any dataset the data module knows as LitData shards that stream to every rank.

    vit data prepare --data.dataset cifar10 --data.data_dir cifar10 --out shards/cifar10
    vit fit --config cifar10_cpu --data.dataset streaming --data.data_dir shards/cifar10

The parser needs the standard library only: ``--help`` and bad arguments answer before the data stack (torch, numpy,
LitData) is imported; :func:`~vit.data.shard_writer.prepare_shards` does the work, and its module says what a shard
folder holds.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from vit.errors import ArgumentParser, UsageError


def build_parser(prog: str = "vit data prepare") -> argparse.ArgumentParser:
    """The options of ``vit data prepare``."""
    parser = ArgumentParser(prog=prog, doc=__doc__)
    parser.add_argument("--data.dataset", dest="dataset", required=True,
                        choices=["imagefolder", "imagenet", "cifar10", "cifar100", "digits"])  # fmt: skip
    parser.add_argument("--data.data_dir", dest="data_dir", default=None, help="the dataset's root folder")
    parser.add_argument("--out", required=True, help="the shard folder to write")
    parser.add_argument("--short_side", type=int, default=256, help="shrink images to this shorter side at most")
    parser.add_argument("--workers", type=int, default=1, help="encoding processes")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "vit data prepare") -> int:
    """``vit data prepare``: parse ``argv`` (the arguments after ``vit data prepare``) and write the shards.

    Raises:
        UsageError: bad arguments, an unreadable source, or a DEST that holds something else.
    """
    args = build_parser(prog).parse_args(argv)
    from vit.data.datasets import DataError
    from vit.data.shard_writer import prepare_shards

    try:
        prepare_shards(
            dataset=args.dataset, data_dir=args.data_dir, out=args.out, short_side=args.short_side, workers=args.workers
        )
    except DataError as err:
        raise UsageError(str(err)) from None
    return 0
