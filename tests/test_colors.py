"""The colour decision every renderer follows: diverging and symmetric for signed maps, sequential from 0 for unsigned
ones, and which methods are which (declared in the registry, checked against what each method returns)."""

from __future__ import annotations

import re

import matplotlib
import numpy as np
import pytest
import torch

from vit.explain import METHODS, color_scale, explain_map, is_signed, overlay_heatmap
from vit.explain.colors import DIVERGING, SEQUENTIAL, apply_colormap
from vit.explain.render.report import colorbar_html


def test_signed_limits_are_symmetric_and_zero_is_white_exactly():
    scale = color_scale(np.array([-0.1, 0.0, 0.25, 0.4]), signed=True)
    assert (scale.cmap, scale.low, scale.high) == (DIVERGING, -0.4, 0.4)
    assert scale.ticks() == (-0.4, 0.0, 0.4) and scale.labels() == ("-0.4", "0", "0.4")
    assert scale.colors(np.array([0.0, 0.4, -0.4])).tolist() == [[255, 255, 255], [255, 0, 0], [0, 0, 255]]
    assert scale.colors(np.array([-0.1])).tolist() == [[191, 191, 255]]  # a quarter below zero: light blue
    # Mostly negative: the limits follow the larger magnitude, zero stays white.
    negative = color_scale(torch.tensor([[-3.0, 1.0]]), signed=True)
    assert (negative.low, negative.high) == (-3.0, 3.0) and negative.colors(np.zeros(1)).tolist() == [[255, 255, 255]]
    # A shared limit replaces the map's own; a map of zeros is drawn white.
    assert color_scale(np.array([0.1]), signed=True, limit=2.0).ticks() == (-2.0, 0.0, 2.0)
    zeros = color_scale(np.zeros((2, 2)), signed=True)
    assert zeros.colors(np.zeros(3)).tolist() == [[255, 255, 255]] * 3


def test_unsigned_maps_keep_the_sequential_map_from_zero():
    scale = color_scale(np.array([0.1, 0.3, 0.4]), signed=False)
    assert (scale.cmap, scale.low, scale.high) == (SEQUENTIAL, 0.0, 0.4) and scale.labels() == ("0", "0.4")
    inferno = matplotlib.colormaps["inferno"]
    expected = np.rint(np.array([inferno(0.0)[:3], inferno(0.25)[:3], inferno(1.0)[:3]]) * 255)
    np.testing.assert_array_equal(scale.colors(np.array([0.0, 0.1, 0.4])), expected)
    assert color_scale(np.array([-0.5, 1.0]), signed=False).low == -0.5  # below zero: from its minimum
    assert color_scale(np.array([0.5]), signed=False, cmap="viridis").cmap == "viridis"
    assert color_scale(np.array([0.5]), signed=True, cmap="viridis").cmap == DIVERGING  # never sequential


def test_apply_colormap_odd_table_puts_one_half_on_the_centre():
    assert apply_colormap(np.array(0.5), "bwr", 255).tolist() == [255, 255, 255]
    assert apply_colormap(np.array(0.5), "bwr", 256).tolist() != [255, 255, 255]  # why the table is odd


def test_signed_overlay_is_transparent_at_zero_and_opaque_at_the_extremes():
    image = np.full((8, 8, 3), 40, dtype=np.uint8)
    grid = torch.tensor([[0.0, 0.0], [-2.0, 2.0]])
    drawn = overlay_heatmap(image, grid, alpha=1.0, signed=True).astype(int)
    assert drawn[0, 0].tolist() == [40, 40, 40]  # zero: the image
    assert drawn[7, 7].tolist() == [255, 0, 0] and drawn[7, 0].tolist() == [0, 0, 255]
    half = overlay_heatmap(image, grid, alpha=0.5, signed=True).astype(int)
    assert half[7, 7].tolist() == [148, 20, 20]  # half red, half image
    unsigned = overlay_heatmap(image, grid.abs(), alpha=0.5).astype(int)  # unsigned: the same weight everywhere
    black = np.rint(np.array(matplotlib.colormaps["inferno"](0.0)[:3]) * 255)
    np.testing.assert_allclose(unsigned[0, 0], 0.5 * 40 + 0.5 * black, atol=1)


def test_the_report_colour_bar_carries_its_numbers():
    signed = colorbar_html(color_scale(np.array([-0.1, 0.4]), signed=True), 160)
    assert re.findall(r"<span>(.*?)</span>", signed) == ["-0.4", "0", "0.4"]
    assert "rgb(0, 0, 255)" in signed and "rgb(255, 255, 255)" in signed and "rgb(255, 0, 0)" in signed
    unsigned = colorbar_html(color_scale(np.array([0.1, 0.3]), signed=False), 160)
    assert re.findall(r"<span>(.*?)</span>", unsigned) == ["0", "0.3"]


def test_declared_signs_match_what_the_methods_return(random_vit):
    """The signed methods return negative patches on a random model; the unsigned ones never do."""
    model = random_vit(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=3).eval()
    images = torch.randn(3, 3, 16, 16)
    assert {name for name, m in METHODS.items() if m.signed} == {"attnlrp", "cp_lrp", "ig", "gradxinput"}
    for name, method in METHODS.items():
        patches = explain_map(model, images, name).patches
        assert bool((patches < 0).any()) == method.signed, name
        assert is_signed(name) == method.signed
    assert is_signed("chefer") is False and is_signed("integrated_gradients") is True  # aliases
    assert is_signed("custom", torch.tensor([0.2, -0.1])) and not is_signed("custom", torch.tensor([0.2, 0.1]))
    assert not is_signed("custom")


@pytest.mark.parametrize("name", ["rollout", "attnlrp"])
def test_report_overlays_use_the_method_colours(tmp_path, random_vit, name):
    from dataclasses import replace

    from vit.explain import explain
    from vit.explain.render.report import render_report
    from vit.normalize import normalize

    model = random_vit(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=3).eval()
    pixels = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    mean, std = (0.5,) * 3, (0.25,) * 3
    results = explain(model, pixels, ["rollout"], mean=mean, std=std)
    results = replace(results, maps={name: explain_map(model, normalize(pixels, mean, std), name).patches})
    page = render_report([tmp_path / "a.png", tmp_path / "b.png"], results, "report")
    images = page.split("<h2>Images</h2>", 1)[1].split("<h2>", 1)[0]
    legends = re.findall(r'<div class="ticks">(.*?)</div>', images)
    assert len(legends) == 2  # one numbered bar under each overlay
    for i, legend in enumerate(legends):
        scale = color_scale(results.maps[name][i], is_signed(name))
        assert re.findall(r"<span>(.*?)</span>", legend) == list(scale.labels())
        assert len(scale.labels()) == (3 if name == "attnlrp" else 2)
