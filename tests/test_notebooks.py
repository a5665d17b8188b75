"""The lessons (docs/lessons/*.ipynb) run top to bottom in a fresh kernel of this environment, each cell within its
time, and are committed without outputs; the quick-start lesson's inline explorer answers a click in a browser.

CI trains for fewer seconds than a learner does (:data:`CI_PARAMETERS`, set in each notebook's cell tagged
``parameters``): what is tested is that every cell runs and shows its output, not how well the model learns.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "docs" / "lessons").glob("*.ipynb"))
CELL_TIMEOUT = 240
"""Seconds one cell may take (the longest is a lesson's training, which stops on its own clock)."""
CI_PARAMETERS = {"TRAIN_SECONDS": 20}
"""Values the tests give the ``NAME = value`` lines of a notebook's ``parameters`` cell."""

nbformat = pytest.importorskip("nbformat")


def with_parameters(notebook, values: dict[str, object]):
    """``notebook`` with each ``NAME = ...`` line of its cells tagged ``parameters`` set to ``values[NAME]``."""
    for cell in notebook.cells:
        if "parameters" in cell.metadata.get("tags", []):
            for name, value in values.items():
                cell.source = re.sub(rf"^{name} = [^#\n]*", f"{name} = {value!r}  ", cell.source, flags=re.MULTILINE)
    return notebook


def test_with_parameters_sets_the_tagged_cell_only():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"TRAIN_SECONDS = 90{note}") for note in ("  # change this", "")]
    nb.cells[0].metadata["tags"] = ["parameters"]
    with_parameters(nb, {"TRAIN_SECONDS": 5})
    assert [c.source for c in nb.cells] == ["TRAIN_SECONDS = 5  # change this", "TRAIN_SECONDS = 90"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.outputs == [] and cell.execution_count is None for cell in code), (
        f"{path.name} carries outputs: jupyter nbconvert --clear-output --inplace {path.relative_to(ROOT)}"
    )
    assert sum("parameters" in cell.metadata.get("tags", []) for cell in code) <= 1


def execute(path: Path, cwd: Path):
    """``path`` executed in a fresh kernel (nbclient) in ``cwd``, with :data:`CI_PARAMETERS`; returns it and the
    seconds each code cell took."""
    nbclient = pytest.importorskip("nbclient")
    notebook = with_parameters(nbformat.read(path, as_version=4), CI_PARAMETERS)
    client = nbclient.NotebookClient(
        notebook, timeout=CELL_TIMEOUT, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError on an error, CellTimeoutError past CELL_TIMEOUT
    total = time.perf_counter() - start
    seconds = []
    for cell in notebook.cells:
        if cell.cell_type == "code":
            timing = cell.metadata.get("execution", {})
            began, ended = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
            seconds.append(_seconds(ended) - _seconds(began) if began and ended else 0.0)
    print(f"{path.name}: {total:.0f} s; slowest cells {sorted(seconds, reverse=True)[:3]}")
    return notebook, seconds


def _seconds(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path, monkeypatch, request):
    """Every cell runs without an error and within :data:`CELL_TIMEOUT`; every picture cell shows one; an inline
    explorer, rendered as the notebook's HTML, changes its query when a patch is clicked."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    notebook, seconds = execute(path, tmp_path)
    assert max(seconds) < CELL_TIMEOUT
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    for cell in notebook.cells:  # a cell that draws (plt.show) or returns an Explanation shows a PNG
        if cell.cell_type == "code" and re.search(r"plt\.show\(\)|^explanation$", cell.source, re.MULTILINE):
            assert any("image/png" in out.get("data", {}) for out in cell.outputs), cell.source[:80]
    frames = [out for out in outputs if "<iframe srcdoc=" in out.get("data", {}).get("text/html", "")]
    if frames:
        click_inline_explorer(notebook, request.getfixturevalue("browser"), tmp_path)


def click_inline_explorer(notebook, browser, tmp_path: Path) -> None:
    """The executed notebook as HTML (nbconvert, as the docs site renders notebooks), opened in Chromium: the inline
    explorer draws, and a click on a patch makes that patch the query, without an error in the frame."""
    from nbconvert import HTMLExporter

    page_path = tmp_path / "lesson.html"
    page_path.write_text(HTMLExporter().from_notebook_node(notebook)[0], encoding="utf-8")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(page_path.as_uri())
    # Chromium draws a frame of another origin (the sandbox's) only once it is on screen.
    element = page.locator("iframe[srcdoc]").first  # the first inline explorer (a lesson may embed other pages)
    element.scroll_into_view_if_needed()
    frame = element.element_handle().content_frame()
    frame.wait_for_function("window.explorer && window.explorer.timings.open !== null")
    frame.evaluate("() => window.explorer.select({})")
    before = frame.evaluate("() => JSON.parse(JSON.stringify(window.explorer.state))")
    grid, prefix = frame.evaluate("() => [window.explorer.data.grid, window.explorer.data.prefix]")
    box = frame.locator("#view").bounding_box()  # in the page's coordinates
    r, c = grid[0] - 1, grid[1] - 1  # the bottom-right patch
    page.mouse.click(box["x"] + (c + 0.5) * box["width"] / grid[1], box["y"] + (r + 0.5) * box["height"] / grid[0])
    frame.evaluate("() => window.explorer.select({})")
    after = frame.evaluate("() => JSON.parse(JSON.stringify(window.explorer.state))")
    assert after["query"] == {"kind": "token", "index": prefix + r * grid[1] + c} != before["query"]
    page.screenshot(path=str(tmp_path / "lesson.png"), full_page=False)
    errors = frame.evaluate("() => window.explorer.errors")
    page.close()
    assert errors == []
