"""Train a model: ``python scripts/fit.py --config quickstart.yaml [--trainer.max_epochs 5 ...]``.

The same as ``vit fit ...``; a bare config name is looked up in ``configs/``.
"""

import sys

from vit.cli import cli_main

if __name__ == "__main__":
    cli_main(["fit", *sys.argv[1:]])
