"""Names of a package imported on first use (PEP 562): one home for the ``__getattr__`` and ``__dir__`` that let
``import vit`` (and ``vit.explain``, ``vit.checkpoints``, ``vit.compare``) load nothing heavy until a name is asked
for, so that the command line answers before torch is imported.

    __getattr__, __dir__ = attach(__name__, {"create_model": "vit.models", ...})
    __getattr__, __dir__ = attach(__name__, type_checking_names(__file__))  # names from the TYPE_CHECKING imports
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from pathlib import Path
from typing import Any


def attach(
    package: str, where: Mapping[str, str], submodules: bool = False
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``'s lazy names, to assign in its ``__init__``.

    Args:
        package: The package's ``__name__``.
        where: Each public name to the module that defines it (absolute, or relative to ``package`` with dots).
        submodules: Also import ``package.<name>`` on first use when ``name`` is a submodule (as ``import
            package.name`` would), for ``vit.layers`` and the like.

    The first access to a name imports its module and stores the value in the package, so later ones are plain
    attribute lookups.
    """

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is not None:
            value = getattr(import_module(module, package), name)
            setattr(sys.modules[package], name, value)  # later lookups skip this function
            return value
        if submodules and not name.startswith("_"):
            from importlib.util import find_spec

            if find_spec(f"{package}.{name}") is not None:
                return import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__


def type_checking_names(init_file: str) -> dict[str, str]:
    """Name -> module of every import in the ``if TYPE_CHECKING:`` block of a package's ``__init__.py``: the block
    type checkers and the API docs read, made the one list of the package's lazy names (relative modules keep their
    dots, for :func:`attach`)."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    return {alias.name: "." * node.level + (node.module or "") for node in block.body for alias in node.names}
