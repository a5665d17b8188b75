"""The attention explorer embedded in the docs (built by scripts/docs_figures.py), opened in a headless Chromium."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from browser import Page


def test_docs_explorer_is_consistent(browser):
    """The explorer embedded in the docs (scripts/docs_figures.py): rows sum to 1, window rows stay in their window."""
    path = Path(__file__).resolve().parents[1] / "docs" / "figures" / "explorer_digits.html"
    page = Page(browser, path)
    data = page.js("() => ({grid: window.explorer.data.grid, kinds: window.explorer.data.blocks.map(b => b.kind)})")
    assert data["kinds"] == ["window", "window", "window", "global"]
    page.click_patch(2, 1, tuple(data["grid"]))
    t = 2 * data["grid"][1] + 1  # no prefix tokens
    for b, kind in enumerate(data["kinds"]):
        allowed = page.js("([b]) => window.explorer.allowed(b)", [b])
        for h in range(page.js("() => window.explorer.data.heads")):
            row = page.row(b, h, t)
            assert row.sum() == pytest.approx(1.0, abs=len(row) / 255 * row.max())
            if kind == "window":
                assert sum(allowed) == 4 and np.all(row[np.array(allowed) == 0] == 0)
    assert page.errors == []
