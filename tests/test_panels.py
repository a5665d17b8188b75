"""Panels: pixel layout (image | overlay | colour bar, caption strip), colours from matplotlib's colour maps,
grids of an Explanation, and the distance plot."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from vit.explain import Explanation, distance_plot, render_grid, render_panel, render_panels
from vit.explain.render.panels import BAR_WIDTH, caption_font_size, caption_height, font

PAD = 4


def digit_like(size: int = 16) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (size, size, 3), dtype=np.uint8)


def peaked_map() -> torch.Tensor:
    grid = torch.full((4, 4), 0.01)
    grid[0, 3] = 0.05  # the top-right patch is the most relevant
    return grid


def test_panel_layout_image_overlay_colour_bar_caption():
    image = digit_like()
    panel = render_panel(image, peaked_map(), "true 3 · pred 7 (32 %)", size=64, resample="nearest", alpha=0.6)
    top = caption_height(64) + PAD
    assert panel.dtype == np.uint8 and panel.shape[0] == top + 64 + PAD

    # Left: the image itself, upscaled 4x by pixel repetition.
    left = panel[top : top + 64, PAD : PAD + 64]
    np.testing.assert_array_equal(left, image.repeat(4, axis=0).repeat(4, axis=1))

    # Right of it: the overlay of an unsigned map on inferno from 0 to its maximum: yellow over the top-right patch
    # (0.05), a fifth of the way up elsewhere (0.01).
    overlay = panel[top : top + 64, 2 * PAD + 64 : 2 * PAD + 128].astype(float)
    inferno = matplotlib.colormaps["inferno"]
    high, low = (np.array(inferno(v)[:3]) * 255 for v in (1.0, 0.2))
    big = left.astype(float)
    np.testing.assert_allclose(overlay[2, -3], 0.4 * big[2, -3] + 0.6 * high, atol=1.5)
    np.testing.assert_allclose(overlay[-3, 2], 0.4 * big[-3, 2] + 0.6 * low, atol=1.5)

    # The colour bar: inferno from top (the maximum) to bottom (0), labelled with those numbers.
    bar_left = 4 * PAD + 128
    bar = panel[top : top + 64, bar_left : bar_left + BAR_WIDTH].astype(int)
    assert (bar == bar[:, :1]).all()  # constant along each row
    expected = inferno(np.linspace(1.0, 0.0, 64), bytes=True)[:, :3].astype(int)
    assert np.abs(bar[:, 0] - expected).max() <= 1
    assert bar_labels(panel, 64) == ["0.05", "", "0"]

    # The caption strip above holds dark text; without a caption it stays white.
    assert (panel[:top, : 2 * PAD + 128] < 100).sum() > 50
    blank = render_panel(image, peaked_map(), "", size=64, resample="nearest")
    assert (blank[:top] == 255).all()


def test_panel_upscales_non_square_images_and_accepts_tensors():
    image = torch.rand(3, 8, 16)  # CHW float in [0, 1]
    panel = render_panel(image, torch.rand(2, 4), "x", size=96, resample="bicubic")
    top = caption_height(96) + PAD
    assert panel.shape[0] == top + 48 + PAD  # longer side 96 px, aspect kept
    nearest = render_panel(image, torch.rand(2, 4), "x", size=96, resample="nearest")
    expected = (image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8).repeat(6, axis=0).repeat(6, axis=1)
    np.testing.assert_array_equal(nearest[top : top + 48, PAD : PAD + 96], expected)
    with pytest.raises(ValueError, match="alpha"):
        render_panel(image, torch.rand(2, 4), alpha=2.0)
    with pytest.raises(ValueError, match="resample"):
        render_panel(image, torch.rand(2, 4), resample="lanczos")
    with pytest.raises(ValueError, match="2-D"):
        render_panel(image, torch.rand(8))


def bar_labels(panel: np.ndarray, size: int) -> list[str]:
    """Which numbers a panel's colour bar carries at its top, middle and bottom: the label region compared, pixel for
    pixel, with each candidate drawn where the panel draws it (``""``: nothing there)."""
    top, height = caption_height(size) + PAD, size
    left = 4 * PAD + 2 * size + BAR_WIDTH + 3
    region = panel[top - 2 : top + height + 2, left:]
    label_font = font(max(9, caption_font_size(size) - 3))
    found = []
    for y, anchor in ((top, "la"), (top + height / 2, "lm"), (top + height, "ld")):
        matches = [""]
        for text in ("-0.4", "0.4", "0", "0.05", "-0.05", "1", "-1"):
            probe = Image.new("RGB", (panel.shape[1], panel.shape[0]), (255, 255, 255))
            ImageDraw.Draw(probe).text((left, y), text, fill=(0, 0, 0), font=label_font, anchor=anchor)
            ink = np.asarray(probe)[top - 2 : top + height + 2, left:] < 128
            rows = np.flatnonzero(ink.any(axis=(1, 2)))
            if (region[rows] < 128).any(axis=2).tolist() == ink[rows].any(axis=2).tolist():
                matches = [text]
        found += matches
    return found


def test_signed_panel_is_diverging_centred_on_zero_with_three_numbers():
    """A signed map in [-0.1, 0.4]: limits ±0.4, its zero patches drawn as the image itself (transparent), the
    strongest patch near pure red, the bar white in the middle and labelled -0.4, 0, 0.4."""
    image = np.full((16, 16, 3), 90, dtype=np.uint8)
    grid = torch.zeros(4, 4)
    grid[0, 3], grid[3, 0] = 0.4, -0.1
    panel = render_panel(image, grid, "x", signed=True, size=64, resample="nearest", alpha=1.0)
    top = caption_height(64) + PAD
    overlay = panel[top : top + 64, 2 * PAD + 64 : 2 * PAD + 128].astype(int)
    assert overlay[2, -3].tolist() == [255, 0, 0]  # +max: bwr's red at full weight
    assert overlay[24, 24].tolist() == [90, 90, 90]  # zero: the image shows through
    # -0.1: bwr at (−0.1 + 0.4) / 0.8 = 0.375 (a light blue, entry 95 of 255), a quarter of the weight over the grey.
    light_blue = matplotlib.colormaps["bwr"].resampled(255)(95)[:3] * np.array(255.0)
    np.testing.assert_allclose(overlay[-3, 2], 0.75 * 90 + 0.25 * light_blue, atol=1)
    assert overlay[-3, 2, 2] > overlay[-3, 2, 0]
    bar = panel[top : top + 64 + 1, 4 * PAD + 128]
    assert bar[0].tolist() == [255, 0, 0] and bar[63].tolist() == [0, 0, 255]
    odd = render_panel(image, grid, "x", signed=True, size=63, resample="nearest")  # 63 rows: one at exactly 0
    odd_top = caption_height(63) + PAD
    assert odd[odd_top + 31, 4 * PAD + 126].tolist() == [255, 255, 255]
    assert bar_labels(panel, 64) == ["0.4", "0", "-0.4"]
    # The same values as an unsigned map: inferno, and no zero in the middle of the bar.
    unsigned = render_panel(image, grid.clamp(min=0), "x", size=64, resample="nearest")
    assert bar_labels(unsigned, 64) == ["0.4", "", "0"]


def explanation(batch: int = 5) -> Explanation:
    probs = torch.softmax(torch.randn(batch, 3, generator=torch.Generator().manual_seed(0)), dim=-1)
    return Explanation(
        images=torch.rand(batch, 3, 16, 16),
        labels=torch.arange(batch) % 3,
        probs=probs,
        preds=probs.argmax(dim=-1),
        attentions=[],
        maps={"rollout": torch.rand(batch, 4, 4)},
        entropy=None,
        distance=None,
        collapse={},
        class_names=["cat", "dog", "ship"],
    )


def test_grid_holds_one_captioned_panel_per_image():
    ex = explanation(5)
    panels = render_panels(ex, size=48)
    assert len(panels) == 5 and len({p.shape for p in panels}) == 1
    h, w, _ = panels[0].shape
    grid = render_grid(ex, ncols=3, size=48)
    assert grid.shape == (6 + 2 * (h + 6), 6 + 3 * (w + 6), 3)
    np.testing.assert_array_equal(grid[6 : 6 + h, 6 : 6 + w], panels[0])
    np.testing.assert_array_equal(grid[12 + h : 12 + 2 * h, 12 + w : 12 + 2 * w], panels[4])
    titled = render_grid(ex, ncols=3, size=48, title="epoch 3 · attention rollout")
    strip = titled.shape[0] - grid.shape[0]
    assert strip > 0 and (titled[:strip] < 100).any()
    np.testing.assert_array_equal(titled[strip:], grid)
    # Another map (e.g. an attribution) replaces the rollout.
    other = render_grid(ex, maps=torch.rand(5, 4, 4), ncols=3, size=48)
    assert other.shape == grid.shape and not np.array_equal(other, grid)
    with pytest.raises(ValueError, match="one map per image"):
        render_grid(ex, maps=torch.rand(2, 4, 4))


def test_distance_plot_is_an_rgb_image():
    plot = distance_plot(torch.tensor([[2.0, 4.0], [6.0, 9.0]]), "epoch 0", max_distance=22.6)
    assert plot.dtype == np.uint8 and plot.shape == (350, 500, 3)
    assert (plot < 50).any() and (plot == 255).any()
