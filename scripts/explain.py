"""Explain a trained model's predictions (rollout, attribution, faithfulness, an HTML report).

The same as ``vit explain ...``; ``python scripts/explain.py --help`` lists the options.
"""

from vit.main import console

if __name__ == "__main__":
    console(["explain"])
