"""Attention rollout: how much each input patch contributes to a token after all blocks.

Abnar & Zuidema, "Quantifying Attention Flow in Transformers" (ACL 2020). Each block's heads are fused into one
matrix ``A``; the residual connection is modelled by adding the identity and renormalising every row,
``Â = (A + I) / rowsum(A + I)``; the layers compose as ``R = Â_L ⋯ Â_1``. Row ``i`` of ``R`` says how the
tokens at the input mix into token ``i`` at the output.

A model with an attention-pooling head (``global_pool="map"``) is read at its latent query: with ``P`` the head's
cross-attention over the patch tokens, fused over heads and averaged over latents, ``(B, num_patches)``, the map
is ``P · R[patches, patches]``. No identity is added for the head: the latent is not a token of the sequence, its
only path to the image is this attention (and the head's own residual MLP acts on the latent alone).

Compared with the widely copied ``vit-explain`` code, this version is batched (every sample, not element 0),
supports several prefix tokens (class + registers) and non-square grids, renormalises rows (that code divides by
a row-sum vector that broadcasts over columns), and discards per sample among patch-key entries only (that code
discards from the flattened matrix of sample 0, where only entry ``[0, 0]`` is protected).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import torch
from torch import nn

from .capture import capture_attention, pool_module

HeadFusion = Literal["mean", "max", "min"]
RolloutPool = Literal["token", "avg", "map"]


def fuse_heads(attn: torch.Tensor, head_fusion: HeadFusion = "mean") -> torch.Tensor:
    """Fuse ``(B, heads, N, N)`` attention over heads into ``(B, N, N)`` by mean, max or min."""
    if head_fusion == "mean":
        return attn.mean(dim=1)
    if head_fusion == "max":
        return attn.amax(dim=1)
    if head_fusion == "min":
        return attn.amin(dim=1)
    raise ValueError(f"head_fusion must be one of {get_args(HeadFusion)}, got {head_fusion!r}")


def discard_lowest(fused: torch.Tensor, discard_ratio: float, num_prefix_tokens: int) -> torch.Tensor:
    """Zero the smallest ``discard_ratio`` fraction of each sample's patch-key entries.

    The candidates are all entries ``(i, j)`` with ``j >= num_prefix_tokens``: every query row (prefix rows
    included), every patch-key column, **diagonal included** (the identity added afterwards keeps each token's
    residual path, so self-attention is never lost entirely). Prefix-token columns are never discarded. Exactly
    ``floor(discard_ratio · N · (N - num_prefix_tokens))`` entries are zeroed per sample (ties broken by
    ``torch.topk``); entries that are already zero, such as those outside a window block's pattern, count.

    Args:
        fused: Head-fused attention ``(B, N, N)``.
        discard_ratio: Fraction in ``[0, 1)``.
        num_prefix_tokens: Number of class / register tokens at the start of the sequence.

    Returns:
        A new ``(B, N, N)`` tensor.
    """
    B, N, _ = fused.shape
    patch_keys = fused[:, :, num_prefix_tokens:].reshape(B, -1)  # (B, N * num_patches), a copy
    k = int(discard_ratio * patch_keys.shape[1])
    if k == 0:
        return fused
    lowest = patch_keys.topk(k, dim=1, largest=False).indices
    patch_keys = patch_keys.scatter(1, lowest, 0.0)
    return torch.cat([fused[:, :, :num_prefix_tokens], patch_keys.view(B, N, -1)], dim=2)


def attention_rollout(
    attentions: Sequence[torch.Tensor],
    num_prefix_tokens: int = 1,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    pool: RolloutPool = "token",
    pool_attention: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention rollout of a batch, relevance of every patch (raw values, not normalised).

    Per block: fuse heads (:func:`fuse_heads`), optionally zero the weakest patch-key entries
    (:func:`discard_lowest`), add the identity and renormalise rows; then multiply ``R = Â_L ⋯ Â_1``.

    Args:
        attentions: Per-block weights ``(B, heads, N, N)`` in block order, e.g. from :func:`capture_attention`.
        num_prefix_tokens: Class and register tokens at the start of the sequence (``model.num_prefix_tokens``).
        head_fusion: How heads are fused: ``"mean"``, ``"max"`` or ``"min"``.
        discard_ratio: Fraction in ``[0, 1)`` of each sample's smallest patch-key entries zeroed per block.
        pool: ``"token"`` returns the class-token row (token 0) over patch columns; ``"avg"`` (models without a
            class token) returns the mean of the patch-token rows over patch columns; ``"map"`` (an
            attention-pooling head) returns ``pool_attention`` fused over heads, averaged over latents, times the
            patch rows, over the patch columns (see the module docstring). The head's weights are not discarded.
        pool_attention: The head's cross-attention ``(B, heads, latent_len, N - num_prefix_tokens)``, for ``"map"``.

    Returns:
        ``(B, N - num_prefix_tokens)`` relevance per patch in row-major grid order; with ``"token"`` and
        mean fusion without discard, the class row over *all* columns sums to 1.

    Raises:
        ValueError: On an unknown ``head_fusion`` or ``pool``, ``discard_ratio`` outside ``[0, 1)``,
            ``pool="token"`` without prefix tokens, ``pool="map"`` without ``pool_attention``, or inconsistent
            attention shapes.
    """
    if head_fusion not in get_args(HeadFusion):
        raise ValueError(f"head_fusion must be one of {get_args(HeadFusion)}, got {head_fusion!r}")
    if pool not in get_args(RolloutPool):
        raise ValueError(f"pool must be one of {get_args(RolloutPool)}, got {pool!r}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    if num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be >= 0, got {num_prefix_tokens}")
    if pool == "token" and num_prefix_tokens == 0:
        raise ValueError("pool='token' needs a class token (num_prefix_tokens >= 1); use pool='avg'")
    if len(attentions) == 0:
        raise ValueError("attentions is empty: pass one (B, heads, N, N) tensor per block")
    shape = attentions[0].shape
    for i, attn in enumerate(attentions):
        if attn.ndim != 4 or attn.shape[-1] != attn.shape[-2]:
            raise ValueError(f"attentions[{i}] must have shape (B, heads, N, N), got {tuple(attn.shape)}")
        if attn.shape[0] != shape[0] or attn.shape[-1] != shape[-1]:
            raise ValueError(f"attentions[{i}] has shape {tuple(attn.shape)}, incompatible with {tuple(shape)}")
    B, _, N, _ = shape
    if num_prefix_tokens >= N:
        raise ValueError(f"sequence length {N} leaves no patch tokens after {num_prefix_tokens} prefix tokens")

    P = num_prefix_tokens
    if pool == "map":
        _check_pool_attention(pool_attention, B, N - P)
    dtype = torch.float64 if attentions[0].dtype == torch.float64 else torch.float32
    eye = torch.eye(N, dtype=dtype, device=attentions[0].device)
    rollout = eye.expand(B, N, N)
    for attn in attentions:
        fused = fuse_heads(attn.to(dtype), head_fusion)  # (B, N, N)
        if discard_ratio > 0:
            fused = discard_lowest(fused, discard_ratio, P)
        fused = fused + eye
        fused = fused / fused.sum(dim=-1, keepdim=True)  # Â = (A + I) / row sum
        rollout = fused @ rollout  # R = Â_l · R
    if pool == "token":
        return rollout[:, 0, P:]
    if pool == "map":
        latent = fuse_heads(pool_attention.to(dtype), head_fusion).mean(dim=1)  # (B, num_patches)
        return (latent[:, None] @ rollout[:, P:, P:])[:, 0]
    return rollout[:, P:, P:].mean(dim=1)


