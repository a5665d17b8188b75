"""Vision Transformer models and named presets.

This is the floor :mod:`vit.checkpoints` builds on: it never imports it. Weights from a file go in with
:func:`vit.load_pretrained` (:mod:`vit.checkpoints.pretrained`); the errors a file can raise are :mod:`vit.errors`'
and stay importable from here.
"""

from ..errors import IncompatibleCheckpointError, UnsafeCheckpointError
from .presets import create_model, list_models, model_config
from .timm_registry import register_timm_models
from .vision_transformer import VisionTransformer

__all__ = [
    "IncompatibleCheckpointError",
    "UnsafeCheckpointError",
    "VisionTransformer",
    "create_model",
    "list_models",
    "model_config",
    "register_timm_models",
]
