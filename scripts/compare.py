"""Compare W&B runs: ``python -m vit.compare`` (see ``vit/compare/``); this entry point is the same command.

python scripts/compare.py runs/            # fit runs only; --all adds validate/predict and crashed runs
"""

import sys

from vit.compare import main

if __name__ == "__main__":
    sys.exit(main())
