"""The attention explorers embedded in the docs (built by scripts/docs_figures.py), opened in a headless Chromium:
the quickstart model's, with every explanation method and their faithfulness, and a sliding-window model's. The
allowed neighbourhood the page outlines is compared with the pattern written here from its definition."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from browser import Page

import vit
from vit.explain import DEFAULT_METHOD, METHODS, explain_map

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"


def docs_figures_module():
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "scripts" / "docs_figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "scripts"))  # where the script finds lesson_figures.py, as when run as a script
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return module


def window_pattern(r: int, c: int, grid: tuple[int, int], size: int, shift: int) -> np.ndarray:
    """Block windows: the patches in the same ``size × size`` window as ``(r, c)``; a shifted grid has its window
    boundaries at ``shift + k · size``, so the first band (before ``shift``) is a window of its own."""
    allowed = np.zeros(grid, dtype=int)
    for rr in range(grid[0]):
        for cc in range(grid[1]):
            same_row_band = (rr - shift) // size == (r - shift) // size
            same_col_band = (cc - shift) // size == (c - shift) // size
            allowed[rr, cc] = int(same_row_band and same_col_band)
    return allowed.flatten()


def sliding_pattern(r: int, c: int, grid: tuple[int, int], kernel: int) -> np.ndarray:
    """Sliding windows: the ``kernel × kernel`` square centred on ``(r, c)``, moved inward at the border."""
    allowed = np.zeros(grid, dtype=int)
    top = min(max(r - kernel // 2, 0), grid[0] - kernel)
    left = min(max(c - kernel // 2, 0), grid[1] - kernel)
    allowed[top : top + kernel, left : left + kernel] = 1
    return allowed.flatten()


def check_rows(page: Page, b: int, t: int, allowed: list[int] | None) -> None:
    """Every head's (and the head mean's) row of query ``t`` in block ``b`` is a distribution (the page rescales each
    decoded row to sum 1) and is zero on the patches outside ``allowed`` (``None``: all allowed)."""
    for h in [*range(page.js("() => window.explorer.data.heads")), "mean"]:
        row = page.row(b, h, t)
        assert row.min() >= 0 and row.sum() == pytest.approx(1.0, abs=1e-5), (b, h, t)
        if allowed is not None:
            assert np.all(row[np.array(allowed) == 0] == 0), (b, h, t)
            assert row[np.array(allowed) == 1].sum() == pytest.approx(row.sum()), (b, h, t)


def page_info(page: Page) -> dict:
    return page.js(
        """() => { const d = window.explorer.data; return {grid: d.grid, prefix: d.prefix, title: d.title,
        kinds: d.blocks.map((b) => b.kind), maps: d.map_names, faithfulness: d.faithfulness,
        labels: d.images.map((i) => i.label),
        faithRows: document.querySelectorAll("#faith tr").length,
        faithShown: getComputedStyle(document.getElementById("faith-box")).display !== "none"}; }"""
    )


def test_quickstart_explorer_shows_every_method_its_faithfulness_and_the_windows(browser):
    """The quickstart model's explorer: blocks 0-2 windowed (block 1 shifted), block 3 global, as
    configs/quickstart.yaml says; every registry method whose extra is installed as a map, the default first; their
    deletion and insertion areas in the table; every patch's rows sum to 1 and stay inside its window."""
    config = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())["model"]["model_overrides"]
    page = Page(browser, FIGURES / "explorer_quickstart.html")
    info = page_info(page)
    grid, P = tuple(info["grid"]), info["prefix"]
    assert "quickstart" in info["title"]
    assert info["kinds"] == ["window", "window", "window", "global"]
    assert [i for i, k in enumerate(info["kinds"]) if k == "global"] == config["global_attn_indexes"]
    assert len(info["labels"]) == len(set(info["labels"])) == 10  # ten digits of distinct classes

    installed = [n for n, m in METHODS.items() if all(importlib.util.find_spec(x) for x in m.needs)]
    assert sorted(info["maps"]) == sorted(installed) and info["maps"][0] == DEFAULT_METHOD
    faith = info["faithfulness"]
    for kind in ("deletion_auc", "insertion_auc"):
        assert sorted(faith[kind]) == sorted([*installed, "random"])
        assert all(0 <= v <= 1 for v in faith[kind].values()), faith[kind]
    assert faith["num_images"] == 10
    assert info["faithShown"] and info["faithRows"] == len(installed) + 2  # the header, the methods, random

    size = config["window_size"]
    shifts, window_blocks = {}, 0
    for b, kind in enumerate(info["kinds"]):  # every second window block is shifted by half a window (Swin)
        if kind == "window":
            shifts[b] = size // 2 if config["shift_windows"] and window_blocks % 2 == 1 else 0
            window_blocks += 1
    assert shifts == {0: 0, 1: 1, 2: 0}
    for image in (0, len(info["labels"]) - 1):
        page.js("([i]) => window.explorer.select({image: i})", [image])
        for r in range(grid[0]):
            for c in range(grid[1]):
                page.click_patch(r, c, grid)
                t = P + r * grid[1] + c
                for b, kind in enumerate(info["kinds"]):
                    allowed = page.js("([b]) => window.explorer.allowed(b)", [b])
                    if kind == "window":
                        assert allowed == window_pattern(r, c, grid, size, shifts[b]).tolist(), (r, c, b)
                    else:
                        assert allowed is None
                    check_rows(page, b, t, allowed)
    assert page.errors == []


