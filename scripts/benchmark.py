"""Benchmarks of the model, attention and data pipelines.

The same as ``vit bench ...``; ``python scripts/benchmark.py --help`` lists the options.
"""

from vit.main import console

if __name__ == "__main__":
    console(["bench"])
