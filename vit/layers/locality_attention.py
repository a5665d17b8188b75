"""Locality self-attention (LSA): attention that cannot look at itself, with a learned temperature per head.

Lee, Lee & Song, "Vision Transformer for Small-Size Datasets" (2021), Sec. 3.2. Two changes to the softmax of
:class:`~vit.layers.Attention`, nothing else:

* **Diagonal masking.** The score of every token with itself is set to ``-inf`` before the softmax, so each token's
  weights spread over the *other* tokens. A token's query and key are projections of the same vector, so ``q_i · k_i``
  is usually the largest score of its row; on small data the softmax then concentrates on the token itself and the
  attention mixes little. The residual connection still carries the token's own value forward.
* **Learned temperature.** ``softmax(q kᵀ · s_h)`` with one learned scale ``s_h`` per head (the inverse of the
  paper's temperature ``τ``), initialised at the fixed ``head_dim ** -0.5``; the official code learns the multiplier
  directly, as here. A head whose scale grows sharpens its attention (more local), one whose scale shrinks flattens
  it. The scale is 1-D, so AdamW gives it no weight decay (:func:`vit.optim.param_groups`).

The authors report about +1 point on CIFAR-10 and +3 on CIFAR-100 for ViTs trained from scratch, at no extra cost:
the mask is additive and the scale multiplies the queries, so the fused kernel
(:func:`torch.nn.functional.scaled_dot_product_attention`) stays in use, with an additive ``0 / -inf`` mask.

Window blocks (:class:`~vit.layers.WindowAttention`) mask the diagonal inside each window; a window holding one patch
and no prefix token would then have nothing to attend to and is refused. Sliding windows and linear attention are not
supported (:class:`~vit.VisionTransformer` refuses them): the first's fused paths have no per-token mask, the second
has no softmax.

A model built without it has exactly the parameters of timm's; with it, each block's attention gains one parameter,
``logit_scale`` ``(heads,)``.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import Attention
from .window_attention import WindowAttention, WindowLayout


@torch.fx.wrap  # a leaf of torch.fx graphs: the sizes are numbers only when it runs
def locality_mask(
    q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None = None, offset: int = 0
) -> torch.Tensor:
    """The additive mask ``(..., L, S)`` in ``q``'s dtype: ``-inf`` where query ``i`` meets its own key ``offset + i``,
    plus ``attn_mask`` (boolean: ``-inf`` where False; additive: added).

    Args:
        q: Queries ``(..., L, head_dim)``.
        k: Keys ``(..., S, head_dim)``.
        attn_mask: A mask broadcastable to ``(..., L, S)``, or ``None``.
        offset: Position among the keys of the first query's own token.
    """
    L, S = q.shape[-2], k.shape[-2]
    own = torch.arange(L, device=q.device)[:, None] + offset == torch.arange(S, device=q.device)  # (L, S)
    mask = torch.zeros(L, S, dtype=q.dtype, device=q.device).masked_fill(own, float("-inf"))  # out of place: ONNX
    if attn_mask is None:
        return mask
    if attn_mask.dtype == torch.bool:
        return mask.masked_fill(~attn_mask, float("-inf"))
    return mask + attn_mask.to(q.dtype)


class LocalityMixin(nn.Module):
    """The two changes of locality self-attention (module docstring) on an attention whose :meth:`attend` and
    :meth:`weights` it wraps: the queries are multiplied by ``logit_scale / scale`` (the softmax's own ``scale`` then
    gives ``q kᵀ · logit_scale``) and the diagonal is masked."""

    num_heads: int
    head_dim: int
    scale: float

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.logit_scale = nn.Parameter(torch.full((self.num_heads,), self.head_dim**-0.5))

    def locality(
        self, q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None, offset: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries ``(..., heads, L, head_dim)`` rescaled per head, and the mask with the diagonal out."""
        factor = (self.logit_scale / self.scale).to(q.dtype)[:, None, None]  # (heads, 1, 1)
        return q * factor, locality_mask(q, k, attn_mask, offset)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        offset: int = 0,
    ) -> torch.Tensor:
        """:meth:`AttentionBase.attend <vit.layers.AttentionBase.attend>` with the diagonal masked and the learned
        scale; the fused kernel stays in use (an additive mask)."""
        q, mask = self.locality(q, k, attn_mask, offset)
        return super().attend(q, k, v, mask)

    def weights(
        self, q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None = None, offset: int = 0
    ) -> torch.Tensor:
        """The dense weights :meth:`attend` applies: zero on the diagonal, rows summing to 1."""
        q, mask = self.locality(q, k, attn_mask, offset)
        return super().weights(q, k, mask)


class LocalityAttention(LocalityMixin, Attention):
    """Global multi-head self-attention with locality self-attention's diagonal mask and learned per-head scale
    (module docstring); otherwise :class:`~vit.layers.Attention`, with its arguments and parameters plus
    ``logit_scale`` ``(heads,)``."""


class LocalityWindowAttention(LocalityMixin, WindowAttention):
    """:class:`~vit.layers.WindowAttention` with locality self-attention (module docstring): each patch attends to the
    other patches of its window and to the prefix tokens, never to itself; prefix tokens attend to every other token.

    Raises:
        ValueError: If a window of the grid holds a single patch and there is no prefix token (its query would have no
            key left), at construction for the model's grid and at the first forward pass for another grid.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._check_windows(self.groups, self.grid_size)

    def _check_windows(self, groups: list[tuple[int, int]], grid_size: tuple[int, int]) -> None:
        if not self.num_prefix_tokens and any(patches == 1 for _, patches in groups):
            rows, cols = grid_size
            raise ValueError(
                f"locality_attention masks each token's own key, and window_size {self.window_size} (shift "
                f"{self.shift}) leaves a window of one patch in the {rows}x{cols} grid, with no prefix token: that "
                "patch would attend to nothing; change window_size or shift_windows so that every window holds two "
                "patches, or add a class token or a register token"
            )

    def layout(self, grid_size: tuple[int, int] | None, device: torch.device) -> WindowLayout:
        """The window layout of ``grid_size`` (:meth:`WindowAttention.layout`), its windows checked as at
        construction."""
        layout = super().layout(grid_size, device)
        if grid_size is not None:
            self._check_windows(layout.groups, tuple(grid_size))
        return layout
