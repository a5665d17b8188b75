"""Positional encodings: fixed 2-D sine-cosine tables and resampling of learned position grids.

Sine-cosine: Vaswani et al. (2017) applied per axis as in MoCo v3 / MAE (Chen et al. 2021; He et al. 2022)
and "Better plain ViT baselines" (Beyer et al. 2022). Resampling: bicubic interpolation of the patch grid,
as used to fine-tune at a higher resolution in Dosovitskiy et al. (2021), Sec. 3.2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .utils import to_2tuple


def build_sincos_2d_pos_embed(
    grid_size: int | tuple[int, int], embed_dim: int, temperature: float = 10000.0
) -> torch.Tensor:
    """Fixed 2-D sine-cosine position table for a patch grid in row-major order.

    The first half of the channels encodes the row, the second half the column; each half is
    ``[sin(pos * omega), cos(pos * omega)]`` over ``embed_dim // 4`` frequencies ``omega_i = temperature^(-i / d)``.

    Args:
        grid_size: Patch grid ``(rows, cols)`` or an int for a square grid.
        embed_dim: Token width; must be divisible by 4.
        temperature: Frequency base.

    Returns:
        Tensor of shape ``(1, rows * cols, embed_dim)``.
    """
    if embed_dim % 4:
        raise ValueError(f"embed_dim {embed_dim} must be divisible by 4 for the 2-D sin-cos position embedding")
    rows, cols = to_2tuple(grid_size)
    grid_y, grid_x = torch.meshgrid(
        torch.arange(rows, dtype=torch.float64), torch.arange(cols, dtype=torch.float64), indexing="ij"
    )
    dim = embed_dim // 4
    omega = 1.0 / temperature ** (torch.arange(dim, dtype=torch.float64) / dim)
    y = grid_y.reshape(-1, 1) * omega  # (rows*cols, dim)
    x = grid_x.reshape(-1, 1) * omega
    table = torch.cat([y.sin(), y.cos(), x.sin(), x.cos()], dim=1)
    return table.float().unsqueeze(0)


def resample_pos_embed(
    pos_embed: torch.Tensor,
    new_size: int | tuple[int, int],
    old_size: int | tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
) -> torch.Tensor:
    """Resample a learned position grid to a new grid size with bicubic interpolation.

    Prefix-token positions (class, register tokens) are kept unchanged and put back in front.

    Args:
        pos_embed: Table of shape ``(1, num_prefix_tokens + old_rows * old_cols, C)``.
        new_size: Target grid ``(rows, cols)``.
        old_size: Source grid; inferred as square when omitted.
        num_prefix_tokens: Number of leading rows that are not grid positions.

    Returns:
        Tensor of shape ``(1, num_prefix_tokens + new_rows * new_cols, C)``.
    """
    new_rows, new_cols = to_2tuple(new_size)
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    num_positions = grid.shape[1]
    if old_size is None:
        side = int(round(num_positions**0.5))
        if side * side != num_positions:
            raise ValueError(f"cannot infer a square grid from {num_positions} positions: pass old_size")
        old_size = (side, side)
    old_rows, old_cols = to_2tuple(old_size)
    if old_rows * old_cols != num_positions:
        raise ValueError(f"old_size {(old_rows, old_cols)} does not match {num_positions} grid positions")
    if (old_rows, old_cols) == (new_rows, new_cols):
        return pos_embed
    C = grid.shape[-1]
    dtype = grid.dtype
    grid = grid.float().reshape(1, old_rows, old_cols, C).permute(0, 3, 1, 2)  # (1, C, rows, cols)
    grid = F.interpolate(grid, size=(new_rows, new_cols), mode="bicubic", antialias=True, align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_rows * new_cols, C).to(dtype)
    return torch.cat([prefix, grid], dim=1)
