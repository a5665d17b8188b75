"""Compare W&B runs: a table of the settings that differ and a plot.

The same as ``vit compare ...``; ``python scripts/compare.py --help`` lists the options.
"""

from vit.main import console

if __name__ == "__main__":
    console(["compare"])
