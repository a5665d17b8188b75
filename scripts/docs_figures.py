"""Draw the pictures of the documentation ("Attention, step by step", "Explanations", the README) into docs/figures/.

    python scripts/docs_figures.py            # every picture: a few minutes on one CPU thread
    python scripts/docs_figures.py readme methods explorer --checkpoint runs/quickstart/<run>/checkpoints/last.ckpt
    python scripts/docs_figures.py sliding_explorer           # pictures named by their function

Every picture is computed with the functions the page teaches (``vit.layers``, ``vit.explain``) on real images:
scikit-learn's sample photograph and its handwritten digits. Seeded, so a rerun draws the same pictures. ``readme``
(the README's picture: the default map of the quickstart model), ``methods`` (every explanation method on the same
digits) and ``explorer`` (the attention explorer of the quickstart model with every method and its faithfulness, and,
where Playwright and a Chromium are installed, its screenshot) read the quickstart model's checkpoint
(``vit fit --config quickstart``): ``--checkpoint``, else the newest ``runs/quickstart/*/checkpoints/last.ckpt``;
without one they are skipped. ``sliding_explorer`` trains a small sliding-window model for a few seconds itself."""

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
from matplotlib.cm import ScalarMappable  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402
from PIL import Image  # noqa: E402

import vit  # noqa: E402
from vit.atomic import write_bytes  # noqa: E402
from vit.bench.explorer_suite import LAUNCH_ARGS, find_chromium  # noqa: E402
from vit.explain import (  # noqa: E402
    DEFAULT_METHOD,
    METHODS,
    applicable_methods,
    attention_attribution,
    attention_statistics,
    color_scale,
    explain,
    explain_images,
    explain_map,
    explorer_payload,
    faithfulness,
    fixed_images,
    is_signed,
    overlay_heatmap,
    render_grid,
    write_explorer,
)
from vit.explain.methods import require_extras  # noqa: E402
from vit.layers import (  # noqa: E402
    Attention,
    NeighborhoodAttention,
    WindowAttention,
    neighborhood_attention_mask,
    window_attention_mask,
)
from vit.normalize import normalize  # noqa: E402

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


