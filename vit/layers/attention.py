"""Multi-head self-attention with PyTorch's fused scaled-dot-product kernels.

Vaswani et al., "Attention Is All You Need" (NeurIPS 2017); query-key normalisation from Dehghani et al.,
"Scaling Vision Transformers to 22 Billion Parameters" (ICML 2023).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def attention_softmax(
    q: torch.Tensor, k: torch.Tensor, scale: float, attn_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Attention weights ``softmax(q kᵀ · scale + mask)`` computed explicitly.

    Args:
        q: Queries ``(..., L, head_dim)``.
        k: Keys ``(..., S, head_dim)``.
        scale: Multiplier of the scores, usually ``head_dim ** -0.5``.
        attn_mask: Boolean mask (True = may attend) or additive float mask, broadcastable to ``(..., L, S)``.

    Returns:
        Weights ``(..., L, S)``; masked keys get exactly zero weight.
    """
    scores = (q * scale) @ k.transpose(-2, -1)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    return scores.softmax(dim=-1)


class AttentionBase(nn.Module):
    """What every multi-head attention here shares: heads, query-key norms, dropouts, output projection, and the
    one ``fused_attn`` switch between :func:`torch.nn.functional.scaled_dot_product_attention` (flash /
    memory-efficient kernels, the default) and the explicit path ``softmax(QKᵀ/√d)·V`` (:meth:`attend`).

    Subclasses create their input projections in :meth:`init_projections` (self-attention: ``qkv``; cross-attention:
    ``q`` and ``kv``), called where the projection sits in timm's layout, before the norms, so parameter names,
    their order and hence a seeded initialisation match timm's.

    Args:
        dim: Token width.
        num_heads: Number of heads; must divide ``dim``.
        qkv_bias: Whether the input projections have a bias.
        qk_norm: Normalise queries and keys per head before the dot product.
        attn_drop: Dropout on the attention weights (training only).
        proj_drop: Dropout after the output projection.
        norm_layer: Normalisation used by ``qk_norm``.
        fused_attn: Use the fused kernel (True) or the explicit path (False).

    Raises:
        ValueError: If ``num_heads`` does not divide ``dim``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        fused_attn: bool = True,
    ) -> None:
        super().__init__()
        if num_heads <= 0 or dim % num_heads:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = fused_attn
        self.init_projections(dim, qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def init_projections(self, dim: int, bias: bool) -> None:
        """Create the projections of the inputs into queries, keys and values."""
        raise NotImplementedError

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        offset: int = 0,
    ) -> torch.Tensor:
        """Weighted sum of values, through the fused kernel or the explicit path.

        Args:
            q: Queries ``(..., L, head_dim)``.
            k: Keys ``(..., S, head_dim)``.
            v: Values ``(..., S, head_dim)``.
            attn_mask: Boolean (True = may attend) or additive mask broadcastable to ``(..., L, S)``.
            offset: Query ``i`` is the token of key ``offset + i`` (the diagonal that
                :class:`~vit.layers.LocalityAttention` masks); plain attention does not use it.

        Returns:
            ``(..., L, head_dim)``.
        """
        if self.fused_attn:
            dropout_p = self.attn_drop.p if self.training else 0.0
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
        attn = self.attn_drop(attention_softmax(q, k, self.scale, attn_mask))
        return attn @ v

    def weights(
        self, q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None = None, offset: int = 0
    ) -> torch.Tensor:
        """The dense softmax weights ``(..., L, S)`` that :meth:`attend` applies (dropout aside); arguments as there."""
        return attention_softmax(q, k, self.scale, attn_mask)


class Attention(AttentionBase):
    """Multi-head self-attention over a token sequence.

    ``fused_attn`` is the one switch between :func:`torch.nn.functional.scaled_dot_product_attention`
    (flash / memory-efficient kernels, the default) and the explicit path ``softmax(QKᵀ/√d)·V``; both give the
    same output (:class:`AttentionBase`).

    Args:
        dim: Token width.
        num_heads: Number of heads; must divide ``dim``.
        qkv_bias: Whether the ``qkv`` projection has a bias.
        qk_norm: Normalise queries and keys per head before the dot product.
        attn_drop: Dropout on the attention weights (training only).
        proj_drop: Dropout after the output projection.
        norm_layer: Normalisation used by ``qk_norm``.
        fused_attn: Use the fused kernel (True) or the explicit path (False).

    Raises:
        ValueError: If ``num_heads`` does not divide ``dim``.
    """

    def init_projections(self, dim: int, bias: bool) -> None:
        """One ``qkv`` projection, ``C -> 3C`` (timm's name)."""
        self.qkv = nn.Linear(dim, dim * 3, bias=bias)

    def split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split a ``qkv`` projection ``(B, N, 3C)`` into normalised queries, keys and values."""
        B, N, _ = qkv.shape
        # Unbinding dim 2 (not a leading permute) lets backward stack the three gradients straight into the
        # (B, N, 3C) layout: one copy instead of two.
        q, k, v = qkv.view(B, N, 3, self.num_heads, self.head_dim).unbind(2)  # (B, N, heads, head_dim)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # unpacked, not a generator: torch.fx
        return self.q_norm(q), self.k_norm(k), v  # (B, heads, N, head_dim)

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, grid_size: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """Attend over ``x`` of shape ``(B, N, C)``; ``attn_mask`` broadcasts to ``(B, heads, N, N)``.

        ``grid_size`` (the patch grid of a dynamic image size) is accepted for the local-attention subclasses'
        interface; global attention does not depend on it.
        """
        B, N, C = x.shape
        q, k, v = self.split_qkv(self.qkv(x))
        x = self.attend(q, k, v, attn_mask)  # (B, heads, N, head_dim)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))

    def attention_weights(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, grid_size: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """Dense softmax attention matrix ``(B, heads, N, N)`` that ``forward(x)`` applies (dropout aside)."""
        q, k, _ = self.split_qkv(self.qkv(x))
        return self.weights(q, k, attn_mask)