def _check_pool_attention(pool_attention: torch.Tensor | None, batch: int, num_patches: int) -> None:
    """An attention-pooling head's weights must be ``(B, heads, latent_len, num_patches)``."""
    if pool_attention is None:
        raise ValueError(
            "pool='map' needs the pooling head's attention (pool_attention, or the .pool of capture_attention's "
            "record from a full forward pass)"
        )
    if pool_attention.ndim != 4 or pool_attention.shape[0] != batch or pool_attention.shape[-1] != num_patches:
        raise ValueError(
            f"pool_attention must have shape ({batch}, heads, latent_len, {num_patches}), "
            f"got {tuple(pool_attention.shape)}"
        )


def rollout_grid(
    model: nn.Module,
    attentions: Sequence[torch.Tensor],
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    pool: RolloutPool | None = None,
    pool_attention: torch.Tensor | None = None,
) -> torch.Tensor:
    """Roll out attention already captured from ``model`` onto its patch grid.

    Args:
        model: The :class:`~vit.VisionTransformer` the attention came from (``num_prefix_tokens``,
            ``has_class_token``, ``patch_embed.grid_size``).
        attentions: Per-block weights ``(B, heads, N, N)``, e.g. from :func:`capture_attention`.
        head_fusion: See :func:`attention_rollout`.
        discard_ratio: See :func:`attention_rollout`.
        pool: ``None`` reads the rows the classifier reads (:func:`head_pool`).
        pool_attention: The pooling head's cross-attention for ``"map"``; ``None`` reads ``attentions.pool``
            (an :class:`~vit.explain.capture.AttentionRecord`).

    Returns:
        ``(B, rows, cols)`` raw rollout relevance on the patch grid.
    """
    if pool is None:
        pool = head_pool(model)
    if pool_attention is None:
        pool_attention = getattr(attentions, "pool", None)
    relevance = attention_rollout(
        attentions,
        num_prefix_tokens=model.num_prefix_tokens,
        head_fusion=head_fusion,
        discard_ratio=discard_ratio,
        pool=pool,
        pool_attention=pool_attention,
    )
    rows, cols = model.patch_embed.grid_size
    return relevance.reshape(-1, rows, cols)


