"""The parts :class:`~vit.VisionTransformer` chooses by its arguments: the patch embedding, each block's attention
layer and the pooling head. The model's constructor calls these; the choices live here, one function per part."""

from __future__ import annotations

from functools import partial
from typing import Literal

from torch import nn

from ..layers import (
    Attention,
    AttentionPoolLatent,
    LinearAttention,
    LocalityAttention,
    LocalityWindowAttention,
    NeighborhoodAttention,
    PatchEmbed,
    SequencePool,
    ShiftedPatchEmbed,
    WindowAttention,
)
from ..layers.linear_attention import FeatureMap

AttentionKind = Literal["global", "window", "sliding", "linear"]


def patch_embedding(
    img_size: int | tuple[int, int],
    patch_size: int | tuple[int, int],
    in_chans: int,
    embed_dim: int,
    shifted_patches: bool,
    **kwargs,
) -> PatchEmbed:
    """:class:`~vit.layers.PatchEmbed`, or :class:`~vit.layers.ShiftedPatchEmbed` with ``shifted_patches``;
    ``kwargs`` are theirs (``conv_stem``, ``dynamic_img_size``, ``dynamic_img_pad``, ``output_fmt``)."""
    layer = ShiftedPatchEmbed if shifted_patches else PatchEmbed
    return layer(img_size, patch_size, in_chans, embed_dim, **kwargs)


def attention_layers(
    kinds: list[AttentionKind],
    grid_size: tuple[int, int],
    num_prefix_tokens: int,
    window_size: int,
    window_dilation: int,
    shift_windows: bool,
    feature_map: FeatureMap,
    locality: bool,
) -> list[type[nn.Module]]:
    """The attention layer of each block, of its kind; every second window block is shifted by half a window with
    ``shift_windows`` (Swin); with ``locality`` the global and window blocks use locality self-attention (the model
    refuses it with the other kinds)."""
    grid = dict(grid_size=grid_size, num_prefix_tokens=num_prefix_tokens)
    layers: list[type[nn.Module]] = []
    for i, kind in enumerate(kinds):
        if kind == "linear":
            layers.append(partial(LinearAttention, feature_map=feature_map))
        elif kind == "sliding":
            layers.append(partial(NeighborhoodAttention, kernel_size=window_size, dilation=window_dilation, **grid))
        elif kind == "window":
            shift = window_size // 2 if shift_windows and kinds[:i].count("window") % 2 == 1 else 0
            window = LocalityWindowAttention if locality else WindowAttention
            layers.append(partial(window, window_size=window_size, shift=shift, **grid))
        else:
            layers.append(LocalityAttention if locality else Attention)
    return layers


def pool_head(
    global_pool: str,
    embed_dim: int,
    num_heads: int,
    mlp_ratio: float,
    latent_len: int,
    norm_layer: type[nn.Module],
    fused_attn: bool,
) -> nn.Module | None:
    """The learned pooling head (the model's ``attn_pool``): the MAP head for ``"map"``, sequence pooling for
    ``"seqpool"``; ``None`` for the pools without parameters."""
    if global_pool == "map":
        return AttentionPoolLatent(
            embed_dim,
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            latent_len=latent_len,
            norm_layer=norm_layer,
            fused_attn=fused_attn,
        )
    if global_pool == "seqpool":
        return SequencePool(embed_dim)
    return None
