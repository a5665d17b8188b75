"""vit: train, compare and understand Vision Transformers.

A plain install (``pip install vit``) brings every dependency listed in ``pyproject.toml``: the model layer's (torch,
timm), the training stack's (Lightning, torchmetrics, jsonargparse, albumentations, OpenCV, scikit-learn, W&B,
LitData, simplejpeg), the drawing of explanations (matplotlib, Pillow) and ``vit sweep``'s Optuna; then
the ``export`` extra adds ONNX and ONNX Runtime for ``vit export --onnx``, the ``explain`` extra captum and grad-cam
for the integrated-gradients and Grad-CAM baselines of ``vit.explain``, the ``sweep`` extra psycopg for a study on
PostgreSQL (``vit sweep --storage postgresql://...``), the ``serve`` extra LitServe and prometheus-client for
``vit serve``, the ``serve-ray`` extra Ray Serve for ``vit serve --engine ray``, and the ``loadtest`` extra locust and
psutil for ``vit bench --suite serve``.

``import vit`` runs this file and :mod:`vit.lazy` only (the standard library's ``os``, ``sys`` and ``importlib``), so
the ``vit`` command answers ``--help`` before torch is loaded. Every public name is imported from its module on first
use (PEP 562): ``vit.VisionTransformer``, ``vit.create_model`` and the layers load the model layer (``vit.layers``,
``vit.models``: torch and timm), ``vit.load`` :mod:`vit.checkpoints`, ``vit.ImageClassifier`` the training stack
(Lightning), and so on; ``vit.layers``, ``vit.data`` and the other subpackages are imported on first use too. The
models and ``vit.load`` also work where only torch and timm (with timm's own dependencies) are installed.
"""

import os

from .lazy import attach

# albumentations asks PyPI for a newer version on every import (every DataLoader worker too); training must
# never wait on the network, so that check is off unless the user turned it on explicitly.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

__version__ = "0.1.0"

_LAZY = {
    # the model layer: torch and timm
    "Attention": "vit.layers",
    "AttentionPoolLatent": "vit.layers",
    "Block": "vit.layers",
    "CrossAttention": "vit.layers",
    "LinearAttention": "vit.layers",
    "NeighborhoodAttention": "vit.layers",
    "PatchEmbed": "vit.layers",
    "WindowAttention": "vit.layers",
    "build_sincos_2d_pos_embed": "vit.layers",
    "resample_pos_embed": "vit.layers",
    "VisionTransformer": "vit.models",
    "create_model": "vit.models",
    "list_models": "vit.models",
    "load_pretrained": "vit.checkpoints",
    "load": "vit.checkpoints",
    "Predictor": "vit.inference",
    "Prediction": "vit.inference",
    # the training stack: Lightning, albumentations, W&B
    "ImageClassifier": "vit.lit_module",
    "ImageDataModule": "vit.data",
    "ExplanationLogger": "vit.callbacks",
    "AttentionRolloutLogger": "vit.callbacks",
    "cli_main": "vit.cli",
    # explanations
    "capture_attention": "vit.explain",
    "attention_rollout": "vit.explain",
    "rollout_map": "vit.explain",
    "explain_images": "vit.explain",
    "attention_attribution": "vit.explain",
    "faithfulness": "vit.explain",
}
"""Public name -> the module that defines it, imported when the name is first asked for."""

__getattr__, __dir__ = attach(__name__, _LAZY, submodules=True)
__all__ = sorted(_LAZY)
