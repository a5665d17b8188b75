"""Linear attention: a kernel feature map instead of the softmax, so the cost grows linearly with the tokens.

Katharopoulos et al., "Transformers are RNNs: Fast Autoregressive Transformers with Linear Attention" (ICML 2020),
feature map ``φ(x) = elu(x) + 1``; Cai et al., "EfficientViT: Multi-Scale Linear Attention for High-Resolution
Dense Prediction" (ICCV 2023), ``φ = ReLU``. Per head, with ``q_i``, ``k_j`` after ``q_norm`` / ``k_norm``:

    out_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / (φ(q_i)ᵀ Σ_j φ(k_j) + eps)

The sums over keys are computed once, ``(head_dim × head_dim)`` and ``(head_dim,)`` per head, so no ``N × N``
tensor is ever formed: time and memory are linear in the number of tokens ``N``.

The division by the normaliser runs in a parameter-free submodule (:class:`Normalise`), so that explanation rules
can reach it with a forward pre-hook: relevance propagation (:func:`vit.explain.lrp`) treats the normaliser as a
constant, as it does LayerNorm's standard deviation.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from .attention import Attention

FeatureMap = Literal["elu", "relu"]


def feature_map_fn(name: FeatureMap) -> nn.Module:
    """The positive feature map ``φ``: ``"elu"`` is ``elu(x) + 1``, ``"relu"`` is ``max(x, 0)``."""
    if name == "elu":
        return EluPlusOne()
    if name == "relu":
        return nn.ReLU()
    raise ValueError(f"feature_map must be 'elu' or 'relu', got {name!r}")


class EluPlusOne(nn.Module):
    """``elu(x) + 1``, the feature map of Katharopoulos et al. (positive, smooth)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In place on elu's output (its backward reads the input): one pass and one tensor fewer than `elu(x) + 1`.
        return F.elu(x).add_(1.0)


class Normalise(nn.Module):
    """``numerator / denominator``: the linear attention's normalisation, a module of its own only so that a
    forward pre-hook can replace its inputs (e.g. detach the denominator); no parameters, no state."""

    def forward(self, numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
        return numerator / denominator


class LinearAttention(Attention):
    """Multi-head linear attention with exactly :class:`~vit.layers.Attention`'s parameters.

    ``qkv``, ``q_norm``, ``k_norm`` and ``proj`` are :class:`~vit.layers.Attention`'s, so an ``Attention`` state
    dict loads strictly (and the reverse): only the way queries meet keys changes. Computed in float32 at least
    (under autocast too), since the key sums run over every token.

    Args:
        dim: Token width.
        num_heads: Number of heads; must divide ``dim``.
        qkv_bias: Whether the ``qkv`` projection has a bias.
        qk_norm: Normalise queries and keys per head before the feature map.
        attn_drop: Must be 0: there is no attention matrix to drop entries of.
        proj_drop: Dropout after the output projection.
        norm_layer: Normalisation used by ``qk_norm``.
        fused_attn: Accepted for :class:`~vit.layers.Block`'s interface; linear attention has one path.
        feature_map: ``"elu"`` (``elu + 1``, Katharopoulos et al.) or ``"relu"`` (EfficientViT).
        eps: Added to the denominator, so a query whose features are all zero (possible with ReLU) gives 0.

    Raises:
        ValueError: If ``num_heads`` does not divide ``dim``, ``attn_drop > 0`` or ``feature_map`` is unknown.
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
        feature_map: FeatureMap = "elu",
        eps: float = 1e-6,
    ) -> None:
        if attn_drop:
            raise ValueError(f"attn_drop {attn_drop} needs an attention matrix; linear attention has none: use 0")
        super().__init__(dim, num_heads, qkv_bias, qk_norm, 0.0, proj_drop, norm_layer, fused_attn)
        self.feature_map = feature_map
        self.phi = feature_map_fn(feature_map)  # no parameters: the state dict stays Attention's
        self.normalise = Normalise()
        self.eps = eps

    def features(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``φ(q)`` and ``φ(k)`` in float32 at least, ``(B, heads, N, head_dim)``."""
        dtype = torch.promote_types(q.dtype, torch.float32)
        return self.phi(q.to(dtype)), self.phi(k.to(dtype))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``φ(q) (φ(k)ᵀ v) / (φ(q) Σ_j φ(k_j) + eps)`` without an ``N × N`` tensor; ``(..., N, head_dim)``."""
        if attn_mask is not None:
            raise ValueError("LinearAttention takes no attn_mask: every query attends to every key")
        fq, fk = self.features(q, k)
        kv = fk.transpose(-2, -1) @ v.to(fq.dtype)  # (B, heads, head_dim, head_dim): Σ_j φ(k_j) v_jᵀ
        z = fk.sum(dim=-2, keepdim=True)  # (B, heads, 1, head_dim): Σ_j φ(k_j)
        den = fq @ z.transpose(-2, -1) + self.eps  # (B, heads, N, 1), without an (N, head_dim) temporary
        return self.normalise(fq @ kv, den).to(v.dtype)

    def attention_weights(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, grid_size: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """The implied matrix ``A_ij = φ(q_i)·φ(k_j) / (φ(q_i)·Σ_k φ(k_k) + eps)``, ``(B, heads, N, N)``.

        ``A @ v`` reproduces ``forward`` exactly; each row sums to ``s / (s + eps)`` with ``s`` its unnormalised
        sum, i.e. to 1 up to ``eps``. Materialises ``N × N``: for capture and explanation on small grids.
        ``grid_size`` (a dynamic image size's patch grid) is accepted as :class:`Attention`'s is, and unused:
        every query attends to every key.
        """
        if attn_mask is not None:
            raise ValueError("LinearAttention takes no attn_mask: every query attends to every key")
        q, k, _ = self.split_qkv(self.qkv(x))
        fq, fk = self.features(q, k)
        scores = fq @ fk.transpose(-2, -1)  # (B, heads, N, N)
        return (scores / (scores.sum(dim=-1, keepdim=True) + self.eps)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"feature_map={self.feature_map!r}, eps={self.eps}"
