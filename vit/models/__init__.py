"""Vision Transformer models, named presets and weight loading.

Reading weight files is :mod:`vit.checkpoints`' (this package imports it only when :func:`load_pretrained` is given a
file); the errors a file can raise are :mod:`vit.errors`' and stay importable from here beside
:func:`load_pretrained`, which adapts the weights to a model.
"""

from ..errors import IncompatibleCheckpointError, UnsafeCheckpointError
from .presets import create_model, list_models, model_config
from .timm_registry import register_timm_models
from .vision_transformer import VisionTransformer
from .weights import load_pretrained

__all__ = [
    "IncompatibleCheckpointError",
    "UnsafeCheckpointError",
    "VisionTransformer",
    "create_model",
    "list_models",
    "load_pretrained",
    "model_config",
    "register_timm_models",
]
