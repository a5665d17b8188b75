"""Vision Transformer models, named presets and weight loading."""

from .presets import create_model, list_models, model_config
from .vision_transformer import VisionTransformer
from .weights import (
    IncompatibleCheckpointError,
    UnsafeCheckpointError,
    describe_mismatch,
    extract_state_dict,
    load_file,
    load_pretrained,
)

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