def head_pool(model: nn.Module, class_head: bool = False) -> RolloutPool:
    """Which rows the classifier reads: ``"map"`` (the latent query) for a model with an attention-pooling head,
    ``"token"`` (the class token) when ``global_pool == "token"`` and the model has a class token, else ``"avg"``
    (the mean of the patch tokens). Rollout and attribution explain the same rows.

    Args:
        model: The model.
        class_head: For a model with a distillation token, the rows of its class head (to display them).

    Raises:
        ValueError: For a model with a distillation token (DeiT), whose prediction averages two heads that read
            different rows, unless ``class_head``.
    """
    if getattr(model, "dist_token", None) is not None and not class_head:
        raise ValueError(
            "attention rollout and attribution read the rows of one head, and this model averages two (a class and a "
            "distillation head, DeiT): explain it with lrp"
        )
    if pool_module(model) is not None:
        return "map"
    reads_token = getattr(model, "global_pool", "token") == "token" and getattr(model, "has_class_token", True)
    return "token" if reads_token else "avg"


def rollout_map(
    model: nn.Module,
    images: torch.Tensor,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    pool: RolloutPool | None = None,
) -> torch.Tensor:
    """Capture attention and roll it out onto the model's patch grid (:func:`rollout_grid`).

    Args:
        model: A :class:`~vit.VisionTransformer` (``num_prefix_tokens``, ``has_class_token``,
            ``patch_embed.grid_size`` and blocks with ``attn.attention_weights``).
        images: Batch ``(B, C, H, W)`` normalised as the model expects.
        head_fusion: See :func:`attention_rollout`.
        discard_ratio: See :func:`attention_rollout`.
        pool: ``None`` reads the rows the classifier reads (:func:`head_pool`).

    Returns:
        ``(B, rows, cols)`` raw rollout relevance on the patch grid.
    """
    return rollout_grid(model, capture_attention(model, images), head_fusion, discard_ratio, pool)
