"""Train a model: `python scripts/fit.py --config vit_small.yaml [--trainer.max_epochs 5 ...]`.

The same as ``vit fit ...``; ``python scripts/fit.py --help`` lists the options.
"""

from vit.main import console

if __name__ == "__main__":
    console(["fit"])
