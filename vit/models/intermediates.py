"""Features of intermediate blocks, as dense-prediction heads read them: timm's ``forward_intermediates`` API.

The interface of timm's ``VisionTransformer`` (``forward_intermediates``, ``get_intermediate_layers`` from DINO,
Caron et al., ICCV 2021, and ``prune_intermediate_layers``), with the same arguments, order and outputs, so code
written for timm's backbones (ViTDet-style detection, segmentation heads) takes this model unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

Indices = int | Sequence[int] | None


def feature_take_indices(num_blocks: int, indices: Indices = None) -> tuple[list[int], int]:
    """Absolute block indexes to take, and the largest (timm's rule).

    Args:
        num_blocks: Number of blocks.
        indices: ``None``: every block; an int ``n``: the last ``n`` blocks; a sequence: those blocks (negative
            counts from the end).

    Returns:
        The indexes in the order given, and their maximum.

    Raises:
        ValueError: If an index is out of range.
    """
    if indices is None:
        indices = num_blocks
    if isinstance(indices, int):
        if not 0 < indices <= num_blocks:
            raise ValueError(f"take the last n blocks: n must be in 1..{num_blocks}, got {indices}")
        take = list(range(num_blocks - indices, num_blocks))
    else:
        take = [num_blocks + i if i < 0 else i for i in indices]
        bad = [i for i, t in zip(indices, take, strict=True) if not 0 <= t < num_blocks]
        if bad or not take:
            raise ValueError(f"block indices {list(indices)} out of range: use 0..{num_blocks - 1} (-1 is the last)")
    return take, max(take)


class IntermediatesMixin:
    """``forward_intermediates``, ``get_intermediate_layers`` and ``prune_intermediate_layers`` for a ViT with
    ``embed`` (images to tokens and the grid), ``run_block``, ``blocks``, ``norm``, ``patch_embed`` and
    ``num_prefix_tokens`` (:class:`~vit.models.VisionTransformer`)."""

    blocks: nn.Sequential
    norm: nn.Module
    num_prefix_tokens: int

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: Indices = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: Literal["NCHW", "NLC"] = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """The final features and the outputs of chosen blocks, as timm's ``forward_intermediates``.

        Args:
            x: Images ``(B, C, H, W)``.
            indices: ``None``: every block; ``n``: the last ``n`` blocks; a list: those blocks (negative from the end).
            return_prefix_tokens: Return each intermediate as ``(patch features, prefix tokens (B, prefix, C))``.
            norm: Apply the final norm to every intermediate.
            stop_early: Run no block after the last one taken (the final features are then that block's, normed).
            output_fmt: ``"NCHW"``: patch features ``(B, C, rows, cols)``; ``"NLC"``: ``(B, rows * cols, C)``.
            intermediates_only: Return only the intermediates.

        Returns:
            ``intermediates`` when ``intermediates_only``, else ``(normed final tokens (B, prefix + N, C),
            intermediates)``.

        Raises:
            ValueError: On an unknown ``output_fmt`` or an index out of range.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, last = feature_take_indices(len(self.blocks), indices)
        B, _, height, width = x.shape
        x, grid_size = self.embed(x)  # (B, prefix + N, C)
        blocks = self.blocks[: last + 1] if stop_early else self.blocks
        intermediates = []
        for i, block in enumerate(blocks):
            x = self.run_block(block, x, grid_size)
            if i in take:
                intermediates.append(self.norm(x) if norm else x)

        P = self.num_prefix_tokens
        prefix = [y[:, :P] for y in intermediates]
        intermediates = [y[:, P:] for y in intermediates]  # (B, N, C)
        if output_fmt == "NCHW":
            rows, cols = self.patch_embed.dynamic_feat_size((height, width))
            intermediates = [y.reshape(B, rows, cols, -1).permute(0, 3, 1, 2).contiguous() for y in intermediates]
        if return_prefix_tokens and P:
            intermediates = list(zip(intermediates, prefix, strict=True))
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def get_intermediate_layers(
        self,
        x: torch.Tensor,
        n: int | Sequence[int] = 1,
        reshape: bool = False,
        return_prefix_tokens: bool = False,
        norm: bool = False,
    ) -> list[torch.Tensor]:
        """Outputs of the last ``n`` blocks (or of the blocks listed), DINO's interface, as timm's.

        Args:
            x: Images ``(B, C, H, W)``.
            n: The last ``n`` blocks, or a list of block indexes.
            reshape: ``(B, C, rows, cols)`` instead of ``(B, rows * cols, C)``.
            return_prefix_tokens: Return ``(patch features, prefix tokens)`` pairs.
            norm: Apply the final norm.
        """
        return self.forward_intermediates(
            x,
            n,
            return_prefix_tokens=return_prefix_tokens,
            norm=norm,
            output_fmt="NCHW" if reshape else "NLC",
            intermediates_only=True,
        )

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the blocks after the last one in ``indices`` (and optionally the final norm and the head), as timm.

        Args:
            indices: Blocks whose outputs are still wanted (see :meth:`forward_intermediates`).
            prune_norm: Replace the final norm by an identity.
            prune_head: Remove the pooling head's norm, the attention-pooling head, the pooling and the classifier
                (timm's ``reset_classifier(0, "")``): ``forward`` then returns every token, ``(B, prefix + N, C)``.

        Returns:
            The absolute indexes kept.
        """
        take, last = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: last + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm = nn.Identity()
            self.reset_classifier(0, "")
        return take
