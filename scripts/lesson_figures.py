"""Draw the pictures of the lesson "Attention, step by step" into docs/figures/: the attention patterns as masks and
on a photograph, why the scores are scaled by the square root of d, and one layer's heads.

    python scripts/lesson_figures.py                # every picture: seconds on one CPU thread
    python scripts/lesson_figures.py scaling heads  # pictures named by their function

Every picture is computed with the layers the page teaches (``vit.layers``) on scikit-learn's sample photograph, with
fixed weights or a fixed seed, so a rerun draws the same pictures. ``python scripts/docs_figures.py`` draws these too.
"""

from __future__ import annotations

import io
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import vit  # noqa: E402
from vit.atomic import write_bytes  # noqa: E402
from vit.layers import (  # noqa: E402
    Attention,
    NeighborhoodAttention,
    WindowAttention,
    neighborhood_attention_mask,
    window_attention_mask,
)

OUT = Path(__file__).resolve().parent.parent / "docs" / "figures"


def save(figure: plt.Figure, name: str) -> None:
    """Write ``figure`` as ``docs/figures/<name>`` (atomically) and close it."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    write_bytes(OUT / name, buffer.getvalue())
    print(f"wrote {OUT / name}")


def patterns(grid: int, prefix: int) -> dict[str, torch.Tensor]:
    """The boolean masks ``(N, N)`` of every pattern on a ``grid × grid`` patch grid with ``prefix`` tokens."""
    return {
        "global": torch.ones(prefix + grid * grid, prefix + grid * grid, dtype=torch.bool),
        "block window 4": window_attention_mask(grid, 4, num_prefix_tokens=prefix),
        "shifted window 4 (shift 2)": window_attention_mask(grid, 4, shift=2, num_prefix_tokens=prefix),
        "sliding 3×3": neighborhood_attention_mask(grid, 3, num_prefix_tokens=prefix),
        "dilated 3×3 (d = 2)": neighborhood_attention_mask(grid, 3, dilation=2, num_prefix_tokens=prefix),
    }


def mask_patterns() -> None:
    """The five patterns of an 8×8 grid with a class token: the whole mask, and the keys of two queries."""
    grid, masks = 8, patterns(8, 1)
    queries = {"patch (1, 1)": 1 + 1 * grid + 1, "patch (4, 6)": 1 + 4 * grid + 6}
    figure, axes = plt.subplots(3, len(masks), figsize=(3.0 * len(masks), 9.2), gridspec_kw={"hspace": 0.3})
    for col, (name, mask) in enumerate(masks.items()):
        axes[0, col].imshow(mask.numpy(), cmap="Blues", vmin=0, vmax=1.3, interpolation="nearest")
        axes[0, col].set_title(name, fontsize=11)
        axes[0, col].set_ylabel("query (0 = class token)", fontsize=8)
        for row, (label, q) in enumerate(queries.items(), start=1):
            keys = mask[q, 1:].reshape(grid, grid).float().numpy()
            keys[(q - 1) // grid, (q - 1) % grid] = 2.0  # the query itself
            axes[row, col].imshow(keys, cmap="Blues", vmin=0, vmax=2.0, interpolation="nearest")
            axes[row, col].set_title(f"keys of {label}", fontsize=9)
            axes[row, col].set_xticks(np.arange(-0.5, grid), [])
            axes[row, col].set_yticks(np.arange(-0.5, grid), [])
            axes[row, col].grid(color="white", linewidth=0.6)
            axes[row, col].tick_params(length=0)
        axes[0, col].tick_params(labelsize=7)
    figure.suptitle("Attention patterns on an 8×8 patch grid with a class token (blue: may attend; dark: the query)")
    save(figure, "mask_patterns.png")


def photo() -> torch.Tensor:
    """scikit-learn's sample photograph (a temple), centre-cropped and resized to ``(3, 224, 224)`` in [0, 1]."""
    from sklearn.datasets import load_sample_images

    image = torch.from_numpy(load_sample_images().images[0]).permute(2, 0, 1).float() / 255  # (3, 427, 640)
    side = min(image.shape[1:])
    top, left = (image.shape[1] - side) // 2, (image.shape[2] - side) // 2
    return F.interpolate(image[None, :, top : top + side, left : left + side], size=224, mode="area")[0]


def photo_tokens(image: torch.Tensor, patch: int = 16) -> torch.Tensor:
    """One token per patch: its pixels less the mean patch, scaled to unit length, ``(1, N, 3 · patch²)``."""
    tokens = F.unfold(image[None], patch, stride=patch).transpose(1, 2)  # (1, N, 3·p²)
    tokens = tokens - tokens.mean(dim=1, keepdim=True)
    return F.normalize(tokens, dim=-1)


