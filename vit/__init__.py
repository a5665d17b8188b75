"""vit: train, compare and understand Vision Transformers.

A plain install (``pip install vit``) brings every dependency listed in ``pyproject.toml``: the model layer's (torch,
timm), the training stack's (Lightning, torchmetrics, jsonargparse, albumentations, OpenCV, scikit-learn, W&B,
LitData, simplejpeg) and the drawing of explanations (matplotlib, Pillow); the ``export`` extra adds ONNX and ONNX
Runtime for ``vit export --onnx``, the ``explain`` extra captum and grad-cam for the integrated-gradients and
Grad-CAM baselines of ``vit.explain``. ``import vit`` loads the model layer only (``vit.layers``, ``vit.models``);
everything else is imported on first use (PEP 562), so the models and ``vit.load`` also work where only torch and
timm (with timm's own dependencies) are installed.
"""

import os
from importlib import import_module
from typing import Any

# albumentations asks PyPI for a newer version on every import (every DataLoader worker too); training must
# never wait on the network, so that check is off unless the user turned it on explicitly.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from .layers import (
    Attention,
    AttentionPoolLatent,
    Block,
    CrossAttention,
    LinearAttention,
    NeighborhoodAttention,
    PatchEmbed,
    WindowAttention,
    build_sincos_2d_pos_embed,
    resample_pos_embed,
)
from .models import VisionTransformer, create_model, list_models, load_pretrained

__version__ = "0.1.0"

# name -> module of the training stack, imported lazily (PEP 562).
_LAZY = {
    "ImageClassifier": "vit.lit_module",
    "ImageDataModule": "vit.data",
    "AttentionRolloutLogger": "vit.callbacks",
    "cli_main": "vit.cli",
    "capture_attention": "vit.explain",
    "attention_rollout": "vit.explain",
    "rollout_map": "vit.explain",
    "explain_images": "vit.explain",
    "attention_attribution": "vit.explain",
    "faithfulness": "vit.explain",
    "load": "vit.checkpoints",
    "Predictor": "vit.inference",
    "Prediction": "vit.inference",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vit' has no attribute {name!r}")


__all__ = [
    "Attention",
    "AttentionPoolLatent",
    "Block",
    "CrossAttention",
    "LinearAttention",
    "NeighborhoodAttention",
    "PatchEmbed",
    "VisionTransformer",
    "WindowAttention",
    "build_sincos_2d_pos_embed",
    "create_model",
    "list_models",
    "load_pretrained",
    "resample_pos_embed",
    *_LAZY,
]
