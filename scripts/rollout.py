"""Moved: this is ``scripts/explain.py --method rollout --out rollout``, kept so that old commands still work.

    python scripts/rollout.py CHECKPOINT IMAGE_OR_FOLDER [...] [--out rollout] [--head-fusion max --discard-ratio 0.9]

Every option of ``scripts/explain.py`` applies (see :mod:`vit.explain.command`).
"""

import sys

from vit.explain.command import rollout_main

if __name__ == "__main__":
    sys.exit(rollout_main())
