"""Pre-norm transformer block (Xiong et al., "On Layer Normalization in the Transformer Architecture", 2020)
with optional layer scale (Touvron et al., "Going deeper with Image Transformers", CaiT, ICCV 2021) and
stochastic depth (Huang et al., ECCV 2016)."""

from __future__ import annotations

import torch
from timm.layers import DropPath, LayerScale, Mlp
from torch import nn

from .attention import Attention


class Block(nn.Module):
    """``x = x + drop_path(ls1(attn(norm1(x))))``, then ``x = x + drop_path(ls2(mlp(norm2(x))))``.

    Args:
        dim: Token width.
        num_heads: Number of attention heads.
        mlp_ratio: Hidden width of the MLP relative to ``dim``.
        qkv_bias: Whether the ``qkv`` projection has a bias.
        qk_norm: Normalise queries and keys per head.
        proj_drop: Dropout after the attention projection and inside the MLP.
        attn_drop: Dropout on attention weights.
        init_values: Initial layer-scale value; ``None`` disables layer scale.
        drop_path: Stochastic-depth rate of this block.
        fused_attn: Use PyTorch's fused attention kernels.
        act_layer: MLP activation.
        norm_layer: Normalisation layer.
        mlp_layer: MLP class (timm's ``Mlp``: ``fc1``, ``act``, ``fc2``).
        attn_layer: Attention class, e.g. :class:`Attention` or a ``functools.partial`` of ``WindowAttention``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        init_values: float | None = None,
        drop_path: float = 0.0,
        fused_attn: bool = True,
        act_layer: type[nn.Module] = nn.GELU,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        mlp_layer: type[nn.Module] = Mlp,
        attn_layer: type[nn.Module] = Attention,
    ) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = attn_layer(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            norm_layer=norm_layer,
            fused_attn=fused_attn,
        )
        self.ls1 = LayerScale(dim, init_values=init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = mlp_layer(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop)
        self.ls2 = LayerScale(dim, init_values=init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: torch.Tensor, grid_size: tuple[int, int] | None = None) -> torch.Tensor:
        """``(B, N, C) -> (B, N, C)``; ``grid_size`` is the patch grid of ``x`` when it is not the model's (a dynamic
        image size), for local attention."""
        attn_input = self.norm1(x)
        attn = self.attn(attn_input) if grid_size is None else self.attn(attn_input, grid_size=grid_size)
        x = x + self.drop_path1(self.ls1(attn))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
