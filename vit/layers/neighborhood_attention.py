"""Sliding-window (neighbourhood) self-attention over the patch grid, with global prefix tokens.

Each patch attends to the ``k × k`` patches around it (Hassani et al., "Neighborhood Attention Transformer",
CVPR 2023): near the border the window shifts inward, so every patch query sees exactly ``k × k`` patches. With
dilation ``d`` (Hassani & Shi, "Dilated Neighborhood Attention Transformer", 2022) the neighbours sit at stride
``d`` inside the query's own residue class (rows ``i ≡ r (mod d)``), with the same border rule inside that class.
Prefix tokens (class / register) attend to every token and every token attends to them.

Three exact, linear-cost paths, none of which builds an ``N × N`` mask or score matrix:

* CPU, fp32: a fused kernel (:mod:`vit.kernels.neighborhood`, compiled by the first forward that runs it, never
  when a layer is built) in which every patch query scores exactly its ``k²`` neighbours and the prefix keys, forward
  and backward. Trains on the CPU.
* Any device: the queries are cut into ``t × t`` tiles (inside one residue class); each tile attends to its halo of
  at most ``(t + k - 1)²`` keys plus the prefix keys, with an additive 0 / -inf mask per tile (it depends only on
  where the tile sits relative to the border), all tiles batched through one
  :func:`torch.nn.functional.scaled_dot_product_attention` call. The CPU's fallback (no C++ compiler, autocast,
  dtypes other than fp32, attention dropout, ``torch.func`` transforms) and, with ``fused_attn=False``, the
  explicit softmax.
* CUDA: :func:`torch.nn.attention.flex_attention` with a ``BlockMask`` built once per (grid, k, d, prefix, device)
  and shared by every block with that geometry; the tiled path is the fallback (attention dropout, or
  ``fused_attn=False``).

The index tables of every path are built once for the model's grid, and once per other grid the layer meets (a
dynamic image size), then cached (the ``LAYOUT_CACHE_SIZE`` most recently used grids, as window attention).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..kernels import neighborhood as neighborhood_kernel
from .attention import Attention
from .utils import check_num_tokens, lru_get, to_2tuple
from .window_attention import LAYOUT_CACHE_SIZE

torch.fx.wrap("check_num_tokens")  # a leaf of traced graphs, which run it

try:
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
except ImportError:  # pragma: no cover - torch without FlexAttention: the tiled path everywhere
    flex_attention = None

# (rows, cols, k, d, prefix, device) -> BlockMask, shared by blocks; the most recently used few only.
_BLOCK_MASKS: OrderedDict[tuple, BlockMask] = OrderedDict()
BLOCK_MASK_CACHE_SIZE = 4 * LAYOUT_CACHE_SIZE
_compiled_flex = None


def write_tokens(y: torch.Tensor, tokens: torch.Tensor, start: int, stop: int | None) -> torch.Tensor:
    """``y (B, N, C)`` with ``tokens`` (``B`` first, then the tokens' positions, then their ``C`` features, in any
    shape that views ``y[:, start:stop]``) written into ``y[:, start:stop]``: in place, as one copy; in a torch.fx
    trace out of place (``slice_scatter``), since a traced graph's dead-code elimination drops an in-place write whose
    result nothing reads (torchvision's feature extractors run it)."""
    if isinstance(y, torch.fx.Proxy):
        return y.slice_scatter(tokens.reshape(tokens.shape[0], -1, y.shape[2]), dim=1, start=start, end=stop)
    y[:, start:stop].view(tokens.shape).copy_(tokens)
    return y


def check_neighborhood(grid_size: int | tuple[int, int], kernel_size: int, dilation: int = 1) -> tuple[int, int]:
    """Validate a neighbourhood geometry and return the grid as ``(rows, cols)``.

    Raises:
        ValueError: Naming ``kernel_size`` (not positive or even), ``dilation`` (not positive), or both numbers
            when ``kernel_size · dilation`` exceeds a grid side.
    """
    rows, cols = to_2tuple(grid_size)
    if kernel_size <= 0 or kernel_size % 2 == 0:
        raise ValueError(
            f"kernel_size must be a positive odd number (a window centred on its patch), got {kernel_size}"
        )
    if dilation <= 0:
        raise ValueError(f"dilation must be positive, got {dilation}")
    if kernel_size * dilation > min(rows, cols):
        raise ValueError(
            f"kernel_size {kernel_size} x dilation {dilation} = {kernel_size * dilation} is larger than the patch "
            f"grid {rows}x{cols}: use kernel_size * dilation <= {min(rows, cols)}"
        )
    return rows, cols


def neighborhood_starts(length: int, kernel_size: int, dilation: int = 1) -> torch.Tensor:
    """First neighbour of every position along one axis, ``(length,)``; neighbours are ``start + d·j``, ``j < k``.

    Inside the residue class of position ``i`` (``length_r`` positions ``r, r + d, ...``), the window of ``k``
    class positions is centred on ``i`` and clamped into the class: ``clamp(i // d - k // 2, 0, length_r - k)``.
    """
    i = torch.arange(length)
    residue = i % dilation
    class_length = (length - residue + dilation - 1) // dilation
    start = torch.minimum((i // dilation - kernel_size // 2).clamp_min(0), class_length - kernel_size)
    return residue + dilation * start


def _axis_pattern(length: int, kernel_size: int, dilation: int) -> torch.Tensor:
    """``(length, length)`` boolean: entry ``[i, j]`` is True when ``j`` is a neighbour of ``i`` along the axis."""
    start = neighborhood_starts(length, kernel_size, dilation)[:, None]
    offset = torch.arange(length)[None, :] - start
    return (offset >= 0) & (offset < kernel_size * dilation) & (offset % dilation == 0)


def neighborhood_attention_mask(
    grid_size: int | tuple[int, int], kernel_size: int, dilation: int = 1, num_prefix_tokens: int = 0
) -> torch.Tensor:
    """Dense boolean pattern ``(N, N)`` (True = may attend) of a sliding-window block over the full sequence.

    Prefix rows and columns are all True; patch ``(r, c)`` attends to patch ``(r', c')`` when ``r'`` is a row
    neighbour of ``r`` and ``c'`` a column neighbour of ``c`` (see :func:`neighborhood_starts`).
    """
    rows, cols = check_neighborhood(grid_size, kernel_size, dilation)
    row, col = _axis_pattern(rows, kernel_size, dilation), _axis_pattern(cols, kernel_size, dilation)
    n, P = num_prefix_tokens + rows * cols, num_prefix_tokens
    mask = torch.ones(n, n, dtype=torch.bool)
    mask[P:, P:] = (row[:, None, :, None] & col[None, :, None, :]).reshape(rows * cols, rows * cols)
    return mask


def neighborhood_mask_mod(
    grid_size: int | tuple[int, int], kernel_size: int, dilation: int = 1, num_prefix_tokens: int = 0
):
    """FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` of the same pattern as :func:`neighborhood_attention_mask`."""
    rows, cols = check_neighborhood(grid_size, kernel_size, dilation)
    k, d, P = kernel_size, dilation, num_prefix_tokens

    def axis_neighbour(q: torch.Tensor, kv: torch.Tensor, length: int) -> torch.Tensor:
        residue = q % d
        class_length = (length - residue + d - 1) // d
        start = torch.minimum((q // d - k // 2).clamp_min(0), class_length - k)  # in class coordinates
        offset = kv // d - start
        return (kv % d == residue) & (offset >= 0) & (offset < k)

    def mask_mod(b, h, q_idx, kv_idx):
        q, kv = q_idx - P, kv_idx - P  # patch indices (negative for prefix tokens)
        patches = axis_neighbour(q // cols, kv // cols, rows) & axis_neighbour(q % cols, kv % cols, cols)
        return (q_idx < P) | (kv_idx < P) | patches

    return mask_mod


def _axis_tiles(length: int, kernel_size: int, dilation: int, tile: int) -> list[tuple[torch.Tensor, ...]]:
    """Query tiles along one axis: ``(queries (t,), keys (h,), mask (t, h))`` per tile, in axis positions.

    Tiles run inside one residue class; the last tile of a class is moved back to end at the class's end (it
    overlaps its neighbour, so every tile has ``t`` queries). A tile's keys are ``h = t + k - 1`` consecutive class
    positions that contain every query's window; a class shorter than that repeats its last key, masked out.
    """
    k, d = kernel_size, dilation
    starts = neighborhood_starts(length, k, d)
    t = min(tile, length // d)
    h = min(t + k - 1, -(-length // d))
    tiles = []
    for residue in range(d):
        class_length = (length - residue + d - 1) // d
        firsts = list(range(0, class_length - t + 1, t))
        if firsts[-1] + t < class_length:
            firsts.append(class_length - t)
        for first in firsts:
            queries = residue + d * (first + torch.arange(t))
            key_first = min(max(first - k // 2, 0), max(class_length - h, 0))
            key_class = key_first + torch.arange(h)
            keys = residue + d * key_class.clamp_max(class_length - 1)
            offset = (keys[None, :] - starts[queries][:, None]) // d
            mask = (key_class < class_length)[None, :] & (offset >= 0) & (offset < k)
            tiles.append((queries, keys, mask))
    return tiles


class NeighborhoodTables(NamedTuple):
    """The index tables of one grid (see :func:`neighborhood_tables`)."""

    grid_size: tuple[int, int]
    query_index: torch.Tensor  # (T * tq,) patch index of every tile query
    key_index: torch.Tensor  # (T * (P + tk),) sequence position of every tile key, the prefix keys first
    tile_mask: torch.Tensor  # (T, 1, tq, P + tk) additive 0 / -inf
    owner: torch.Tensor  # (rows * cols,) row of the tiles' T * tq outputs holding each patch
    neighbour_index: torch.Tensor  # (rows * cols, P + k²) the CPU kernel's table
    tile_grid: tuple[int, int, int, int] | None  # tiles that cut the grid exactly: (tile rows, tr, tile cols, tc)


def neighborhood_tables(
    grid_size: int | tuple[int, int],
    kernel_size: int,
    dilation: int,
    num_prefix_tokens: int,
    tile_size: tuple[int, int],
    device: torch.device | None = None,
) -> NeighborhoodTables:
    """The tiles of the tiled path and the neighbour table of the CPU kernel for one grid.

    Raises:
        ValueError: If ``kernel_size · dilation`` exceeds a side of the grid (see :func:`check_neighborhood`).
    """
    rows, cols = check_neighborhood(grid_size, kernel_size, dilation)
    tile_rows, tile_cols = tile_size
    P = num_prefix_tokens
    # 2-D tiles are pairs (row tile, column tile): queries (T, tq), keys (T, P + tk), mask (T, tq, P + tk).
    row_tiles = _axis_tiles(rows, kernel_size, dilation, tile_rows)
    col_tiles = _axis_tiles(cols, kernel_size, dilation, tile_cols)
    queries, keys, masks = [], [], []
    for row_q, row_k, row_m in row_tiles:
        for col_q, col_k, col_m in col_tiles:
            queries.append((row_q[:, None] * cols + col_q[None, :]).flatten())
            keys.append(torch.cat([torch.arange(P), P + (row_k[:, None] * cols + col_k[None, :]).flatten()]))
            patch_mask = (row_m[:, None, :, None] & col_m[None, :, None, :]).flatten(2).flatten(0, 1)
            masks.append(torch.cat([torch.ones(len(patch_mask), P, dtype=torch.bool), patch_mask], dim=1))
    # Tiles that cut the grid exactly (dilation 1, tile sides dividing the grid's) make the query gather a reshape:
    # (tile rows, tile height, tile columns, tile width).
    tr, tc = min(tile_rows, rows), min(tile_cols, cols)
    exact = dilation == 1 and rows % tr == 0 and cols % tc == 0
    query_index = torch.stack(queries)
    # The row of the tiles' T * tq outputs holding each patch (a later, overlapping tile wins).
    owner = torch.empty(rows * cols, dtype=torch.long)
    owner[query_index.flatten()] = torch.arange(query_index.numel())
    # Additive (0 / -inf): adding is faster than masked_fill on the CPU, in both the fused and explicit paths.
    tile_mask = torch.zeros(len(masks), 1, *masks[0].shape).masked_fill_(~torch.stack(masks)[:, None], -torch.inf)
    # The CPU kernel's table: the tokens each patch query attends to (prefix tokens, then its k x k neighbours).
    row_starts = neighborhood_starts(rows, kernel_size, dilation)[:, None] + dilation * torch.arange(kernel_size)
    col_starts = neighborhood_starts(cols, kernel_size, dilation)[:, None] + dilation * torch.arange(kernel_size)
    patches = P + (row_starts[:, None, :, None] * cols + col_starts[None, :, None, :]).reshape(rows * cols, -1)
    neighbours = torch.cat([torch.arange(P).expand(rows * cols, P), patches], dim=1)
    tensors = (query_index.flatten(), torch.stack(keys).flatten(), tile_mask, owner, neighbours)
    tile_grid = (rows // tr, tr, cols // tc, tc) if exact else None
    return NeighborhoodTables((rows, cols), *(t.to(device) for t in tensors), tile_grid)


class NeighborhoodAttention(Attention):
    """Multi-head attention of every patch to its ``k × k`` neighbourhood, plus global prefix tokens.

    Has exactly the parameters of :class:`Attention` (``qkv``, ``proj``, optional ``q_norm``/``k_norm``), so a
    global checkpoint (ours or timm's) loads strictly.

    Args:
        dim: Token width.
        num_heads: Number of heads; must divide ``dim``.
        grid_size: Patch grid ``(rows, cols)``.
        kernel_size: Window side ``k`` in patches; odd, with ``k · dilation`` at most the smaller grid side.
        dilation: Stride ``d`` between neighbours (DiNAT); 1 for a dense window.
        num_prefix_tokens: Number of class and register tokens at the start of the sequence.
        tile_size: Query tile side ``t`` of the tiled path, or ``(rows, cols)`` (8, the default, was the fastest
            measured on a CPU for k = 7 and 9 against 4, 6, 4x8, 8x4, 4x16 and 6x8).
        **kwargs: Passed to :class:`Attention` (``qkv_bias``, ``qk_norm``, ``attn_drop``, ``proj_drop``,
            ``norm_layer``, ``fused_attn``).

    Raises:
        ValueError: If ``kernel_size`` is even or not positive, ``dilation`` is not positive, or ``k · d`` exceeds a
            grid side.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        grid_size: int | tuple[int, int],
        kernel_size: int,
        dilation: int = 1,
        num_prefix_tokens: int = 1,
        tile_size: int | tuple[int, int] = 8,
        **kwargs,
    ) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.grid_size = check_neighborhood(grid_size, kernel_size, dilation)
        tile_rows, tile_cols = self.tile_size = to_2tuple(tile_size)
        if tile_rows <= 0 or tile_cols <= 0:
            raise ValueError(f"tile_size must be positive, got {tile_size}")
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.num_prefix_tokens = num_prefix_tokens
        tables = neighborhood_tables(self.grid_size, kernel_size, dilation, num_prefix_tokens, self.tile_size)
        self.tile_grid = tables.tile_grid
        self.num_tiles, self.tile_queries = tables.tile_mask.shape[0], tables.tile_mask.shape[2]
        # The model's grid as buffers (they follow .to()); other grids' tables are built on first use and cached.
        self.register_buffer("query_index", tables.query_index, persistent=False)
        self.register_buffer("key_index", tables.key_index, persistent=False)
        self.register_buffer("tile_mask", tables.tile_mask, persistent=False)  # (T, 1, tq, P + tk)
        self.register_buffer("owner", tables.owner, persistent=False)
        self.register_buffer("neighbour_index", tables.neighbour_index, persistent=False)  # (rows * cols, P + k²)
        self._tables: OrderedDict[tuple[int, int, str], NeighborhoodTables] = OrderedDict()

    def tables(self, grid_size: tuple[int, int] | None, device: torch.device) -> NeighborhoodTables:
        """The index tables of ``grid_size`` (the layer's grid when ``None``) on ``device``; built once per grid
        (of the :data:`LAYOUT_CACHE_SIZE` most recent).

        Raises:
            ValueError: If ``kernel_size · dilation`` exceeds a side of ``grid_size``.
        """
        if grid_size is None or tuple(grid_size) == self.grid_size:
            buffers = (self.query_index, self.key_index, self.tile_mask, self.owner, self.neighbour_index)
            return NeighborhoodTables(self.grid_size, *buffers, self.tile_grid)
        return lru_get(
            self._tables,
            (*grid_size, str(device)),
            lambda: neighborhood_tables(
                grid_size, self.kernel_size, self.dilation, self.num_prefix_tokens, self.tile_size, device
            ),
            LAYOUT_CACHE_SIZE,
        )

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, grid_size: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """Attend within neighbourhoods; ``x`` is ``(B, prefix + rows * cols, C)`` over ``grid_size`` (default: the
        layer's grid)."""
        if attn_mask is not None:
            raise ValueError("NeighborhoodAttention builds its own pattern; attn_mask is not supported")
        x = check_num_tokens(x, grid_size or self.grid_size, self.num_prefix_tokens, "NeighborhoodAttention")
        args = (x,) if grid_size is None else (x, grid_size)  # the layer's own grid: the one-argument call, as ever
        # The fused paths have no attention dropout, and fused_attn=False means the tiled path's explicit softmax. A
        # torch.fx trace knows no device yet: its graph takes the tiled path, which runs on any.
        fused = self.fused_attn and not (self.training and self.attn_drop.p > 0) and not isinstance(x, torch.fx.Proxy)
        if fused and x.is_cuda and flex_attention is not None:
            return self.forward_flex(*args)
        if fused and x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_autocast_enabled("cpu"):
            # The kernel has an autograd formula only: torch.func transforms (jvp, grad, vmap) take the tiled path.
            functorch = not torch.compiler.is_compiling() and torch._C._are_functorch_transforms_active()
            # ready() builds or loads the kernel on the first call (about 2 s, once per machine; under torch.compile
            # while tracing), logs once and answers False where it cannot be built: then the tiled path runs.
            if not functorch and neighborhood_kernel.ready():
                return self.forward_kernel(*args)
        return self.forward_tiled(*args)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v, each ``(B, N, C)`` and contiguous, as three products of the ``qkv`` weight's thirds.

        Three products rather than one split: the backward of a split (or unbind) concatenates the gradients into a
        copy as large as q, k and v together. Measured on the CPU, as every choice in the CPU paths.
        """
        w_q, w_k, w_v = self.qkv.weight.chunk(3)
        b_q, b_k, b_v = self.qkv.bias.chunk(3) if self.qkv.bias is not None else (None, None, None)
        return F.linear(x, w_q, b_q), F.linear(x, w_k, b_k), F.linear(x, w_v, b_v)

    def forward_kernel(self, x: torch.Tensor, grid_size: tuple[int, int] | None = None) -> torch.Tensor:
        """The CPU kernel's path (fp32): every query scores exactly its neighbours; prefix queries all tokens."""
        B, N, C = x.shape
        neighbour_index = self.tables(grid_size, x.device).neighbour_index
        q, k, v = (t.view(B, N, self.num_heads, self.head_dim) for t in self.project(x))
        out, _, _ = neighborhood_kernel.neighborhood_attention_cpu(
            self.q_norm(q), self.k_norm(k), v, neighbour_index, self.num_prefix_tokens, self.scale
        )
        return self.proj_drop(self.proj(out.view(B, N, C)))

    def forward_tiled(self, x: torch.Tensor, grid_size: tuple[int, int] | None = None) -> torch.Tensor:
        """The tiled path (any device): each query tile attends to its halo and the prefix keys."""
        B, N, C = x.shape
        tables = self.tables(grid_size, x.device)
        T, _, tq, _ = tables.tile_mask.shape
        P, h, hd = self.num_prefix_tokens, self.num_heads, self.head_dim
        q_all, k_all, v_all = self.project(x)  # (B, N, C)
        q_p, q_all = q_all.split([P, N - P], dim=1)  # prefix and patch queries (a split's backward: one copy)
        if tables.tile_grid is not None:  # the tiles are a permutation of the patches: reshape, no index
            q = q_all.reshape(B, *tables.tile_grid, h, hd).permute(0, 1, 3, 5, 2, 4, 6)
        else:
            q = q_all.index_select(1, tables.query_index).view(B, T, tq, h, hd).transpose(2, 3)
        q = q.reshape(B * T, h, tq, hd)
        k, v = (t.index_select(1, tables.key_index).view(B * T, -1, h, hd).transpose(1, 2) for t in (k_all, v_all))
        # 4-D with the mask repeated per image: the CPU's fused kernel is slower on 5-D inputs.
        # broadcast_to, not the buffer's expand: torch.fx traces a torch function of the traced batch size
        mask = torch.broadcast_to(tables.tile_mask, (B, *tables.tile_mask.shape)).flatten(
            0, 1
        )  # (B * T, 1, tq, P + tk)
        out = self.attend(self.q_norm(q), self.k_norm(k), v, mask)  # (B * T, heads, tq, head_dim)
        # Written once into the output in sequence order (a concatenation and a gather were two more copies).
        y = out.new_empty(B, N, C)  # the attention's dtype (bf16 under autocast), as the projection wants it
        if tables.tile_grid is not None:
            nr, tr, nc, tc = tables.tile_grid
            tiles = out.view(B, nr, nc, h, tr, tc, hd).permute(0, 1, 4, 2, 5, 3, 6)  # (B, nr, tr, nc, tc, heads, hd)
            y = write_tokens(y, tiles, P, None)
        else:
            y = write_tokens(y, out.transpose(1, 2).reshape(B, T * tq, C).index_select(1, tables.owner), P, None)
        if P:
            # Prefix queries attend to every token: cost O(P · N).
            q_p = self.q_norm(q_p.reshape(B, P, h, hd).transpose(1, 2))  # (B, heads, P, head_dim)
            k_all, v_all = (t.view(B, N, h, hd).transpose(1, 2) for t in (k_all, v_all))  # (B, heads, N, head_dim)
            y = write_tokens(y, self.attend(q_p, self.k_norm(k_all), v_all).transpose(1, 2), 0, P)
        return self.proj_drop(self.proj(y))

    def block_mask(self, device: torch.device, grid_size: tuple[int, int] | None = None) -> BlockMask:
        """The FlexAttention ``BlockMask`` of this geometry on ``device`` (over ``grid_size``, default the layer's
        grid), built once and shared across blocks."""
        rows, cols = grid = grid_size or self.grid_size
        key = (rows, cols, self.kernel_size, self.dilation, self.num_prefix_tokens, str(device))

        def build() -> BlockMask:
            n = self.num_prefix_tokens + rows * cols
            mask_mod = neighborhood_mask_mod(grid, self.kernel_size, self.dilation, self.num_prefix_tokens)
            return create_block_mask(mask_mod, None, None, n, n, device=device)

        return lru_get(_BLOCK_MASKS, key, build, BLOCK_MASK_CACHE_SIZE)

    def forward_flex(self, x: torch.Tensor, grid_size: tuple[int, int] | None = None) -> torch.Tensor:
        """The FlexAttention path (CUDA; on the CPU it runs for tests, forward only)."""
        global _compiled_flex
        B, N, C = x.shape
        q, k, v = self.split_qkv(self.qkv(x))  # (B, heads, N, head_dim)
        attend = flex_attention
        if x.is_cuda and not torch.compiler.is_compiling():
            _compiled_flex = _compiled_flex or torch.compile(flex_attention)  # the fused kernel needs compile
            attend = _compiled_flex
        mask = self.block_mask(x.device, grid_size)
        out = attend(q, k, v, block_mask=mask, scale=self.scale)  # (B, heads, N, head_dim)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, N, C)))

    def dense_mask(self, grid_size: tuple[int, int] | None = None) -> torch.Tensor:
        """The block's allowed pattern over the full sequence, ``(N, N)`` boolean, on the block's device."""
        grid = grid_size or self.grid_size
        mask = neighborhood_attention_mask(grid, self.kernel_size, self.dilation, self.num_prefix_tokens)
        return mask.to(self.owner.device)

    def attention_weights(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, grid_size: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """Dense ``(B, heads, N, N)`` weights: zero outside the neighbourhood pattern, rows summing to 1. Slow."""
        return super().attention_weights(x, self.dense_mask(grid_size))
