"""Explanations that show themselves in a notebook (Jupyter, JupyterLab, VS Code, Colab).

:func:`show_explorer` returns an :class:`Explorer`, whose ``_repr_html_`` is the attention explorer page
(:func:`~vit.explain.render.explorer.render_explorer`) inside a sandboxed ``<iframe srcdoc=...>``: the page's script
runs in its own document, with no access to the notebook's, and every front end that displays HTML output runs it
the same way. :func:`show_explanations` makes IPython show every :class:`~vit.explain.Explanation` as
:func:`~vit.explain.render.panels.explanation_png` (one grid per method): a display formatter, registered when
``vit.explain`` is imported in a running IPython, so that the data type knows nothing of its renderers.
"""

from __future__ import annotations

import html
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .explorer import DEFAULT_MAX_BYTES, ExplorerTooLarge, explorer_payload, render_explorer, write_explorer
from .panels import explanation_png

# The frame's height in pixels: the image column (image, menus, prediction) and a little more per block, whose rows of
# small maps lie beside it (the page scrolls inside the frame when they are more).
_TOP_PX, _BLOCK_PX = 760, 40


class Explorer:
    """An attention explorer page that a notebook shows inline (``_repr_html_``) and that can be saved as a file.

    Attributes:
        payload: What :func:`~vit.explain.explorer_payload` returned.
        page: The page's HTML (:func:`~vit.explain.render_explorer`).
        height: Height of the inline frame in pixels.
    """

    def __init__(self, payload: dict[str, Any], height: int | None = None) -> None:
        self.payload = payload
        self.page = render_explorer(payload)
        self.height = height or _TOP_PX + _BLOCK_PX * len(payload["blocks"])

    def _repr_html_(self) -> str:
        return explorer_iframe(self.page, self.height, str(self.payload.get("title", "attention explorer")))

    def save(self, path: str | Path) -> Path:
        """Write the page to ``path`` (atomically, as :func:`~vit.explain.write_explorer` does); returns ``path``."""
        return write_explorer(path, self.payload)

    def __repr__(self) -> str:
        return f"Explorer({len(self.payload['images'])} images, {len(self.page.encode()) / 1e3:.0f} kB)"


def explorer_iframe(page: str, height: int, title: str = "attention explorer") -> str:
    """``page`` in a sandboxed ``<iframe srcdoc>``: scripts run (``allow-scripts``), with no access to the host page
    (no ``allow-same-origin``). ``html.escape`` quotes the whole page into the attribute; the browser unescapes it."""
    return (
        f'<iframe srcdoc="{html.escape(page, quote=True)}" sandbox="allow-scripts" title="{html.escape(title)}" '
        f'width="100%" height="{int(height)}" style="border: 1px solid #ddd;"></iframe>'
    )


def show_explorer(
    model: nn.Module,
    images: torch.Tensor,
    *,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    height: int | None = None,
    **options: Any,
) -> Explorer:
    """The attention explorer of ``model`` on ``images``, shown inline when it is a cell's value.

    Args:
        model: A :class:`~vit.VisionTransformer`.
        images: ``(B, C, H, W)`` uint8 pixels or normalised floats, as :func:`~vit.explain.explorer_payload` takes.
        mean: Per-channel mean of the normalisation in ``[0, 1]``.
        std: Per-channel standard deviation.
        max_bytes: Largest inline frame, escaped page included (what the notebook stores), or ``None``: the
            explorer's budget, applied to the frame; a page over it is computed once more with the budget cut by
            what escaping added.
        height: Height of the frame in pixels; ``None``: from the number of blocks.
        **options: Passed to :func:`~vit.explain.explorer_payload` (``labels``, ``class_names``, ``names``, ``maps``,
            ``title``, ``bits``, ``subset_note``, ...).

    Raises:
        ExplorerTooLarge: If even the escaped frame of the images that fit passes ``max_bytes``.
    """
    explorer = Explorer(explorer_payload(model, images, mean=mean, std=std, max_bytes=max_bytes, **options), height)
    if max_bytes is None:
        return explorer
    size = len(explorer._repr_html_().encode("utf-8"))
    if size > max_bytes:  # escaping (&quot; for every quote of the data) made it larger: once more, within the budget
        budget = int(max_bytes * len(explorer.page.encode("utf-8")) / size) - 1_000
        payload = explorer_payload(model, images, mean=mean, std=std, max_bytes=budget, **options)
        explorer = Explorer(payload, height)
        size = len(explorer._repr_html_().encode("utf-8"))
        if size > max_bytes:
            raise ExplorerTooLarge(f"the inline explorer takes {size:,} bytes, over max_bytes={max_bytes:,}", fit=0)
    return explorer


def show_explanations(shell: Any = None) -> bool:
    """Make IPython ``shell`` (default: the running one) show every :class:`~vit.explain.Explanation` as the PNG of
    its maps, :func:`~vit.explain.render.panels.explanation_png` (an explanation without maps keeps its plain repr);
    returns whether there was a shell. ``import vit.explain`` calls it when IPython is running."""
    if shell is None:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return False
    formatter = shell.display_formatter.formatters["image/png"]
    formatter.for_type_by_name("vit.explain.explanation", "Explanation", explanation_png)
    return True
