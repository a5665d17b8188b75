"""Draw the pictures of the documentation ("Attention, step by step", "Explanations", the README) into docs/figures/
(the lesson's pictures of the layers alone come from ``lesson_figures.py`` beside this script).

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

# The lesson's pictures of the layers alone; this script's folder is on the path when it runs as a script.
from lesson_figures import OUT, heads, mask_patterns, photo_attention, save, scaling  # noqa: E402
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
from vit.normalize import normalize  # noqa: E402


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
