"""Vision Transformer models, named presets and weight loading.

Reading weight files and the errors a file can raise are :mod:`vit.checkpoints`' and :mod:`vit.errors`'; they are
re-exported here beside :func:`load_pretrained`, which adapts the weights to a model.
"""

from ..checkpoints.files import load_file
from ..checkpoints.state import describe_mismatch, extract_state_dict
from ..errors import IncompatibleCheckpointError, UnsafeCheckpointError
from .presets import create_model, list_models, model_config
from .vision_transformer import VisionTransformer
from .weights import load_pretrained

__all__ = [
    "IncompatibleCheckpointError",
    "UnsafeCheckpointError",
    "VisionTransformer",
    "create_model",
    "describe_mismatch",
    "extract_state_dict",
    "list_models",
    "load_file",
    "load_pretrained",
    "model_config",
]
