"""The old name of ``vit explain --method rollout --out rollout``, kept so that old commands still work.

    python scripts/rollout.py CHECKPOINT IMAGE_OR_FOLDER [...] [--out rollout] [--head_fusion max --discard_ratio 0.9]

Every option of ``vit explain`` applies (later options win).
"""

from vit.main import console

if __name__ == "__main__":
    console(["explain", "--method", "rollout", "--out", "rollout"])