def similarity_layers(dim: int, grid: int, sharpness: float) -> dict[str, Attention]:
    """One attention layer of each pattern with the same weights: q = k = sharpness · token, v = token."""
    layers = {
        "global": Attention(dim, num_heads=1),
        "block window 7": WindowAttention(dim, 1, grid_size=grid, window_size=7, num_prefix_tokens=0),
        "shifted window 7": WindowAttention(dim, 1, grid_size=grid, window_size=7, shift=3, num_prefix_tokens=0),
        "sliding 7×7": NeighborhoodAttention(dim, 1, grid_size=grid, kernel_size=7, num_prefix_tokens=0),
        "dilated 5×5 (d = 2)": NeighborhoodAttention(
            dim, 1, grid_size=grid, kernel_size=5, dilation=2, num_prefix_tokens=0
        ),
    }
    eye = torch.eye(dim)
    weight = torch.cat([eye * math.sqrt(sharpness * math.sqrt(dim)), eye * math.sqrt(sharpness * math.sqrt(dim)), eye])
    for layer in layers.values():
        layer.qkv.weight.data.copy_(weight)
    return layers


def photo_attention() -> None:
    """One query's attention over the photograph under each pattern (q = k = the patch's own pixels)."""
    image, grid = photo(), 14
    tokens = photo_tokens(image)
    layers = similarity_layers(tokens.shape[-1], grid, sharpness=4.0)
    row, col = 3, 9  # a patch of sky
    query = row * grid + col
    figure, axes = plt.subplots(1, len(layers) + 1, figsize=(3.0 * (len(layers) + 1), 3.4))
    axes[0].imshow(image.permute(1, 2, 0).numpy())
    axes[0].add_patch(plt.Rectangle((col * 16, row * 16), 16, 16, fill=False, edgecolor="red", linewidth=2))
    axes[0].set_title("photo, query patch in red", fontsize=10)
    for ax, (name, layer) in zip(axes[1:], layers.items(), strict=True):
        with torch.no_grad():
            weights = layer.attention_weights(tokens)[0, 0, query].reshape(grid, grid)
        heat = F.interpolate(weights[None, None], size=224, mode="nearest")[0, 0]
        ax.imshow(image.permute(1, 2, 0).numpy() * 0.35)
        ax.imshow(heat.numpy(), cmap="inferno", alpha=0.75, vmin=0, vmax=weights.max().item())
        ax.add_patch(plt.Rectangle((col * 16, row * 16), 16, 16, fill=False, edgecolor="cyan", linewidth=1.5))
        ax.set_title(name, fontsize=10)
    for ax in axes:
        ax.set_axis_off()
    figure.suptitle("Attention of one query patch (14×14 patches of 16 px): similar patches inside its pattern")
    save(figure, "photo_patterns.png")


def scaling() -> None:
    """Why √d: the spread of q·k grows as √d, and the softmax of unscaled scores turns one-hot."""
    generator = torch.Generator().manual_seed(0)
    dims = [4, 16, 64, 256, 1024]
    spread, entropy_raw, entropy_scaled = [], [], []
    for d in dims:
        q = torch.randn(256, d, generator=generator)
        k = torch.randn(64, d, generator=generator)
        scores = q @ k.T  # (256 queries, 64 keys)
        spread.append(scores.std().item())
        entropy_raw.append(vit.explain.row_entropy(scores.softmax(-1)).mean().item())
        entropy_scaled.append(vit.explain.row_entropy((scores / math.sqrt(d)).softmax(-1)).mean().item())
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    left.plot(dims, spread, "o-", label="std of q·k")
    left.plot(dims, np.sqrt(dims), "--", label="√d")
    left.set_xscale("log", base=2)
    left.set_yscale("log", base=2)
    left.set_xlabel("head dimension d")
    left.legend()
    left.set_title("unscaled scores spread like √d")
    right.plot(dims, entropy_raw, "o-", label="softmax(q·k)")
    right.plot(dims, entropy_scaled, "o-", label="softmax(q·k / √d)")
    right.axhline(math.log(64), color="grey", linestyle=":", label="uniform over 64 keys")
    right.set_xscale("log", base=2)
    right.set_xlabel("head dimension d")
    right.set_ylabel("row entropy (nats)")
    right.legend(fontsize=8)
    right.set_title("scaling keeps the rows from turning one-hot")
    save(figure, "scaling.png")


def heads() -> None:
    """Split into heads and merge: each head of a random 4-head layer has its own attention matrix."""
    torch.manual_seed(0)
    tokens = photo_tokens(photo(), patch=32)  # 7×7 patches of 32 px: 49 tokens
    layer = Attention(tokens.shape[-1], num_heads=4)
    with torch.no_grad():
        layer.qkv.weight.mul_(6.0)
        weights = layer.attention_weights(tokens)[0]  # (heads, N, N)
    figure, axes = plt.subplots(1, 4, figsize=(12, 3.3))
    for h, ax in enumerate(axes):
        ax.imshow(weights[h].numpy(), cmap="viridis", interpolation="nearest")
        ax.set_title(f"head {h}: softmax rows sum to 1", fontsize=9)
        ax.set_xlabel("key")
    axes[0].set_ylabel("query")
    figure.suptitle("One layer, four heads, four attention matrices (49 patches of the photo, random weights)")
    save(figure, "heads.png")


DRAWS = (mask_patterns, photo_attention, scaling, heads)

if __name__ == "__main__":
    torch.set_num_threads(1)
    names = set(sys.argv[1:])
    unknown = sorted(names - {draw.__name__ for draw in DRAWS})
    if unknown:
        sys.exit(f"unknown picture {', '.join(unknown)}: choose from {', '.join(d.__name__ for d in DRAWS)}")
    for draw in DRAWS:
        if not names or draw.__name__ in names:
            draw()
