"""What the explanation API shows in a notebook (vit.explain.render.notebook): the explorer as a sandboxed iframe
holding its page, an Explanation as the PNG of its map grids."""

from __future__ import annotations

import io
import subprocess
import sys
import types
from html.parser import HTMLParser

import numpy as np
import pytest
import torch
from PIL import Image

from vit.explain import (
    Explorer,
    explain,
    explanation_png,
    explorer_payload,
    render_explorer,
    render_grid,
    show_explanations,
    show_explorer,
)

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


class Frames(HTMLParser):
    """The attributes of every ``<iframe>`` of a fragment, unescaped as a browser reads them."""

    def __init__(self, fragment: str):
        super().__init__()
        self.frames: list[dict[str, str]] = []
        self.feed(fragment)

    def handle_starttag(self, tag, attrs):
        if tag == "iframe":
            self.frames.append(dict(attrs))


@pytest.fixture
def model(random_vit):
    return random_vit(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4).eval()


@pytest.fixture
def pixels():
    torch.manual_seed(1)
    return torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)


def test_inline_explorer_is_its_page_in_a_sandboxed_iframe(model, pixels):
    title = 'digits "quoted" & <b>bold</b>'  # escaped in the frame, intact in the page
    shown = show_explorer(model, pixels, mean=MEAN, std=STD, title=title, class_names=["a", "b", "c", "d"])
    assert isinstance(shown, Explorer)
    fragment = shown._repr_html_()
    (frame,) = Frames(fragment).frames
    assert frame["srcdoc"] == render_explorer(shown.payload) == shown.page
    assert frame["sandbox"] == "allow-scripts"  # no allow-same-origin: the page cannot reach the notebook's
    assert frame["title"] == title and int(frame["height"]) == shown.height > 0
    assert "<script" not in fragment  # the page and its scripts only inside the attribute, escaped
    assert fragment.count("<iframe") == 1 and "</iframe>" in fragment[-len("</iframe>") :]
    assert len(shown.payload["images"]) == 3 and repr(shown).startswith("Explorer(3 images, ")


def test_inline_explorer_stays_within_max_bytes(model, pixels):
    page = len(render_explorer(explorer_payload(model, pixels, mean=MEAN, std=STD, bits=6)).encode())
    frame = len(show_explorer(model, pixels, mean=MEAN, std=STD, bits=6)._repr_html_().encode())
    assert frame > page  # escaping makes the frame larger than the page
    budget = (page + frame) // 2  # the page fits, the frame of the same data would not
    shown = show_explorer(model, pixels, mean=MEAN, std=STD, max_bytes=budget, subset_note=lambda n: f"{n} shown")
    assert len(shown._repr_html_().encode()) <= budget
    assert len(shown.payload["images"]) < 3 or shown.payload["bits"] < 6  # fewer images or coarser codes
    unlimited = show_explorer(model, pixels, mean=MEAN, std=STD, max_bytes=None)
    assert len(unlimited.payload["images"]) == 3


def test_explorer_saves_its_page(model, pixels, tmp_path):
    shown = show_explorer(model, pixels[:1], mean=MEAN, std=STD)
    assert shown.save(tmp_path / "e.html").read_text(encoding="utf-8") == shown.page


def decode(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def shown_png(explanation) -> bytes | None:
    """What IPython shows for ``explanation`` as a PNG, with the display formatter of vit.explain registered."""
    formatters = pytest.importorskip("IPython.core.formatters")
    shell = types.SimpleNamespace(display_formatter=formatters.DisplayFormatter())
    assert show_explanations(shell)
    data, _ = shell.display_formatter.format(explanation)
    return data.get("image/png")


def test_explanation_shows_as_the_png_of_its_grids(model, pixels):
    one = explain(model, pixels, ["rollout"], mean=MEAN, std=STD)
    png = shown_png(one)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png == explanation_png(one)
    np.testing.assert_array_equal(decode(png), render_grid(one, one.maps["rollout"], 3, title="rollout", size=128))
    two = explain(model, pixels, ["rollout", "attnlrp"], mean=MEAN, std=STD)
    grids = [
        render_grid(two, two.maps["rollout"], 3, title="rollout", size=128),
        render_grid(two, two.maps["attnlrp"], 3, title="attnlrp", size=128, signed=True),
    ]  # relevance: diverging
    np.testing.assert_array_equal(decode(shown_png(two)), np.concatenate(grids))  # one under the other
    assert shown_png(explain(model, pixels, [], mean=MEAN, std=STD)) is None  # no maps: the plain repr


def test_importing_vit_explain_in_ipython_registers_the_display():
    """In a running IPython, ``import vit.explain`` registers the formatter; without one it imports no renderer."""
    pytest.importorskip("IPython")
    code = (
        "import sys; from IPython.core.interactiveshell import InteractiveShell; shell = InteractiveShell.instance(); "
        "import vit.explain; png = shell.display_formatter.formatters['image/png']; "
        "print(('vit.explain.explanation', 'Explanation') in png.deferred_printers)"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "True"
    plain = "import sys, vit.explain; print('vit.explain.render.notebook' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True).stdout.strip() == "False"