def trained_digits_model(
    window_type: str = "block", window_size: int = 2
) -> tuple[torch.nn.Module, vit.ImageDataModule]:
    """A small ViT trained for a few seconds (12 epochs, one thread) on scikit-learn's digits: about 90 % validation
    accuracy. Blocks 0-2 attend within windows of the 4×4 patch grid, block 3 globally.

    Args:
        window_type: ``"block"``: fixed ``window_size²`` windows; ``"sliding"``: the ``window_size²`` neighbourhood
            of each patch (odd ``window_size``).
        window_size: Side of the window, in patches.
    """
    torch.manual_seed(0)
    dm = vit.ImageDataModule(dataset="digits", img_size=16, batch_size=64, num_workers=0, augment="none")
    dm.setup("fit")
    model = vit.create_model(
        "vit_tiny_patch4_32", img_size=16, num_classes=10, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0,
        window_size=window_size, window_type=window_type, global_attn_indexes=(3,), class_token=False,
        global_pool="avg",
    )  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    model.train()
    for _ in range(12):
        for images, labels in dm.train_dataloader():
            loss = F.cross_entropy(model(dm.normalize(images)), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    return model, dm


def explanations() -> None:
    """Rollout, attribution and the statistics of a model trained on digits, on eight validation digits."""
    model, dm = trained_digits_model()
    dm.setup("validate")
    images, labels = next(iter(dm.val_dataloader()))
    images, labels = images[:8], labels[:8]
    ex = explain_images(model, images, labels=labels, class_names=dm.class_names, mean=dm.mean, std=dm.std)
    accuracy = (ex.preds == labels).float().mean().item()
    print(f"digits model: {accuracy:.0%} of the 8 shown digits right")
    grids = {"rollout.png": None, "attribution.png": attention_attribution(model, dm.normalize(images))}
    for name, maps in grids.items():
        buffer = io.BytesIO()
        Image.fromarray(render_grid(ex, maps=maps, ncols=4)).save(buffer, format="png")
        write_bytes(OUT / name, buffer.getvalue())
        print(f"wrote {OUT / name}")
    stats = attention_statistics(
        ex.attentions, model.patch_embed.grid_size, model.patch_embed.patch_size, model.num_prefix_tokens
    )
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    blocks = np.arange(len(ex.attentions))
    for h in range(stats["distance"].shape[1]):
        left.scatter(blocks, stats["distance"][:, h], color="C0", alpha=0.7)
        right.scatter(blocks, stats["entropy"][:, h], color="C1", alpha=0.7)
    left.set_title("mean attention distance per head (px)")
    right.set_title("mean row entropy per head (nats)")
    right.axhline(math.log(16), color="grey", linestyle=":", label="uniform over 16 patches")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_xticks(blocks, ["0 window", "1 window", "2 window", "3 global"])
        ax.set_xlabel("block")
    save(figure, "monitoring.png")


SLIDING_KERNEL = 3
"""Side of the windows of the sliding-window explorer: odd, below the 4×4 grid, so the border shift shows."""


def method_maps(model: torch.nn.Module, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """The patch maps ``(B, rows, cols)`` of every registered method that applies to ``model``, the default first;
    a method whose optional extra is missing is skipped with a printed note."""
    maps = {}
    for name in [DEFAULT_METHOD, *(n for n in METHODS if n != DEFAULT_METHOD)]:
        if name not in applicable_methods(model):
            print(f"explorer: {name} does not apply to this model, skipped")
            continue
        try:
            require_extras(name)
        except ImportError as err:
            print(f"explorer: {name} skipped ({err})")
            continue
        maps[name] = explain_map(model, inputs, name).patches
    return maps


def explorer(checkpoint: Path | None = None) -> None:
    """The attention explorer of the quickstart model on ten validation digits of distinct classes, with every
    explanation method as an overlay, their deletion / insertion areas on those digits and each head's importance
    (mean ablation over every validation digit) (embedded in "Attention, step by step"), and, where Playwright and a
    Chromium are installed, its screenshot."""
    from vit.explain.heads import head_importance
    from vit.explain.loading import load_split

    loaded = quickstart_digits(checkpoint, 10)
    if loaded is None:
        return
    explainer, images, labels = loaded
    model, mean, std = explainer.model, explainer.mean, explainer.std
    inputs = normalize(images, mean, std)
    maps = method_maps(model, inputs)
    scores = faithfulness(model, inputs, maps, steps=16)
    _, every_digit, every_label = load_split(explainer)
    heads = head_importance(model, normalize(every_digit, mean, std), every_label)
    payload = explorer_payload(
        model, images, mean=mean, std=std, labels=labels, class_names=explainer.class_names,
        names=[f"digit {int(label)}" for label in labels], maps=maps, attribution=False, faithfulness=scores,
        importance=heads.logit_drop,
        title="Attention explorer: the quickstart model (vit fit --config quickstart) on validation digits",
    )  # fmt: skip
    path = write_explorer(OUT / "explorer_quickstart.html", payload)
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")
    # The 6, block 1 (shifted 2×2 windows): the cyan outline is the window of patch (1, 1), rows and columns 1-2.
    six = labels.tolist().index(6) if 6 in labels.tolist() else 0
    query = {"kind": "token", "index": model.num_prefix_tokens + 1 * model.patch_embed.grid_size[1] + 1}
    screenshot(path, "explorer.png", {"image": six, "query": query, "block": 1, "head": "mean"})


def sliding_explorer() -> None:
    """The attention explorer of a small model with 3×3 sliding-window blocks, trained for a few seconds, on six
    validation digits (embedded in "Attention, step by step": the pattern of a clicked patch)."""
    model, dm = trained_digits_model("sliding", SLIDING_KERNEL)
    dm.setup("validate")
    correct = total = 0
    with torch.no_grad():
        for images, labels in dm.val_dataloader():
            correct += (model(dm.normalize(images)).argmax(1) == labels).sum().item()
            total += len(labels)
    print(f"sliding-window digits model: {correct / total:.1%} validation accuracy ({total} digits)")
    images, labels, _ = fixed_images(dm.val_dataset, 6)
    payload = explorer_payload(
        model, images, mean=dm.mean, std=dm.std, labels=labels, class_names=dm.class_names,
        names=[f"digit {int(label)}" for label in labels],
        title=f"Attention explorer: a small ViT with {SLIDING_KERNEL}×{SLIDING_KERNEL} sliding windows, trained for "
        "a few seconds on digits",
    )  # fmt: skip
    path = write_explorer(OUT / "explorer_sliding.html", payload)
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")


def screenshot(page_path: Path, name: str, selection: dict) -> None:
    """A screenshot of the explorer at ``page_path`` after ``window.explorer.select(selection)``, as
    ``docs/figures/<name>``; left as it is where Playwright or a Chromium is missing."""
    chromium = find_chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        chromium = None
    if chromium is None:
        print(f"no playwright or chromium: the screenshot docs/figures/{name} is left as it is")
        return
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=LAUNCH_ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 800}, device_scale_factor=1)
        page.goto(page_path.as_uri())
        page.wait_for_function("window.explorer && window.explorer.timings.open !== null")
        page.evaluate("(selection) => window.explorer.select(selection)", selection)
        write_bytes(OUT / name, page.screenshot(full_page=True))  # the faithfulness table too
        browser.close()
    print(f"wrote {OUT / name}")


