"""mkdocs hook: the relative links of the notebook lessons (docs/lessons/*.ipynb, rendered by mkdocs-jupyter) work on
the site and are checked like a Markdown page's.

A notebook links to files as they lie beside it (``../figures/x.png``, ``../explanations.md#explorer``), which is
what Jupyter and a clone of the project resolve. mkdocs rewrites such links in Markdown pages only; mkdocs-jupyter
hands the notebook over as finished HTML, so here each relative ``href``/``src`` of a notebook page becomes the URL of
its target on the site (a page's ``.md``/``.ipynb`` its page URL), and a target that is not a documentation file, or
an anchor the target page does not have, is a warning, which ``mkdocs build --strict`` turns into a failure.
"""

from __future__ import annotations

import logging
import posixpath
import re

log = logging.getLogger("mkdocs.hooks.lesson_links")
LINK = re.compile(r'\b(?P<attr>href|src)="(?P<path>[^"#:/?][^"#:?]*)(?P<anchor>#[^"]*)?"')
_anchors: list[tuple[str, object, str]] = []  # (linking page, target file, anchor), checked once the site is built


def on_page_content(html: str, page, config, files) -> str:
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    folder = posixpath.dirname(page.file.src_uri)

    def resolve(m: re.Match) -> str:
        path, anchor = m["path"], m["anchor"] or ""
        target = files.get_file_from_path(posixpath.normpath(posixpath.join(folder, path)))
        if target is None:
            log.warning(f"Doc file '{page.file.src_uri}' contains a link '{path}', but the target is not found.")
            return m[0]
        if anchor and target.is_documentation_page():
            _anchors.append((page.file.src_uri, target, anchor[1:]))
        return f'{m["attr"]}="{target.url_relative_to(page.file)}{anchor}"'

    return LINK.sub(resolve, html)


def on_post_build(config) -> None:
    for source, target, anchor in _anchors:
        with open(target.abs_dest_path, encoding="utf-8") as f:
            if f'id="{anchor}"' not in f.read():
                log.warning(f"Doc file '{source}' links to '{target.src_uri}#{anchor}': no such anchor.")
    _anchors.clear()
