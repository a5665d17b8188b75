"""Griffe extension for the docs site: Sphinx roles in docstrings (:func:`x`, :class:`~a.b.C`) become inline code."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):`~?([\w.]+)(?:\(\))?`")


class SphinxRoles(griffe.Extension):
    """Rewrite the roles before the docstrings are parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(lambda m: f"`{m.group(1)}`", obj.docstring.value)
