"""No two modules of ``vit`` import each other, directly or around a circle (imports inside functions count: they are
the same dependency, only deferred). The graph is read from the source with ``ast``; nothing is imported.

And the ``vit`` command answers ``--help`` and bad arguments before torch: each case runs in a fresh interpreter and
reports the heavy packages it loaded.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "vit"


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The ``vit`` modules that ``module`` imports (``from a import b`` names ``a.b`` when that is a module)."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking_only(node):
            stack.extend(node.orelse)  # annotations only: not an import at run time
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in modules else base)
    return {name for name in found if name in modules and name != module}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}`` for every ``.py`` file under ``root``."""
    files = {_module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    modules = set(files)
    return {
        name: _imports(ast.parse(path.read_text(encoding="utf-8")), name, path.name == "__init__.py", modules)
        for name, path in files.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_cycle_finder_finds_a_circle_and_only_circles(tmp_path: Path) -> None:
    pkg = tmp_path / "vit"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n    from vit.sub import b\n")  # deferred: still a dependency
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from ..a import f\nfrom typing import TYPE_CHECKING\n")
    (pkg / "sub" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from vit import a\n")
    (pkg / "d.py").write_text("from vit.sub import c\nfrom vit import a\n")
    graph = import_graph(pkg)
    assert graph["vit.a"] == {"vit.sub.b"} and graph["vit.sub.b"] == {"vit.a"}
    assert graph["vit.sub.c"] == set() and graph["vit.d"] == {"vit.sub.c", "vit.a"}
    assert graph["vit"] == {"vit.a"}
    assert cycles(graph) == [["vit.a", "vit.sub.b"]]


def test_the_data_package_has_no_import_circle() -> None:
    graph = import_graph()
    data = {name: {t for t in targets if t.startswith("vit.data")} for name, targets in graph.items()}
    assert [c for c in cycles(data) if c[0].startswith("vit.data")] == []


def test_the_package_has_no_import_circle() -> None:
    assert cycles(import_graph()) == []


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        ("vit.models", "vit.checkpoints"),
        ("vit.explain.explanation", "vit.explain.render"),
        ("vit.layers", "vit.models"),
    ],
)
def test_a_lower_floor_never_imports_a_higher_one(lower: str, higher: str) -> None:
    """Not even inside a function: the checkpoints build models, the renderers draw explanations (a notebook's
    display formatter is registered by the renderers, not looked up by the data type)."""
    within = lambda name, package: name == package or name.startswith(package + ".")  # noqa: E731
    graph = import_graph()
    assert (
        sorted((m, t) for m, targets in graph.items() if within(m, lower) for t in targets if within(t, higher)) == []
    )


HEAVY = ("torch", "lightning", "wandb", "timm", "numpy")
"""Packages the command line must not import to show help or reject an argument."""

_PROBE = """
import json, sys
from vit.main import main
try:
    status = main(sys.argv[1:])
except SystemExit as stop:
    status = stop.code
print(json.dumps({"status": status, "loaded": sorted({m.split('.')[0] for m in sys.modules} & set(HEAVY))}))
"""


def _loaded_by(argv: list[str], tmp_path: Path) -> tuple[int, list[str]]:
    code = f"HEAVY = {HEAVY!r}\n{_PROBE}"
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["status"], result["loaded"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["compare", "--help"],
        ["bench", "--help"],
        ["export", "--help"],
        ["explain", "--help"],
        ["data", "--help"],
        ["data", "prepare", "--help"],
        ["data", "prepare", "--out", "shards"],
        ["bench", "--suit", "model"],
        ["compare", "--metri", "val/acc"],
        ["compare", "no-such-folder"],
        ["sweep", "--help"],
        ["sweep", "no-such-sweep.yaml", "--budget", "5m"],
        ["sweep", "no-such-sweep.yaml", "--budget", "5x"],
        ["export", "--ckpt_path", "missing.ckpt", "--out", "exported"],
        ["export", "--out", "exported"],
        ["fti"],
    ],
    ids=" ".join,
)
def test_the_command_line_answers_before_torch(argv, tmp_path):
    status, loaded = _loaded_by(argv, tmp_path)
    assert status == (0 if "--help" in argv else 2)
    assert loaded == [], f"vit {' '.join(argv)} imported {loaded}"
    assert not (tmp_path / "exported").exists()


def test_import_vit_loads_no_other_module_and_names_are_lazy(tmp_path):
    """``import vit`` runs its ``__init__`` only; every public name and subpackage comes on first use."""
    code = (
        "import sys\n"
        "import vit\n"
        "assert [m for m in sys.modules if m.startswith('vit.')] == ['vit.lazy'], sorted(sys.modules)\n"
        "assert not {'torch', 'numpy'} & set(sys.modules)\n"
        "assert set(vit.__all__) <= set(dir(vit))\n"
        "from vit import VisionTransformer, create_model, load\n"
        "import vit.layers as layers\n"
        "assert vit.Attention is layers.Attention and vit.load is load and vit.layers is layers\n"
        "assert all(getattr(vit, name) is not None for name in ('WindowAttention', 'load_pretrained', 'list_models'))\n"
        "assert 'vit.checkpoints' not in sys.modules or 'vit.checkpoints.loading' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_model_layer_does_not_import_the_checkpoints_package(tmp_path):
    """``vit.models`` is the floor ``vit.checkpoints`` builds on: importing it loads no checkpoint reader."""
    code = "import sys\nimport vit.models\nprint(sorted(m for m in sys.modules if m.startswith('vit.checkpoints')))\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_python_m_vit_help_imports_nothing_heavy(tmp_path):
    """``python -m vit --help`` as users run it, read with ``-X importtime``: no heavy package among the imports."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "vit", "--help"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0 and "usage: vit SUBCOMMAND" in done.stdout
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in done.stderr.splitlines() if "|" in line}
    assert "vit" in imported and not imported & set(HEAVY), sorted(imported & set(HEAVY))
