"""Understanding attention: capture the dense weights, roll them out, overlay them, measure them.

Needs torch, numpy and PIL only (matplotlib optionally, for colormaps other than ``"jet"``).
"""

from ..normalize import unnormalize
from .capture import attention_modules, capture_attention
from .overlay import apply_colormap, make_grid, overlay_heatmap, to_uint8_image, upsample_map
from .rollout import HeadFusion, RolloutPool, attention_rollout, discard_lowest, fuse_heads, rollout_map
from .stats import (
    CollapseReport,
    attention_distance,
    attention_entropy,
    attention_statistics,
    detect_collapse,
    patch_distances,
    row_entropy,
)

__all__ = [
    "CollapseReport",
    "HeadFusion",
    "RolloutPool",
    "apply_colormap",
    "attention_distance",
    "attention_entropy",
    "attention_modules",
    "attention_rollout",
    "attention_statistics",
    "capture_attention",
    "detect_collapse",
    "discard_lowest",
    "fuse_heads",
    "make_grid",
    "overlay_heatmap",
    "patch_distances",
    "rollout_map",
    "row_entropy",
    "to_uint8_image",
    "unnormalize",
    "upsample_map",
]
