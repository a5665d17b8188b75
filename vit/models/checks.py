"""The checks of :class:`~vit.VisionTransformer`'s arguments: one clear error per inconsistent setting, naming the
argument, before any module is built (the assembly is the model's own)."""

from __future__ import annotations

from torch import nn


def check_arguments(
    model: nn.Module,
    num_heads: int,
    depth: int,
    latent_len: int,
    pos_embed: str,
    patch_drop_rate: float,
    shift_windows: bool,
    linear_feature_map: str,
) -> None:
    """Refuse inconsistent arguments of a :class:`~vit.VisionTransformer`, naming the argument; those the model keeps
    as attributes are read from ``model`` (the sliding window's fit in the patch grid is checked once the grid is
    known, by :func:`check_sliding`)."""
    if num_heads <= 0 or model.embed_dim % num_heads:
        raise ValueError(f"embed_dim {model.embed_dim} is not divisible by num_heads {num_heads}")
    if model.global_pool not in ("token", "avg", "map", "seqpool"):
        raise ValueError(f"global_pool must be 'token', 'avg', 'map' or 'seqpool', got {model.global_pool!r}")
    if latent_len < 1:
        raise ValueError(f"latent_len must be >= 1, got {latent_len}")
    if model.linear_attention and model.window_size:
        raise ValueError(
            f"linear_attention and window_size {model.window_size} both choose the non-global blocks' attention: "
            "use one (window_size=0 with linear_attention)"
        )
    if model.locality_attention and (model.linear_attention or model.window_type == "sliding"):
        kind = "linear_attention" if model.linear_attention else "window_type='sliding'"
        raise ValueError(
            f"locality_attention is not supported with {kind}: it masks the diagonal of a softmax over all or "
            "block-window tokens; use global attention or window_type='block', or locality_attention=False"
        )
    if linear_feature_map not in ("elu", "relu"):
        raise ValueError(f"linear_feature_map must be 'elu' or 'relu', got {linear_feature_map!r}")
    if model.global_pool == "token" and not model.has_class_token:
        raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without a class token")
    if pos_embed not in ("learn", "sincos", "none"):
        raise ValueError(f"pos_embed must be 'learn', 'sincos' or 'none', got {pos_embed!r}")
    if model.num_reg_tokens < 0:
        raise ValueError(f"reg_tokens must be >= 0, got {model.num_reg_tokens}")
    if depth <= 0:
        raise ValueError(f"depth must be positive, got {depth}")
    if model.window_size < 0:
        raise ValueError(f"window_size must be >= 0 (0 = global attention), got {model.window_size}")
    if model.window_type not in ("block", "sliding"):
        raise ValueError(f"window_type must be 'block' or 'sliding', got {model.window_type!r}")
    if model.window_type == "sliding" and shift_windows:
        raise ValueError("shift_windows applies to window_type='block' only: a sliding window needs no shift")
    if model.window_dilation <= 0:
        raise ValueError(f"window_dilation must be positive, got {model.window_dilation}")
    if model.window_type == "block" and model.window_dilation != 1:
        raise ValueError(f"window_dilation {model.window_dilation} needs window_type='sliding'")
    if not 0 <= patch_drop_rate < 1:
        raise ValueError(f"patch_drop_rate must be in [0, 1), got {patch_drop_rate}")
    bad = [i for i in model.global_attn_indexes if not 0 <= i < depth]
    if bad:
        raise ValueError(f"global_attn_indexes {bad} out of range for depth {depth} (valid: 0..{depth - 1})")
    # after the range check: the indexes are then valid, so fewer distinct ones than depth means window blocks
    if patch_drop_rate and model.window_size and len(set(model.global_attn_indexes)) < depth:
        raise ValueError(
            f"patch_drop_rate {patch_drop_rate} needs global attention in every block: a window block needs every "
            "patch of the grid to form its windows; set patch_drop_rate=0 (--model.model_overrides.patch_drop_rate "
            "0) with window_size > 0"
        )


def check_sliding(grid_size: tuple[int, int], window_size: int, dilation: int) -> None:
    """Sliding-window arguments, checked with the model's argument names."""
    if window_size % 2 == 0:
        raise ValueError(f"window_size must be odd for window_type='sliding' (centred on its patch), got {window_size}")
    if window_size * dilation > min(grid_size):
        rows, cols = grid_size
        raise ValueError(
            f"window_size {window_size} x window_dilation {dilation} = {window_size * dilation} is larger than the "
            f"patch grid {rows}x{cols}: use window_size * window_dilation <= {min(grid_size)}"
        )
