"""Local-window self-attention with global prefix tokens, optionally with Swin-style shifted windows.

The patch grid is cut into non-overlapping ``w × w`` windows (Liu et al., "Swin Transformer", ICCV 2021);
each patch token attends to the patches of its own window and to every prefix token (class / register
tokens), while prefix tokens attend to all tokens. Window and global blocks are interleaved as in ViTDet
(Li et al., "Exploring Plain Vision Transformer Backbones for Object Detection", ECCV 2022).

Cost is linear in the number of patches: windows are gathered into the batch dimension and attended with
:func:`torch.nn.functional.scaled_dot_product_attention`; no ``N × N`` mask or score matrix exists on the
training path. A grid that ``w`` does not divide is padded; padded slots never receive attention weight.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import Attention
from .utils import to_2tuple


def window_band_labels(grid_size: int | tuple[int, int], window_size: int, shift: int = 0) -> torch.Tensor:
    """Window id of every patch in original grid coordinates, row-major ``(rows * cols,)``.

    Window boundaries sit at ``shift + k·window_size`` along each axis, so with a shift the first
    ``shift`` rows (and columns) form a window band of their own instead of wrapping around to the end.
    """
    rows, cols = to_2tuple(grid_size)
    band_r = (torch.arange(rows) - shift + window_size) // window_size
    band_c = (torch.arange(cols) - shift + window_size) // window_size
    num_bands_c = (cols - 1 - shift + window_size) // window_size + 1
    return (band_r[:, None] * num_bands_c + band_c[None, :]).flatten()


def window_attention_mask(
    grid_size: int | tuple[int, int], window_size: int, shift: int = 0, num_prefix_tokens: int = 0
) -> torch.Tensor:
    """Dense boolean pattern ``(N, N)`` (True = may attend) of a window block over the full sequence.

    Prefix rows and columns are all True; a patch attends to a patch of the same window only.
    """
    labels = window_band_labels(grid_size, window_size, shift)
    n = num_prefix_tokens + labels.numel()
    mask = torch.ones(n, n, dtype=torch.bool)
    mask[num_prefix_tokens:, num_prefix_tokens:] = labels[:, None] == labels[None, :]
    return mask


class WindowAttention(Attention):
    """Multi-head attention restricted to ``window_size × window_size`` windows of the patch grid.

    Has exactly the parameters of :class:`Attention` (``qkv``, ``proj``, optional ``q_norm``/``k_norm``), so a
    global checkpoint loads into a windowed model strictly.

    Args:
        dim: Token width.
        num_heads: Number of heads; must divide ``dim``.
        grid_size: Patch grid ``(rows, cols)``.
        window_size: Window side in patches; at most the smaller grid side.
        shift: Cyclic shift of the window grid in patches (Swin); 0 for none, typically ``window_size // 2``.
        num_prefix_tokens: Number of class and register tokens at the start of the sequence.
        **kwargs: Passed to :class:`Attention` (``qkv_bias``, ``qk_norm``, ``attn_drop``, ``proj_drop``,
            ``norm_layer``, ``fused_attn``).

    Raises:
        ValueError: If ``window_size`` is not positive, exceeds the grid, or ``shift`` is outside the window.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        grid_size: int | tuple[int, int],
        window_size: int,
        shift: int = 0,
        num_prefix_tokens: int = 1,
        **kwargs,
    ) -> None:
        super().__init__(dim, num_heads, **kwargs)
        rows, cols = self.grid_size = to_2tuple(grid_size)
        if window_size <= 0:
            raise ValueError(f"window_size must be positive, got {window_size}")
        if window_size > min(rows, cols):
            raise ValueError(
                f"window_size {window_size} is larger than the patch grid {rows}x{cols}: use window_size <= "
                f"{min(rows, cols)}, or window_size=0 for global attention"
            )
        if not 0 <= shift < window_size:
            raise ValueError(f"shift must be in [0, window_size={window_size}), got {shift}")
        self.window_size = window_size
        self.shift = shift
        self.num_prefix_tokens = num_prefix_tokens

        # Slot s of the windowed layout holds token window_index[s] (rows*cols = the zero padding token).
        w = window_size
        pad_rows, pad_cols = -(-rows // w) * w, -(-cols // w) * w
        r = ((torch.arange(pad_rows) + shift) % pad_rows).reshape(pad_rows // w, 1, w, 1)  # rolled -> padded row
        c = ((torch.arange(pad_cols) + shift) % pad_cols).reshape(1, pad_cols // w, 1, w)
        real = (r < rows) & (c < cols)  # broadcasts to (win_r, win_c, i, j), the slot order
        window_index = torch.where(real, r * cols + c, rows * cols).reshape(-1)
        self.num_windows = (pad_rows // w) * (pad_cols // w)
        self.padded = (pad_rows, pad_cols) != (rows, cols)
        token_index = torch.empty(rows * cols, dtype=torch.long)
        is_real = window_index < rows * cols
        token_index[window_index[is_real]] = torch.arange(window_index.numel())[is_real]
        self.register_buffer("window_index", window_index, persistent=False)
        self.register_buffer("token_index", token_index, persistent=False)

        mask = None
        if shift or self.padded:
            labels = window_band_labels(self.grid_size, w, shift)
            slot_labels = torch.cat([labels, torch.tensor([-1])])[window_index]
            slot_labels = torch.where(is_real, slot_labels, -2 - torch.arange(window_index.numel()))  # pads: unique
            slot_labels = slot_labels.reshape(self.num_windows, w * w)
            patch_mask = slot_labels[:, :, None] == slot_labels[:, None, :]  # (windows, w², w²)
            prefix_mask = torch.ones(self.num_windows, w * w, num_prefix_tokens, dtype=torch.bool)
            mask = torch.cat([prefix_mask, patch_mask], dim=2)  # (windows, w², prefix + w²)
        self.register_buffer("window_mask", mask, persistent=False)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attend within windows; ``x`` is ``(B, prefix + rows * cols, C)``."""
        if attn_mask is not None:
            raise ValueError("WindowAttention builds its own mask; attn_mask is not supported")
        B, N, C = x.shape
        P, L, h, d = self.num_prefix_tokens, self.window_size**2, self.num_heads, self.head_dim
        nw = self.num_windows
        qkv = self.qkv(x)  # (B, N, 3C)

        # Patch queries: gather windows into the batch dimension.
        patches = qkv[:, P:]
        if self.padded:
            patches = nn.functional.pad(patches, (0, 0, 0, 1))  # one zero token that padded slots point at
        win = patches.index_select(1, self.window_index)  # (B, windows * L, 3C)
        win = win.view(B * nw, L, 3, h, d).permute(2, 0, 3, 1, 4)
        q_w, k_w, v_w = win.unbind(0)  # (B * windows, heads, L, head_dim)
        q_w, k_w = self.q_norm(q_w), self.k_norm(k_w)
        mask = self.window_mask
        if mask is not None:
            mask = mask.unsqueeze(0).expand(B, -1, -1, -1).reshape(B * nw, 1, L, P + L)
        if P:
            pre = qkv[:, :P].view(B, P, 3, h, d).permute(2, 0, 3, 1, 4)
            q_p, k_p, v_p = pre.unbind(0)  # (B, heads, P, head_dim)
            q_p, k_p = self.q_norm(q_p), self.k_norm(k_p)
            # Every window also sees the prefix keys: (B * windows, heads, P + L, head_dim)
            k_w = torch.cat([k_p.unsqueeze(1).expand(B, nw, h, P, d).reshape(B * nw, h, P, d), k_w], dim=2)
            v_w = torch.cat([v_p.unsqueeze(1).expand(B, nw, h, P, d).reshape(B * nw, h, P, d), v_w], dim=2)
        out = self.attend(q_w, k_w, v_w, mask)  # (B * windows, heads, L, head_dim)
        out = out.transpose(1, 2).reshape(B, nw * L, C).index_select(1, self.token_index)  # (B, rows*cols, C)

        if P:
            # Prefix queries attend to every token: cost O(P · N).
            _, k, v = self.split_qkv(qkv)
            out_p = self.attend(q_p, k, v)  # (B, heads, P, head_dim)
            out = torch.cat([out_p.transpose(1, 2).reshape(B, P, C), out], dim=1)
        return self.proj_drop(self.proj(out))

    def dense_mask(self) -> torch.Tensor:
        """The block's allowed pattern over the full sequence, ``(N, N)`` boolean, on the block's device."""
        mask = window_attention_mask(self.grid_size, self.window_size, self.shift, self.num_prefix_tokens)
        return mask.to(self.window_index.device)

    def attention_weights(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense ``(B, heads, N, N)`` weights: zero outside the window pattern, each row summing to 1. Slow."""
        return super().attention_weights(x, self.dense_mask())
