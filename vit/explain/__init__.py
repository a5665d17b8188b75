"""Understanding attention: capture the dense weights, roll them out, measure them, show them.

:func:`explain_images` is the one pipeline (one forward pass gives predictions and attention); panels and plots
render its :class:`Explanation`. :func:`compute` explains many images in batches, with attribution and
faithfulness, as ``vit explain`` does (:class:`Results`). Needs torch, numpy, PIL and matplotlib.
"""

from ..normalize import unnormalize
from .attribution import attention_attribution, relevance_from_gradients
from .capture import AttentionRecord, attention_modules, capture_attention, eval_mode, pool_module, record_attention
from .colors import ColorScale, color_scale, is_signed
from .explorer import ExplorerTooLarge, explorer_payload, render_explorer, write_explorer
from .faithfulness import faithfulness
from .lrp import LRPResult, lrp, relevance_rules
from .method_benchmark import MethodBenchmark, MethodScore, benchmark_methods
from .methods import DEFAULT_METHOD, METHODS, Method, MethodMap, applicable_methods, explain_map, get_method
from .overlay import apply_colormap, make_grid, overlay_heatmap, to_uint8_image, upsample_map
from .panels import render_grid, render_panel, render_panels
from .pipeline import Explanation, display_pixels, explain_images
from .plots import distance_plot, figure_to_array
from .results import Results, compute
from .rollout import (
    HeadFusion,
    RolloutPool,
    attention_rollout,
    discard_lowest,
    fuse_heads,
    head_pool,
    rollout_grid,
    rollout_map,
)
from .selection import fixed_images, select_indices
from .stats import (
    CollapseReport,
    attention_distance,
    attention_entropy,
    attention_statistics,
    describe_collapse,
    detect_collapse,
    patch_distances,
    row_entropy,
)

__all__ = [
    "AttentionRecord",
    "CollapseReport",
    "DEFAULT_METHOD",
    "ExplorerTooLarge",
    "Explanation",
    "HeadFusion",
    "METHODS",
    "Method",
    "MethodBenchmark",
    "MethodMap",
    "MethodScore",
    "LRPResult",
    "Results",
    "RolloutPool",
    "applicable_methods",
    "ColorScale",
    "color_scale",
    "is_signed",
    "apply_colormap",
    "benchmark_methods",
    "attention_attribution",
    "attention_distance",
    "attention_entropy",
    "attention_modules",
    "attention_rollout",
    "attention_statistics",
    "capture_attention",
    "compute",
    "describe_collapse",
    "detect_collapse",
    "discard_lowest",
    "display_pixels",
    "distance_plot",
    "eval_mode",
    "explain_images",
    "explain_map",
    "explorer_payload",
    "faithfulness",
    "figure_to_array",
    "fixed_images",
    "fuse_heads",
    "get_method",
    "head_pool",
    "lrp",
    "make_grid",
    "overlay_heatmap",
    "patch_distances",
    "pool_module",
    "record_attention",
    "relevance_rules",
    "relevance_from_gradients",
    "render_explorer",
    "render_grid",
    "render_panel",
    "render_panels",
    "rollout_grid",
    "rollout_map",
    "row_entropy",
    "select_indices",
    "to_uint8_image",
    "unnormalize",
    "upsample_map",
    "write_explorer",
]
