"""Explain a trained model's predictions: rollout and attribution overlays, faithfulness, an HTML report.

    python scripts/explain.py CHECKPOINT IMAGE_OR_FOLDER [...] [--method rollout|attribution|both] [--faithfulness]
                              [--json areas.json] [--html report.html] [--out explanations]

See ``python scripts/explain.py --help``; the logic lives in :mod:`vit.explain.command`.
"""

import sys

from vit.explain.command import main

if __name__ == "__main__":
    sys.exit(main())