def quickstart_digits(checkpoint: Path | None, count: int):
    """The quickstart model and ``count`` validation digits of distinct classes (the training logger's choice)."""
    from vit.explain.loading import load_explainer

    if checkpoint is None:
        found = sorted(Path("runs/quickstart").glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
        checkpoint = found[-1] if found else None
    if checkpoint is None:
        print("no quickstart checkpoint (vit fit --config quickstart, or --checkpoint): skipped")
        return None
    explainer = load_explainer(Path(checkpoint))
    explainer.data.setup("validate")
    images, labels, _ = fixed_images(explainer.data.val_dataset, count)
    return explainer, images, labels


def readme(checkpoint: Path | None = None) -> None:
    """The README's picture: the default map (:data:`vit.explain.DEFAULT_METHOD`) of the quickstart model's
    predicted class on 8 validation digits of distinct classes."""
    loaded = quickstart_digits(checkpoint, 8)
    if loaded is None:
        return
    explainer, images, labels = loaded
    model, mean, std = explainer.model, explainer.mean, explainer.std
    ex = explain(model, images, [DEFAULT_METHOD], labels=labels, class_names=explainer.class_names, mean=mean, std=std)
    maps = ex.maps[DEFAULT_METHOD]
    title = f"{METHODS[DEFAULT_METHOD].summary} of the predicted class · quickstart model, digits it has not seen"
    buffer = io.BytesIO()
    grid = render_grid(ex, maps, ncols=4, title=title, signed=is_signed(DEFAULT_METHOD))
    Image.fromarray(grid).save(buffer, format="png")
    write_bytes(OUT / f"{DEFAULT_METHOD}_grid_digits.png", buffer.getvalue())
    print(f"wrote {OUT / f'{DEFAULT_METHOD}_grid_digits.png'}")


def methods(checkpoint: Path | None = None) -> None:
    """Every explanation method (columns) on the same six validation digits (rows) of the quickstart model."""
    loaded = quickstart_digits(checkpoint, 6)
    if loaded is None:
        return
    explainer, images, labels = loaded
    model, names = explainer.model, list(METHODS)
    inputs = normalize(images, explainer.mean, explainer.std)
    ex = explain_images(model, images, labels=labels, class_names=explainer.class_names, mean=explainer.mean,
                        std=explainer.std, statistics=False)  # fmt: skip
    maps = {name: explain_map(model, inputs, name).patches for name in names}
    figure, axes = plt.subplots(len(images), len(names) + 1, figsize=(1.75 * (len(names) + 1), 1.6 * len(images)))
    for row, caption in enumerate(ex.captions()):
        picture = (ex.images[row].permute(1, 2, 0).clamp(0, 1).numpy() * 255).round().astype(np.uint8)
        picture = np.asarray(Image.fromarray(picture).resize((96, 96), Image.BICUBIC))
        axes[row, 0].imshow(picture)
        axes[row, 0].set_title(caption.replace("true ", "").replace(" · pred ", " → "), fontsize=8)
        for col, name in enumerate(names, start=1):
            scale = color_scale(maps[name][row], is_signed(name))  # the colours every renderer uses
            axes[row, col].imshow(overlay_heatmap(picture, maps[name][row], alpha=0.8, scale=scale))
            bar = figure.colorbar(ScalarMappable(Normalize(scale.low, scale.high), scale.cmap), ax=axes[row, col],
                                  ticks=scale.ticks(), fraction=0.05, pad=0.03)  # fmt: skip
            bar.ax.set_yticklabels(scale.labels())
            bar.ax.tick_params(labelsize=5, length=2, pad=1)
            if row == 0:
                axes[row, col].set_title(name + (" (default)" if name == DEFAULT_METHOD else ""), fontsize=8)
    for ax in axes.flat:
        ax.set_axis_off()
    figure.suptitle("Every method on the same digits (true → predicted), quickstart model: class-specific maps explain "
                    "the prediction.\nSigned relevance (attnlrp, cp_lrp, ig, gradxinput): red = for the class, blue = "
                    "against, clear = none; the others: bright = more", fontsize=9)  # fmt: skip
    save(figure, "methods_digits.png")


DRAWS = (mask_patterns, photo_attention, scaling, heads, explanations, sliding_explorer, explorer, readme, methods)


def main(only: set[str] | None = None, checkpoint: Path | None = None) -> None:
    """Draw the pictures named in ``only`` (every picture when ``None``); ``checkpoint`` is the quickstart model's."""
    torch.set_num_threads(1)
    for draw in DRAWS:
        if only is None or draw.__name__ in only:
            draw(checkpoint) if draw in (readme, methods, explorer) else draw()


if __name__ == "__main__":
    args = sys.argv[1:]
    path = None
    if "--checkpoint" in args:
        at = args.index("--checkpoint")
        if at + 1 == len(args):
            sys.exit("--checkpoint needs a path: --checkpoint runs/quickstart/<run>/checkpoints/last.ckpt")
        path, args = Path(args[at + 1]), args[:at] + args[at + 2 :]
    unknown = sorted(set(args) - {draw.__name__ for draw in DRAWS})
    if unknown:
        sys.exit(f"unknown picture {', '.join(unknown)}: choose from {', '.join(d.__name__ for d in DRAWS)}")
    main(set(args) or None, path)
