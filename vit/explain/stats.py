"""Per-layer attention statistics: entropy, mean attention distance and a collapse detector.

Mean attention distance is the measure of Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021),
Fig. 7 / App. D.7: for each query patch, the attention-weighted Euclidean distance in pixels to the key patches,
averaged over queries and images — ViT's "receptive field size".

All functions take one block's dense weights ``(B, heads, N, N)`` as returned by
:func:`~vit.explain.capture_attention` and reduce over images and queries, keeping heads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ..layers.utils import to_2tuple


def _check_attention(attn: torch.Tensor, name: str = "attn") -> None:
    if attn.ndim != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"{name} must have shape (B, heads, N, N), got {tuple(attn.shape)}")


def row_entropy(attn: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats ``-Σ_j p_j log p_j`` of every row (``0 · log 0 = 0``), shape ``attn.shape[:-1]``."""
    p = attn.float()
    return -torch.where(p > 0, p * p.clamp_min(torch.finfo(p.dtype).tiny).log(), 0.0).sum(dim=-1)


def attention_entropy(attn: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of the attention rows of each head, averaged over images and all queries.

    A uniform row over ``n`` keys has entropy ``log n``, a one-hot row 0.

    Args:
        attn: Weights ``(B, heads, N, N)``.

    Returns:
        ``(heads,)``.
    """
    _check_attention(attn)
    return row_entropy(attn).mean(dim=(0, 2))


def patch_distances(grid_size: int | tuple[int, int], patch_size: int | tuple[int, int]) -> torch.Tensor:
    """Euclidean distances in pixels between patch centres, ``(rows·cols, rows·cols)`` in row-major order.

    Patch ``(r, c)`` is centred at pixel ``(r·ph + ph/2, c·pw + pw/2)``, so non-square patches are handled.
    """
    rows, cols = to_2tuple(grid_size)
    ph, pw = to_2tuple(patch_size)
    y, x = torch.meshgrid(torch.arange(rows) * float(ph), torch.arange(cols) * float(pw), indexing="ij")
    centres = torch.stack([y.flatten(), x.flatten()], dim=1) + torch.tensor([ph / 2, pw / 2])
    return torch.cdist(centres.double(), centres.double()).float()


def attention_distance(
    attn: torch.Tensor,
    grid_size: int | tuple[int, int],
    patch_size: int | tuple[int, int],
    num_prefix_tokens: int = 1,
    renormalize: bool = True,
) -> torch.Tensor:
    """Mean attention distance in pixels per head (ViT, Fig. 7).

    Uses the patch-to-patch block ``attn[:, :, P:, P:]`` (prefix queries and keys have no position). For each
    patch query, ``Σ_k w_qk · d(q, k)`` with ``d`` the pixel distance between patch centres
    (:func:`patch_distances`), averaged over queries and images.

    Args:
        attn: Weights ``(B, heads, N, N)`` with ``N = num_prefix_tokens + rows·cols``.
        grid_size: Patch grid ``(rows, cols)``.
        patch_size: Patch size in pixels ``(height, width)``.
        num_prefix_tokens: Class and register tokens at the start of the sequence.
        renormalize: Default True: rescale each query's patch-key weights to sum to 1, so the result is the
            expected distance *given that the query attends to a patch* and does not shrink when a head puts
            weight on the class or register tokens. False uses the raw weights (the mass on prefix tokens
            then counts as distance 0), as in most re-implementations of the figure.

    Returns:
        ``(heads,)`` distances in pixels.
    """
    _check_attention(attn)
    rows, cols = to_2tuple(grid_size)
    P = num_prefix_tokens
    if attn.shape[-1] != P + rows * cols:
        raise ValueError(
            f"attention over {attn.shape[-1]} tokens does not match {P} prefix tokens + a {rows}x{cols} grid"
        )
    weights = attn[:, :, P:, P:].float()  # (B, heads, patches, patches)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
    distances = patch_distances((rows, cols), patch_size).to(weights.device)
    return (weights * distances).sum(dim=-1).mean(dim=(0, 2))


def attention_statistics(
    attentions: Sequence[torch.Tensor],
    grid_size: int | tuple[int, int],
    patch_size: int | tuple[int, int],
    num_prefix_tokens: int = 1,
    renormalize: bool = True,
) -> dict[str, torch.Tensor]:
    """Entropy and mean attention distance of every block and head.

    Args:
        attentions: Per-block weights ``(B, heads, N, N)`` (e.g. from :func:`~vit.explain.capture_attention`).
        grid_size: Patch grid ``(rows, cols)`` (``model.patch_embed.grid_size``).
        patch_size: Patch size in pixels (``model.patch_embed.patch_size``).
        num_prefix_tokens: Class and register tokens (``model.num_prefix_tokens``).
        renormalize: See :func:`attention_distance`.

    Returns:
        ``{"entropy": (blocks, heads), "distance": (blocks, heads), "mean_entropy": (blocks,),
        "mean_distance": (blocks,)}``, entropy in nats, distance in pixels, means over heads.
    """
    if len(attentions) == 0:
        raise ValueError("attentions is empty: pass one (B, heads, N, N) tensor per block")
    entropy = torch.stack([attention_entropy(a) for a in attentions])
    distance = torch.stack(
        [attention_distance(a, grid_size, patch_size, num_prefix_tokens, renormalize) for a in attentions]
    )
    return {
        "entropy": entropy,
        "distance": distance,
        "mean_entropy": entropy.mean(dim=1),
        "mean_distance": distance.mean(dim=1),
    }


@dataclass
class CollapseReport:
    """Outcome of :func:`detect_collapse` for one block, with the sums it was decided from.

    Reports of disjoint batches of images merge exactly (:meth:`merge`): the result is the report
    :func:`detect_collapse` gives on all their images at once.

    Attributes:
        collapsed: Every head is near-uniform or near-one-hot.
        uniform: ``(heads,)`` bool, normalised entropy at least ``uniform_threshold``.
        one_hot: ``(heads,)`` bool, not uniform and (normalised entropy at most ``one_hot_threshold`` or
            argmax agreement at least ``argmax_agreement``).
        normalized_entropy: ``(heads,)`` mean over rows of ``entropy / log(allowed keys)``, in ``[0, 1]``.
        argmax_agreement: ``(heads,)`` fraction of (image, query) rows whose argmax is the head's most
            frequent key.
        num_images: Images the report was measured on.
        mask: ``(N, N)`` bool, the allowed pattern the entropies were normalised by.
        query_entropy: ``(heads, N)`` each query's row entropy in nats, summed over the images.
        argmax_counts: ``(heads, N)`` how many (image, query) rows have their largest weight on each key.
        thresholds: ``(uniform_threshold, one_hot_threshold, argmax_agreement)`` the heads were classified by.
    """

    collapsed: bool
    uniform: torch.Tensor
    one_hot: torch.Tensor
    normalized_entropy: torch.Tensor
    argmax_agreement: torch.Tensor
    num_images: int
    mask: torch.Tensor
    query_entropy: torch.Tensor
    argmax_counts: torch.Tensor
    thresholds: tuple[float, float, float | None]

    def __bool__(self) -> bool:
        return self.collapsed

    def describe(self) -> str:
        """One line for a log: which heads are uniform / one-hot, with their normalised entropies."""
        kinds = ["uniform" if u else "one-hot" if o else "ok" for u, o in zip(self.uniform, self.one_hot, strict=True)]
        heads = ", ".join(
            f"h{i}={kind}(H/Hmax={e:.3f}, argmax={a:.2f})"
            for i, (kind, e, a) in enumerate(
                zip(kinds, self.normalized_entropy.tolist(), self.argmax_agreement.tolist(), strict=True)
            )
        )
        return f"{'collapsed' if self.collapsed else 'healthy'}: {heads}"

    @classmethod
    def merge(cls, reports: Sequence[CollapseReport]) -> CollapseReport:
        """One report over the images of all ``reports`` (disjoint batches of one block, same thresholds).

        The sums add up and the allowed patterns are united (a key that underflowed to 0 in one batch is
        allowed when another batch gave it weight), so the result equals :func:`detect_collapse` on the
        concatenated weights.

        Raises:
            ValueError: If ``reports`` is empty, or the reports differ in heads, tokens or thresholds.
        """
        if not reports:
            raise ValueError("no reports to merge")
        first = reports[0]
        for report in reports[1:]:
            if report.query_entropy.shape != first.query_entropy.shape or report.thresholds != first.thresholds:
                raise ValueError(
                    f"cannot merge a report of {tuple(report.query_entropy.shape)} (heads, tokens) and thresholds "
                    f"{report.thresholds} with one of {tuple(first.query_entropy.shape)} and {first.thresholds}"
                )
        mask = torch.stack([r.mask for r in reports]).any(dim=0)
        return _classify(
            mask,
            sum((r.query_entropy for r in reports), torch.zeros_like(first.query_entropy)),
            sum((r.argmax_counts for r in reports), torch.zeros_like(first.argmax_counts)),
            sum(r.num_images for r in reports),
            *first.thresholds,
        )


def detect_collapse(
    attn: torch.Tensor,
    mask: torch.Tensor | None = None,
    uniform_threshold: float = 0.98,
    one_hot_threshold: float = 0.05,
    argmax_agreement: float | None = 1.0,
) -> CollapseReport:
    """Flag a block whose every head attends near-uniformly or near-one-hot.

    Each row's entropy is divided by ``log(number of allowed keys of that row)``, so 1 means uniform over the
    allowed keys and 0 one-hot; a row with a single allowed key counts as 0. A head is *uniform* when the mean
    normalised entropy is at least ``uniform_threshold``; otherwise it is *one-hot* when that mean is at most
    ``one_hot_threshold`` or when at least a fraction ``argmax_agreement`` of all (image, query) rows share the
    same argmax key (every query looks at one token, e.g. the class token). The block is collapsed when every
    head is uniform or one-hot. Note that a freshly initialised ViT attends almost uniformly, so it is flagged
    as uniform until training sharpens its attention. Reports of several batches combine with
    :meth:`CollapseReport.merge`.

    Args:
        attn: One block's weights ``(B, heads, N, N)``.
        mask: Allowed pattern ``(N, N)`` (True = may attend), e.g. ``WindowAttention.dense_mask()``. By default
            the keys with nonzero weight for some image and head: softmax weights are positive wherever attention
            is allowed, so this recovers window patterns; keys that underflow to exactly 0 in every head and image
            drop out, which only happens in one-hot collapse and keeps it classified as one-hot.
        uniform_threshold: Normalised entropy at or above which a head counts as uniform.
        one_hot_threshold: Normalised entropy at or below which a head counts as one-hot.
        argmax_agreement: Argmax-agreement fraction at or above which a head counts as one-hot; ``None`` turns
            the criterion off. Ignored for uniform heads (ties make their argmax meaningless).

    Returns:
        A :class:`CollapseReport` (truthy when collapsed).
    """
    _check_attention(attn)
    if not 0.0 <= one_hot_threshold < uniform_threshold <= 1.0:
        raise ValueError(
            f"need 0 <= one_hot_threshold < uniform_threshold <= 1, got {one_hot_threshold} and {uniform_threshold}"
        )
    if argmax_agreement is not None and not 0.0 < argmax_agreement <= 1.0:
        raise ValueError(f"argmax_agreement must be in (0, 1] or None, got {argmax_agreement}")
    B, H, N, _ = attn.shape
    if mask is None:
        mask = (attn > 0).any(dim=1).any(dim=0)  # (N, N)
    if mask.shape != (N, N):
        raise ValueError(f"mask must have shape ({N}, {N}), got {tuple(mask.shape)}")
    query_entropy = row_entropy(attn).sum(dim=0)  # (heads, N)
    argmax = attn.argmax(dim=-1).transpose(0, 1).reshape(H, -1)  # (heads, B * N)
    counts = torch.zeros(H, N, dtype=torch.long, device=attn.device).scatter_add_(1, argmax, torch.ones_like(argmax))
    return _classify(mask.bool().cpu(), query_entropy.cpu(), counts.cpu(), B, uniform_threshold, one_hot_threshold,
                     argmax_agreement)  # fmt: skip


def _classify(
    mask: torch.Tensor,
    query_entropy: torch.Tensor,
    argmax_counts: torch.Tensor,
    num_images: int,
    uniform_threshold: float,
    one_hot_threshold: float,
    argmax_agreement: float | None,
) -> CollapseReport:
    """The report from its sums: :func:`detect_collapse` and :meth:`CollapseReport.merge` share this rule."""
    max_entropy = mask.sum(dim=-1).float().log()  # (N,) log(allowed keys)
    # A row with a single allowed key has entropy 0 and counts as one-hot (normalised entropy 0).
    normalized = (query_entropy / max_entropy.clamp_min(1e-12)).sum(dim=1) / (num_images * mask.shape[0])
    agreement = argmax_counts.max(dim=1).values.float() / argmax_counts.sum(dim=1).float()
    uniform = normalized >= uniform_threshold
    one_hot = normalized <= one_hot_threshold
    if argmax_agreement is not None:
        one_hot = one_hot | (agreement >= argmax_agreement)
    one_hot = one_hot & ~uniform
    return CollapseReport(
        collapsed=bool((uniform | one_hot).all()),
        uniform=uniform,
        one_hot=one_hot,
        normalized_entropy=normalized,
        argmax_agreement=agreement,
        num_images=num_images,
        mask=mask,
        query_entropy=query_entropy,
        argmax_counts=argmax_counts,
        thresholds=(uniform_threshold, one_hot_threshold, argmax_agreement),
    )


def describe_collapse(reports: Mapping[int, CollapseReport], num_images: int) -> str:
    """A log message about collapsed blocks: which, over how many images, and each head's kind.

    Args:
        reports: Block index -> its (collapsed) report.
        num_images: Number of images the reports were measured on.

    Returns:
        ``"block(s) 0, 1: every head is near-uniform or near-one-hot over the 8 fixed validation images ..."``
        followed by one line per block.
    """
    lines = "\n".join(f"  block {i}: {report.describe()}" for i, report in reports.items())
    hint = ""
    if any(bool(report.uniform.any()) for report in reports.values()):
        hint = " (near-uniform attention is normal in the first epochs of training from scratch)"
    return (
        f"block(s) {', '.join(map(str, reports))}: every head is near-uniform or near-one-hot over the {num_images} "
        f"fixed validation images{hint}\n{lines}"
    )
