"""The HTML report has one heading structure: the title once, as the page's only h1, then a heading per section, and
no heading without content under it; the same with the explorer opening the page and without it."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
import torch

from vit.explain import explain
from vit.explain.render.report import render_report

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


class Outline(HTMLParser):
    """The headings of a page in order, each with whether any text or element came before the next heading."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[list] = []  # [level, text, followed by content]
        self.inside: int | None = None

    def handle_starttag(self, tag, attrs):
        if tag in ("h1", "h2", "h3", "h4"):
            self.inside = int(tag[1])
            self.headings.append([self.inside, "", False])
        elif self.headings and self.inside is None and tag not in ("section", "style", "script", "br"):
            self.headings[-1][2] = True

    def handle_endtag(self, tag):
        if tag in ("h1", "h2", "h3", "h4"):
            self.inside = None

    def handle_data(self, data):
        if self.inside is not None:
            self.headings[-1][1] += data
        elif self.headings and data.strip():
            self.headings[-1][2] = True


@pytest.mark.parametrize("explorer", [False, True])
def test_the_title_once_and_every_heading_over_content(explorer, random_vit, tmp_path, one_thread):
    torch.manual_seed(0)
    model = random_vit(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=4).eval()
    pixels = torch.randint(0, 256, (3, 3, 16, 16), dtype=torch.uint8)
    results = explain(model, pixels, ["rollout"], mean=MEAN, std=STD, faithfulness=True, steps=2)
    files = [tmp_path / f"img{i}.png" for i in range(3)]
    extra = {"model": model, "pixels": pixels, "mean": MEAN, "std": STD} if explorer else {}
    outline = Outline()
    outline.feed(render_report(files, results, "digits: 3 images", **extra))
    levels = [level for level, _, _ in outline.headings]
    assert [text for level, text, _ in outline.headings if level == 1] == ["digits: 3 images"]  # once, the only h1
    assert levels[0] == 1 and all(b - a <= 1 for a, b in zip(levels, levels[1:], strict=False))  # no level skipped
    following = [*levels[1:], 0]  # a heading with nothing under it before the next of its level or above: empty
    empty = [h[1] for h, after in zip(outline.headings, following, strict=True) if not h[2] and after <= h[0]]
    assert empty == []
    texts = [text for level, text, _ in outline.headings if level == 2 and text != "faithfulness"]
    assert "Summary of all images" not in texts and "Images" in texts
