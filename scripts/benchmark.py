"""Benchmarks of the model, attention and data pipelines: ``python -m vit.bench`` (see ``vit/bench/``).

This entry point only adds one default: the data suite draws its photographs from cifar10-mini when the folder
``../shared/data/cifar10-mini`` beside the repository exists (``--cifar-mini`` chooses another).

    python scripts/benchmark.py --suite attention --threads 1 --json runs/attention.json
"""

from pathlib import Path

from vit.bench import build_parser, main

CIFAR_MINI = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10-mini"

if __name__ == "__main__":
    parser = build_parser()
    if CIFAR_MINI.is_dir():
        parser.set_defaults(cifar_mini=str(CIFAR_MINI))
    main(parser=parser)
