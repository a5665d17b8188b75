"""Local-window self-attention with global prefix tokens, optionally with Swin-style shifted windows.

The patch grid is cut into non-overlapping ``w × w`` windows (Liu et al., "Swin Transformer", ICCV 2021);
each patch token attends to the patches of its own window and to every prefix token (class / register
tokens), while prefix tokens attend to all tokens. Window and global blocks are interleaved as in ViTDet
(Li et al., "Exploring Plain Vision Transformer Backbones for Object Detection", ECCV 2022).

Cost is linear in the number of patches. Window boundaries sit at ``shift + k·w``; windows at the grid's edges
(and the first band of a shifted grid) are smaller, so a grid that ``w`` does not divide needs neither padding nor
a mask. Windows with the same number of patches, each with its own copy of the prefix keys, are gathered into the
batch dimension by one ``index_select`` and attended with :func:`torch.nn.functional.scaled_dot_product_attention`
(one call per window size, at most nine); no ``N × N`` mask or score matrix exists on the training path.
The layout is built once for the model's grid, and once per other grid it meets (a dynamic image size), then cached
(the :data:`LAYOUT_CACHE_SIZE` most recently used grids).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import NamedTuple

import torch

from .attention import Attention
from .utils import check_num_tokens, lru_get, to_2tuple

torch.fx.wrap("check_num_tokens")  # a leaf of traced graphs, which run it


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


def _window_bands(size: int, window_size: int, shift: int = 0) -> list[tuple[int, int]]:
    """``(start, stop)`` of the window bands along one axis of ``size`` patches: boundaries at ``shift + k·w``."""
    edges = sorted({0, size, *range(shift or window_size, size, window_size)})
    return list(itertools.pairwise(edges))


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


LAYOUT_CACHE_SIZE = 8
"""Layouts of other grids than the model's kept per layer (least recently used dropped): many input sizes must not
grow memory without bound."""


class WindowLayout(NamedTuple):
    """Where the windows of one grid read from and write to (see :func:`window_layout`)."""

    groups: list[tuple[int, int]]  # (windows, patches per window) per group of equal-sized windows
    gather_index: torch.Tensor  # sequence positions each window reads, prefix copies first, all groups concatenated
    group_start: torch.Tensor  # (rows * cols,) first output row of each patch's group, per image
    group_size: torch.Tensor  # (rows * cols,) output rows of each patch's group, per image
    group_pos: torch.Tensor  # (rows * cols,) row of each patch within its group


def window_layout(
    grid_size: tuple[int, int], window_size: int, shift: int, num_prefix_tokens: int, device: torch.device | None = None
) -> WindowLayout:
    """Group the windows of a grid by size and index them for one gather and one scatter.

    Windows with the same number of patches form a group, ``(windows, patches per window)``, attended in one batched
    call: at most four groups unshifted (full, right edge, bottom edge, corner), nine shifted.

    Raises:
        ValueError: If ``window_size`` exceeds a side of the grid.
    """
    rows, cols = grid_size
    if window_size > min(rows, cols):
        raise ValueError(
            f"window_size {window_size} is larger than the patch grid {rows}x{cols}: use window_size <= "
            f"{min(rows, cols)} (or a larger image), or window_size=0 for global attention"
        )
    P = num_prefix_tokens
    by_size: dict[int, list[torch.Tensor]] = {}
    for r0, r1 in _window_bands(rows, window_size, shift):
        for c0, c1 in _window_bands(cols, window_size, shift):
            patches = (torch.arange(r0, r1)[:, None] * cols + torch.arange(c0, c1)[None, :]).flatten()
            by_size.setdefault(patches.numel(), []).append(patches)
    groups: list[tuple[int, int]] = []
    gather, start = [], 0
    group_start, group_size, group_pos = (torch.empty(rows * cols, dtype=torch.long) for _ in range(3))
    for windows in by_size.values():
        patches = torch.stack(windows)  # (windows, L) patch ids, row-major inside each window
        n, L = patches.shape
        groups.append((n, L))
        # Sequence positions each window reads, its own copy of the prefix tokens first: (windows, P + L).
        gather.append(torch.cat([torch.arange(P).expand(n, P), patches + P], dim=1).flatten())
        group_start[patches.flatten()] = start  # where the group's outputs start (per image, in patches)
        group_size[patches.flatten()] = n * L
        group_pos[patches.flatten()] = torch.arange(n * L)
        start += n * L
    tensors = (torch.cat(gather), group_start, group_size, group_pos)
    return WindowLayout(groups, *(t.to(device) for t in tensors))


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
        self.grid_size = to_2tuple(grid_size)
        if window_size <= 0:
            raise ValueError(f"window_size must be positive, got {window_size}")
        if not 0 <= shift < window_size:
            raise ValueError(f"shift must be in [0, window_size={window_size}), got {shift}")
        self.window_size = window_size
        self.shift = shift
        self.num_prefix_tokens = num_prefix_tokens

        layout = window_layout(self.grid_size, window_size, shift, num_prefix_tokens)
        self.groups = layout.groups
        self.num_windows = sum(n for n, _ in self.groups)
        # The model's grid as buffers (they follow .to()); other grids' layouts are built on first use and cached.
        self.register_buffer("gather_index", layout.gather_index, persistent=False)
        self.register_buffer("group_start", layout.group_start, persistent=False)
        self.register_buffer("group_size", layout.group_size, persistent=False)
        self.register_buffer("group_pos", layout.group_pos, persistent=False)
        self._layouts: OrderedDict[tuple[int, int, str], WindowLayout] = OrderedDict()

    def layout(self, grid_size: tuple[int, int] | None, device: torch.device) -> WindowLayout:
        """The window layout of ``grid_size`` (the model's grid when ``None``) on ``device``; built once per grid
        (of the :data:`LAYOUT_CACHE_SIZE` most recent).

        Raises:
            ValueError: If the window does not fit in ``grid_size``.
        """
        if grid_size is None or tuple(grid_size) == self.grid_size:
            buffers = (self.gather_index, self.group_start, self.group_size, self.group_pos)
            return WindowLayout(self.groups, *buffers)
        return lru_get(
            self._layouts,
            (*grid_size, str(device)),
            lambda: window_layout(to_2tuple(grid_size), self.window_size, self.shift, self.num_prefix_tokens, device),
            LAYOUT_CACHE_SIZE,
        )

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, grid_size: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """Attend within windows; ``x`` is ``(B, prefix + rows * cols, C)`` over ``grid_size`` (default: the
        layer's grid)."""
        if attn_mask is not None:
            raise ValueError("WindowAttention builds its own pattern; attn_mask is not supported")
        x = check_num_tokens(x, grid_size or self.grid_size, self.num_prefix_tokens, "WindowAttention")
        B, N, C = x.shape
        P, h, d = self.num_prefix_tokens, self.num_heads, self.head_dim
        layout = self.layout(grid_size, x.device)
        qkv = self.qkv(x).reshape(B * N, 3 * C)
        batch = torch.arange(B, device=x.device)[:, None]

        # One gather for all windows, ordered (group, image, window, slot) so that each group is one block.
        slots = layout.gather_index.split([n * (P + L) for n, L in layout.groups])
        win = qkv.index_select(0, torch.cat([(batch * N + s).flatten() for s in slots]))
        outs = []
        chunks = win.split([B * n * (P + L) for n, L in layout.groups])  # indexed, not zipped: torch.fx traces it
        for i, (n, L) in enumerate(layout.groups):
            q, k, v = chunks[i].view(B * n, P + L, 3, h, d).unbind(2)  # (B * windows, P + L, heads, head_dim)
            q = self.q_norm(q[:, P:].transpose(1, 2))  # (B * windows, heads, L, head_dim): patch queries only
            k, v = self.k_norm(k.transpose(1, 2)), v.transpose(1, 2)  # the window's prefix copies first: offset P
            out = self.attend(q, k, v, offset=P)  # (B * windows, heads, L, head_dim)
            outs.append(out.transpose(1, 2).reshape(B * n * L, C))
        # Row of the concatenated outputs holding patch t of image b: (B, rows * cols).
        place = B * (P + layout.group_start) + batch * layout.group_size + layout.group_pos

        if P:
            # Prefix queries attend to every token: cost O(P · N).
            q, k, v = qkv.view(B, N, 3, h, d).unbind(2)  # (B, N, heads, head_dim)
            q_p = self.q_norm(q[:, :P].transpose(1, 2))  # (B, heads, P, head_dim)
            out_p = self.attend(q_p, self.k_norm(k.transpose(1, 2)), v.transpose(1, 2))  # (B, heads, P, head_dim)
            outs.insert(0, out_p.transpose(1, 2).reshape(B * P, C))
            place = torch.cat([batch * P + torch.arange(P, device=x.device), place], dim=1)
        out = torch.cat(outs).index_select(0, place.flatten()).view(B, N, C)  # back to sequence order
        return self.proj_drop(self.proj(out))

    def dense_mask(self, grid_size: tuple[int, int] | None = None) -> torch.Tensor:
        """The block's allowed pattern over the full sequence, ``(N, N)`` boolean, on the block's device."""
        grid = grid_size or self.grid_size
        mask = window_attention_mask(grid, self.window_size, self.shift, self.num_prefix_tokens)
        return mask.to(self.gather_index.device)

    def attention_weights(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, grid_size: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """Dense ``(B, heads, N, N)`` weights: zero outside the window pattern, each row summing to 1. Slow."""
        return super().attention_weights(x, self.dense_mask(grid_size))
