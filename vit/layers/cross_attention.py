"""Multi-head cross-attention and attention pooling with learned latent queries (the MAP head).

Cross-attention: queries come from one sequence, keys and values from another (Vaswani et al., "Attention Is All
You Need", NeurIPS 2017, the decoder's encoder-decoder attention). Multi-head attention pooling (MAP) lets a few
learned latent queries attend to a model's final tokens and summarise them: Lee et al., "Set Transformer" (ICML
2019, pooling by multi-head attention), used as the classification head of SigLIP (Zhai et al., ICCV 2023) and
as timm's ``AttentionPoolLatent``, whose parameter names :class:`AttentionPoolLatent` keeps.
"""

from __future__ import annotations

import torch
from timm.layers import Mlp, trunc_normal_
from torch import nn

from .attention import AttentionBase, attention_softmax


def _key_mask(key_mask: torch.Tensor | None) -> torch.Tensor | None:
    """A ``(B, S)`` key mask (True = may attend) as a mask broadcastable to ``(B, heads, L, S)``."""
    if key_mask is None:
        return None
    if key_mask.ndim != 2:
        raise ValueError(f"key_mask must have shape (B, S), got {tuple(key_mask.shape)}")
    return key_mask[:, None, None, :]


class CrossAttention(AttentionBase):
    """Multi-head cross-attention: ``L`` queries attend over ``S`` context tokens.

    ``q`` projects the queries, ``kv`` the context into keys and values; heads, norms, dropouts, ``proj`` and the
    ``fused_attn`` switch are :class:`~vit.layers.attention.AttentionBase`'s, shared with
    :class:`~vit.layers.Attention`.

    Args:
        dim: Width of queries, context and output.
        num_heads: Number of heads; must divide ``dim``.
        qkv_bias: Whether the ``q`` and ``kv`` projections have a bias.
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
        qkv_bias: bool = True,  # timm's attention pooling has biases; self-attention's default is False
        qk_norm: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        fused_attn: bool = True,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, qk_norm, attn_drop, proj_drop, norm_layer, fused_attn)

    def init_projections(self, dim: int, bias: bool) -> None:
        """``q`` for the queries, ``kv`` for the context (timm's names)."""
        self.q = nn.Linear(dim, dim, bias=bias)
        self.kv = nn.Linear(dim, dim * 2, bias=bias)

    def split_qkv(
        self, queries: torch.Tensor, context: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project ``queries (B or 1, L, C)`` and ``context (B, S, C)`` into normalised per-head q, k and v.

        One set of learned queries ``(1, L, C)`` is projected once, then broadcast over the batch.
        """
        B, S, _ = context.shape
        L = queries.shape[1]
        q = self.q(queries).expand(B, -1, -1).view(B, L, self.num_heads, self.head_dim).transpose(1, 2)
        # q: (B, heads, L, head_dim)
        k, v = self.kv(context).view(B, S, 2, self.num_heads, self.head_dim).unbind(2)  # (B, S, heads, head_dim)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # unpacked, not a generator: torch.fx traces it
        return self.q_norm(q), self.k_norm(k), v  # k, v: (B, heads, S, head_dim)

    def forward(
        self, queries: torch.Tensor, context: torch.Tensor, key_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attend from ``queries (B, L, C)`` over ``context (B, S, C)``; returns ``(B, L, C)``.

        Args:
            queries: Query tokens; a ``(1, L, C)`` batch of learned queries broadcasts over the context's batch.
            context: Tokens providing keys and values.
            key_mask: ``(B, S)`` boolean, True where a context token may be attended to; every query row needs
                at least one True.
        """
        B, S, C = context.shape
        L = queries.shape[1]
        q, k, v = self.split_qkv(queries, context)
        x = self.attend(q, k, v, _key_mask(key_mask))  # (B, heads, L, head_dim)
        x = x.transpose(1, 2).reshape(B, L, C)
        return self.proj_drop(self.proj(x))

    def attention_weights(
        self, queries: torch.Tensor, context: torch.Tensor, key_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Dense weights ``(B, heads, L, S)`` that ``forward`` applies (dropout aside); rows sum to 1."""
        q, k, _ = self.split_qkv(queries, context)
        return attention_softmax(q, k, self.scale, _key_mask(key_mask))

    def apply_weights(self, attn: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """``proj(attn @ v)`` for given weights ``attn (B, heads, L, S)``: ``forward`` with its weights replaced,
        so explanation code can differentiate through them. Returns ``(B, L, C)``."""
        B, S, C = context.shape
        v = self.kv(context).view(B, S, 2, self.num_heads, self.head_dim)[:, :, 1].transpose(1, 2)
        x = (attn @ v).transpose(1, 2).reshape(B, attn.shape[2], C)  # v: (B, heads, S, head_dim)
        return self.proj_drop(self.proj(x))


class AttentionPoolLatent(CrossAttention):
    """Multi-head attention pooling: ``latent_len`` learned queries attend to the tokens, then a residual MLP.

    ``x = proj(cross_attention(latent, tokens))``, ``x = x + mlp(norm(x))``, then the mean over the latents:
    ``(B, N, C) -> (B, C)``. With ``latent_len=1`` this is timm's ``AttentionPoolLatent`` (the SigLIP head):
    same parameters (``latent``, ``q``, ``kv``, ``proj``, ``norm``, ``mlp.fc1``, ``mlp.fc2``) and output. timm
    keeps the first latent when there are several; the mean used here gives every latent a gradient.

    It *is* a :class:`CrossAttention` whose queries are its own ``latent`` (so the projections keep timm's names);
    :meth:`attention_weights` gives the ``latent -> token`` weights for explanation.

    Args:
        dim: Token width.
        num_heads: Number of heads; must divide ``dim``.
        mlp_ratio: Hidden width of the MLP relative to ``dim``.
        latent_len: Number of learned latent queries.
        qkv_bias: Whether the ``q`` and ``kv`` projections have a bias (timm: True).
        qk_norm: Normalise queries and keys per head.
        norm_layer: Normalisation before the MLP (and of ``qk_norm``).
        act_layer: MLP activation.
        drop: Dropout after the output projection.
        fused_attn: Use the fused kernel (True) or the explicit path (False).

    Raises:
        ValueError: If ``num_heads`` does not divide ``dim`` or ``latent_len < 1``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        mlp_ratio: float = 4.0,
        latent_len: int = 1,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        act_layer: type[nn.Module] = nn.GELU,
        drop: float = 0.0,
        fused_attn: bool = True,
    ) -> None:
        if latent_len < 1:
            raise ValueError(f"latent_len must be >= 1, got {latent_len}")
        super().__init__(
            dim,
            num_heads,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            proj_drop=drop,
            norm_layer=norm_layer,
            fused_attn=fused_attn,
        )
        self.latent_len = latent_len
        self.latent = nn.Parameter(torch.zeros(1, latent_len, dim))
        self.norm = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer)
        self.init_weights()

    def init_weights(self) -> None:
        """The latent gets a truncated normal with std ``dim ** -0.5`` (timm)."""
        trunc_normal_(self.latent, std=self.latent.shape[-1] ** -0.5)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        """Pool tokens ``(B, N, C)`` into ``(B, C)``; ``key_mask (B, N)`` marks the tokens that may be attended."""
        return self.pool_latents(super().forward(self.latent, x, key_mask))

    def pool_latents(self, x: torch.Tensor) -> torch.Tensor:
        """The rest of the head after the cross-attention: ``x + mlp(norm(x))``, mean over the latents,
        ``(B, latent_len, C) -> (B, C)``."""
        x = x + self.mlp(self.norm(x))
        return x.mean(dim=1)

    def attention_weights(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        """The latents' attention over the tokens, ``(B, heads, latent_len, N)``; rows sum to 1."""
        return super().attention_weights(self.latent, x, key_mask)