def test_sliding_explorer_outlines_the_clamped_neighbourhood(browser):
    """The sliding-window model's explorer: for every patch, the allowed patches of each sliding block are the
    k × k square around it moved inward at the border, and its rows stay inside that square and sum to 1."""
    kernel = docs_figures_module().SLIDING_KERNEL
    page = Page(browser, FIGURES / "explorer_sliding.html")
    info = page_info(page)
    grid, P = tuple(info["grid"]), info["prefix"]
    assert info["kinds"] == ["sliding", "sliding", "sliding", "global"]
    assert grid == (4, 4) and kernel == 3  # an odd kernel below the grid: the border shift shows
    counts = []
    for r in range(grid[0]):
        for c in range(grid[1]):
            page.click_patch(r, c, grid)
            assert page.state()["query"] == {"kind": "token", "index": P + r * grid[1] + c}
            for b, kind in enumerate(info["kinds"]):
                allowed = page.js("([b]) => window.explorer.allowed(b)", [b])
                if kind == "sliding":
                    assert allowed == sliding_pattern(r, c, grid, kernel).tolist(), (r, c, b)
                    counts.append(sum(allowed))
                else:
                    assert allowed is None
                check_rows(page, b, P + r * grid[1] + c, allowed)
    assert set(counts) == {kernel * kernel}  # every patch sees exactly k² patches, corners included
    assert page.errors == []


def test_method_maps_skip_a_method_whose_extra_is_missing(monkeypatch, capsys):
    """The docs script's maps: every applicable method, the default first, each equal to its explain_map; a method
    whose optional package cannot be imported is left out with a printed note."""
    script = docs_figures_module()
    monkeypatch.setitem(sys.modules, "captum", None)  # import captum now raises ImportError
    torch.manual_seed(0)
    model = vit.create_model("vit_tiny_patch4_32", img_size=16, depth=2, num_classes=10, window_size=2).eval()
    inputs = torch.randn(2, 3, 16, 16)
    maps = script.method_maps(model, inputs)
    expected = [DEFAULT_METHOD, *(n for n in METHODS if n not in (DEFAULT_METHOD, "ig"))]
    assert list(maps) == expected
    assert "ig skipped" in capsys.readouterr().out
    for name in (DEFAULT_METHOD, "rollout"):
        torch.testing.assert_close(maps[name], explain_map(model, inputs, name).patches)
