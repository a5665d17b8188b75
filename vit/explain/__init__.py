"""Understanding attention: explain a model's predictions, measure the maps, show them.

:func:`explain` is the one entry: a model and images in, an :class:`Explanation` out (maps by method from the
registry :data:`METHODS`, predictions, attention statistics, per-head maps, and with ``faithfulness=True`` the method
benchmark). :mod:`vit.explain.render` draws it: panels and grids, the HTML report, the attention explorer.
``vit explain`` (:mod:`vit.explain.command`) and the training callback
(:class:`~vit.callbacks.ExplanationLogger`) call the same function.

Names are imported on first use (PEP 562): ``import vit.explain`` itself loads nothing heavy, so ``vit explain
--help`` answers at once. Needs torch, numpy, PIL and matplotlib.
"""

import sys
import types
from typing import TYPE_CHECKING, Any

from ..lazy import attach, type_checking_names

if TYPE_CHECKING:  # the public names, imported on first use (below); type checkers and the API docs read them here
    from ..normalize import unnormalize
    from .attribution import attention_attribution, relevance_from_gradients
    from .capture import AttentionRecord, attention_modules, capture_attention, eval_mode, pool_module, record_attention
    from .choice import MethodChoice, choice_path, read_choice, stored_methods
    from .colors import ColorScale, apply_colormap, color_scale, is_signed
    from .explanation import Explanation, benchmark_scores, display_pixels
    from .faithfulness import faithfulness
    from .lrp import LRPResult, lrp, relevance_rules
    from .method_benchmark import MethodBenchmark, MethodScore, benchmark_methods
    from .methods import DEFAULT_METHOD, METHODS, Method, MethodMap, applicable_methods, explain_map, get_method
    from .mistakes import Mistakes, worst_mistakes
    from .pipeline import block_index, explain, explain_images, model_inputs
    from .render.explorer import ExplorerTooLarge, explorer_payload, render_explorer, write_explorer
    from .render.images import png_bytes, to_uint8_image
    from .render.mistakes import render_mistakes
    from .render.notebook import Explorer, show_explanations, show_explorer
    from .render.overlay import make_grid, overlay_heatmap, upsample_map
    from .render.panels import explanation_png, render_grid, render_panel, render_panels
    from .render.plots import distance_plot, figure_to_array
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
    from .tuning import GammaCandidate, GammaTuning, MethodCandidate, MethodTuning, tune_gamma, tune_method


_WHERE = type_checking_names(__file__)
__all__ = [
    "AttentionRecord",
    "CollapseReport",
    "ColorScale",
    "DEFAULT_METHOD",
    "Explanation",
    "Explorer",
    "ExplorerTooLarge",
    "GammaCandidate",
    "GammaTuning",
    "HeadFusion",
    "LRPResult",
    "METHODS",
    "Method",
    "MethodBenchmark",
    "MethodCandidate",
    "MethodChoice",
    "MethodMap",
    "MethodScore",
    "MethodTuning",
    "Mistakes",
    "RolloutPool",
    "applicable_methods",
    "apply_colormap",
    "attention_attribution",
    "attention_distance",
    "attention_entropy",
    "attention_modules",
    "attention_rollout",
    "attention_statistics",
    "benchmark_methods",
    "benchmark_scores",
    "block_index",
    "capture_attention",
    "choice_path",
    "color_scale",
    "describe_collapse",
    "detect_collapse",
    "discard_lowest",
    "display_pixels",
    "distance_plot",
    "eval_mode",
    "explain",
    "explain_images",
    "explain_map",
    "explanation_png",
    "explorer_payload",
    "faithfulness",
    "figure_to_array",
    "fixed_images",
    "fuse_heads",
    "get_method",
    "head_pool",
    "is_signed",
    "lrp",
    "make_grid",
    "model_inputs",
    "overlay_heatmap",
    "patch_distances",
    "png_bytes",
    "pool_module",
    "read_choice",
    "record_attention",
    "relevance_from_gradients",
    "relevance_rules",
    "render_explorer",
    "render_grid",
    "render_mistakes",
    "render_panel",
    "render_panels",
    "rollout_grid",
    "rollout_map",
    "row_entropy",
    "select_indices",
    "show_explanations",
    "show_explorer",
    "stored_methods",
    "to_uint8_image",
    "tune_gamma",
    "tune_method",
    "unnormalize",
    "upsample_map",
    "worst_mistakes",
    "write_explorer",
]
"""The public names (the same as the ``TYPE_CHECKING`` block's: a test keeps them equal), written out for the
tools that read ``__all__`` without running this module (the API docs)."""


_SHADOWED = {"faithfulness", "lrp"}
"""Functions named like the submodule that holds them: ``vit.explain.lrp`` is the function, as before the names were
lazy, even after ``vit.explain.lrp`` the module has been imported (it stays in ``sys.modules``)."""


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            return  # the import system binding the submodule: the name keeps meaning the function
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__getattr__, __dir__ = attach(__name__, _WHERE)


def _show_in_notebooks() -> None:
    """In a running IPython (a notebook), an :class:`Explanation` shows as its maps: the renderers register their
    display formatter (:func:`~vit.explain.render.notebook.show_explanations`). Elsewhere nothing is imported."""
    ipython = sys.modules.get("IPython")
    if ipython is not None and ipython.get_ipython() is not None:
        from .render.notebook import show_explanations

        show_explanations()


_show_in_notebooks()
