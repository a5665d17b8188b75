"""vit.explain's pictures against references: matplotlib's jet, the overlay's extremes and formats, unnormalising,
and the grid's layout and captions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vit.explain import (
    apply_colormap,
    make_grid,
    overlay_heatmap,
    to_uint8_image,
    unnormalize,
)


def test_builtin_jet_matches_matplotlib():
    matplotlib = pytest.importorskip("matplotlib")
    values = np.linspace(0.0, 1.0, 2001)
    reference = matplotlib.colormaps["jet"](values, bytes=True)[:, :3].astype(int)
    assert np.abs(apply_colormap(values, "jet").astype(int) - reference).max() <= 1
    assert apply_colormap(np.array(0.0), "jet").tolist() == [0, 0, 128]  # dark blue
    assert apply_colormap(np.array(1.0), "jet").tolist() == [128, 0, 0]  # dark red
    inferno = matplotlib.colormaps["inferno"](values, bytes=True)[:, :3].astype(int)
    assert np.abs(apply_colormap(values).astype(int) - inferno).max() <= 1  # the default
    viridis = matplotlib.colormaps["viridis"](values, bytes=True)[:, :3].astype(int)
    assert np.abs(apply_colormap(values, "viridis").astype(int) - viridis).max() <= 1
    with pytest.raises(ValueError, match="colormap"):
        apply_colormap(values, "no_such_map")


def test_overlay_extremes_and_formats():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (24, 40, 3), dtype=np.uint8)
    grid = torch.zeros(3, 5)
    grid[0, 4] = 7.0  # max at the top-right patch, raw scale irrelevant (min-max normalised)
    blended = overlay_heatmap(image, grid, alpha=0.5, cmap="jet")
    assert blended.dtype == np.uint8 and blended.shape == (24, 40, 3)
    np.testing.assert_array_equal(overlay_heatmap(image, grid, alpha=0.0), image)
    heat = overlay_heatmap(image, grid, alpha=1.0, cmap="jet")
    assert heat[0, -1].tolist() == [128, 0, 0] and heat[-1, 0].tolist() == [0, 0, 128]
    assert overlay_heatmap(image, grid, alpha=1.0)[-1, 0].tolist() == [0, 0, 4]  # inferno's black by default
    expected = np.rint(0.5 * image.astype(float) + 0.5 * heat.astype(float))
    assert np.abs(blended.astype(float) - expected).max() <= 1
    # A float CHW tensor in [0, 1] gives the same as its uint8 HWC version.
    tensor = torch.from_numpy(image).permute(2, 0, 1).float() / 255.0
    np.testing.assert_array_equal(overlay_heatmap(tensor, grid, alpha=0.0), image)
    np.testing.assert_array_equal(overlay_heatmap(tensor, grid.numpy(), alpha=0.3), overlay_heatmap(image, grid, 0.3))
    with pytest.raises(ValueError, match="alpha"):
        overlay_heatmap(image, grid, alpha=1.5)


def test_unnormalize_inverts_normalisation_and_grey_becomes_rgb():
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    x = torch.rand(2, 3, 8, 8)
    normalised = (x - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    torch.testing.assert_close(unnormalize(normalised, mean, std), x)
    grey = to_uint8_image(torch.full((1, 4, 5), 0.5))
    assert grey.shape == (4, 5, 3) and (grey == 128).all()
    with pytest.raises(ValueError, match="channels"):
        to_uint8_image(np.zeros((4, 5, 2)))


def test_make_grid_layout_and_captions():
    images = [np.full((8, 8, 3), 10 * (i + 1), dtype=np.uint8) for i in range(5)]
    grid = make_grid(images, ncols=3, padding=2)
    assert grid.dtype == np.uint8 and grid.shape == (2 + 2 * 10, 2 + 3 * 10, 3)
    for i in range(5):
        top, left = 2 + (i // 3) * 10, 2 + (i % 3) * 10
        assert (grid[top : top + 8, left : left + 8] == 10 * (i + 1)).all()
    assert (grid[12:20, 22:30] == 255).all()  # empty sixth cell
    captioned = make_grid(images, ncols=3, captions=[f"class {i}" for i in range(5)], padding=2)
    assert captioned.shape[0] > grid.shape[0] and captioned.shape[1] == grid.shape[1]
    strip = captioned[2 + 8 : 2 + 10 + 12, 2:10]  # below the first image
    assert (strip < 128).any()  # black text drawn
    with pytest.raises(ValueError, match="caption"):
        make_grid(images, ncols=2, captions=["only one"])
