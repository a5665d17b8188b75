"""The page-driving side of the browser tests: a headless Chromium (the system's, under Playwright) and one opened
attention explorer page, shared by the explorer's and the docs' tests. The ``browser`` fixture is in conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from vit.bench.explorer_suite import LAUNCH_ARGS, find_chromium
from vit.explain.colors import DIVERGING, DIVERGING_LUT_SIZE, apply_colormap

LUT = apply_colormap(np.arange(256) / 255.0).astype(np.int64)  # (256, 3): the page's colour map
SIGNED_LUT = apply_colormap(np.arange(DIVERGING_LUT_SIZE) / (DIVERGING_LUT_SIZE - 1), DIVERGING, DIVERGING_LUT_SIZE)
SIGNED_LUT = SIGNED_LUT.astype(np.int64)  # (255, 3): the page's colour map of signed maps


chromium_path = find_chromium


def launch_browser():
    """A headless Chromium (the system's) under Playwright; skips locally, fails under CI, when either is missing."""
    path = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        path, why = None, "playwright is not installed (pip install -e '.[dev]')"
    else:
        why = "no chromium on this machine (.ci/run installs Debian's chromium)"
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the browser tests: {why}")
        pytest.skip(why)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=LAUNCH_ARGS)
        yield browser
        browser.close()


class Page:
    """One opened explorer page and the console errors it produced."""

    def __init__(self, browser, path: Path):
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(path.as_uri())
        self.page.wait_for_function("window.explorer && window.explorer.timings.open !== null")
        self.settle()  # opened from the first patch's rows alone; drawn again from the whole codes

    def js(self, expression: str, arg=None):
        return self.page.evaluate(expression, arg)

    def settle(self) -> None:
        """Wait until every queued redraw is done."""
        self.js("() => window.explorer.select({})")

    def state(self) -> dict:
        return self.js("() => JSON.parse(JSON.stringify(window.explorer.state))")

    def click_patch(self, r: int, c: int, grid: tuple[int, int]) -> None:
        box = self.page.locator("#view").bounding_box()
        self.page.mouse.click(
            box["x"] + (c + 0.5) * box["width"] / grid[1], box["y"] + (r + 0.5) * box["height"] / grid[0]
        )
        self.settle()

    def row(self, b: int, h, t: int) -> np.ndarray:
        return np.array(self.js("([b, h, t]) => window.explorer.row(b, h, t)", [b, h, t]))

    def cell_pixels(self, b: int, h) -> np.ndarray:
        """The RGB pixels drawn in the small map of block ``b``, head ``h`` (one pixel per patch)."""
        data = self.js(
            """([b, h]) => { const c = document.querySelector(`.cell[data-block="${b}"][data-head="${h}"] canvas.heat`);
            return Array.from(c.getContext("2d").getImageData(0, 0, c.width, c.height).data); }""",
            [b, h],
        )
        return np.array(data).reshape(-1, 4)[:, :3]

    def cell_stats(self, b: int) -> tuple[float, float | None]:
        e, d = self.js(
            '(b) => { const td = document.querySelector(`td.stats[data-block="${b}"]`);'
            " return [td.dataset.entropy, td.dataset.distance]; }",
            b,
        )
        return float(e), (float(d) if d else None)


def lut_index(pixels: np.ndarray, lut: np.ndarray = LUT) -> np.ndarray:
    """The colour-map index of each drawn RGB pixel (nearest colour of the LUT)."""
    return np.argmin(((pixels[:, None, :] - lut[None]) ** 2).sum(-1), axis=1)


def expected_signed_index(values: np.ndarray) -> np.ndarray:
    """Diverging colour-map index of each value on the limits ``±max |value|`` (as the page and
    :func:`vit.explain.color_scale` do): zero is the middle entry."""
    top = np.abs(values).max()
    return np.minimum(((values / top + 1.0) / 2.0 * DIVERGING_LUT_SIZE).astype(np.int64), DIVERGING_LUT_SIZE - 1)


def expected_index(values: np.ndarray) -> np.ndarray:
    """Colour-map index of each value, the map scaled to its maximum (matplotlib's binning, as the page does)."""
    return np.minimum((values / values.max() * 256).astype(np.int64), 255)


def assert_drawn(page: Page, b: int, h, values: np.ndarray, slack: int) -> None:
    """The small map of (block b, head h) shows ``values`` (the patch keys), within ``slack`` colour-map steps."""
    drawn = lut_index(page.cell_pixels(b, h))
    np.testing.assert_array_less(np.abs(drawn - expected_index(values)), slack + 1)
