"""The web page of ``vit serve`` (``GET /``): one self-contained HTML file, nothing from another host.

Pick, drop or paste images: each is posted on its own to ``/predict?top_k=5&explain=default&explorer=1`` and its
answer shown in a card of its own: the top-5 classes as bars, the explanation's overlay beside the image with what
its colours mean (a signed map on the diverging scale of :mod:`vit.explain.colors`, red for the class and blue
against it; an unsigned one on the sequential scale), and the attention explorer of
:mod:`vit.explain.render.explorer`. A failed request shows its status and the server's one-line ``error``. ``GET
/info`` names the model, its classes and input size above.

The explorer's template, script and style are inlined from ``vit/explain/render/assets`` (not copied): the page's
script fills the template with each answer's explorer payload as :func:`~vit.explain.render.explorer.render_explorer`
does and shows it in a frame of its own, where the explorer script runs as in a written report.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

ASSETS = Path(__file__).with_name("assets")
PREDICT_QUERY = "top_k=5&explain=default&explorer=1"
"""The query of the page's ``POST /predict``: the top-5, the model's default explanation, the explorer payload."""


@cache
def page_html() -> str:
    """The page: ``assets/index.html`` with its style, its script and the explorer's assets inlined."""
    import jinja2
    from markupsafe import Markup

    from ..explain.render.explorer import ASSETS as EXPLORER_ASSETS
    from ..explain.render.explorer import explorer_script, page_json
    from ..explain.render.explorer_codes import CODES

    explorer = {kind: _read(EXPLORER_ASSETS / f"explorer.{kind}") for kind in ("html", "css")}
    explorer["js"] = explorer_script()
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(ASSETS), autoescape=True, undefined=jinja2.StrictUndefined
    )
    return environment.get_template("index.html").render(
        css=Markup(_read(ASSETS / "page.css")),
        js=Markup(_read(ASSETS / "page.js")),
        # JSON inert inside a <script> element: page_json writes <, > and & as \u escapes.
        explorer=Markup(page_json({**explorer, "codes": list(CODES)})),
        query=PREDICT_QUERY,
    )


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")
