"""Building blocks of the Vision Transformer, one concept per file."""

from .attention import Attention, AttentionBase, attention_softmax
from .block import Block
from .cross_attention import AttentionPoolLatent, CrossAttention
from .linear_attention import LinearAttention
from .locality_attention import LocalityAttention, LocalityWindowAttention, locality_mask
from .neighborhood_attention import (
    NeighborhoodAttention,
    neighborhood_attention_mask,
    neighborhood_mask_mod,
    neighborhood_starts,
)
from .patch_embed import PatchEmbed
from .pos_embed import build_sincos_2d_pos_embed, resample_pos_embed
from .sequence_pool import SequencePool
from .shifted_patch_embed import ShiftedPatchEmbed, shifted_copies
from .utils import to_2tuple
from .window_attention import WindowAttention, window_attention_mask, window_band_labels

__all__ = [
    "Attention",
    "AttentionBase",
    "AttentionPoolLatent",
    "Block",
    "CrossAttention",
    "LinearAttention",
    "LocalityAttention",
    "LocalityWindowAttention",
    "NeighborhoodAttention",
    "PatchEmbed",
    "SequencePool",
    "ShiftedPatchEmbed",
    "WindowAttention",
    "attention_softmax",
    "build_sincos_2d_pos_embed",
    "locality_mask",
    "neighborhood_attention_mask",
    "neighborhood_mask_mod",
    "neighborhood_starts",
    "resample_pos_embed",
    "shifted_copies",
    "to_2tuple",
    "window_attention_mask",
    "window_band_labels",
]
