"""What a user reads: a short README that runs CI's test command, and files that speak only of the project itself."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_COMMAND = (
    'python -m venv .venv && . .venv/bin/activate && pip install -e ".[dev]" '
    '&& pip install --no-deps "quantus>=0.6" "lxt>=2.1" "imagecorruptions>=1.1" && pytest -n auto --durations=20'
)
ELSEWHERE = re.compile(r"\.\./shared|/work/|(?<!Lightning )\bissues? #?\d+|device tool|\bthe carry\b", re.IGNORECASE)
"""Places and words of the workshop the project was built in, which a user does not have (an upstream project's
issue, ``Lightning issue #20550``, is a reference a user can follow)."""


def user_facing_files() -> list[Path]:
    """README, docs pages, configs, scripts, mkdocs.yml and the package: the tracked files a user reads."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    keep = ("README.md", "mkdocs.yml", "pyproject.toml", "docs/", "configs/", "scripts/", "vit/")
    return [ROOT / f for f in listed if f.startswith(keep) and not f.endswith((".png", ".json"))]


def test_readme_is_an_entry_page_with_ci_test_command():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert TEST_COMMAND in text and TEST_COMMAND in (ROOT / ".ci" / "run").read_text()
    assert 'pytest -m "not slow" -n auto' in text  # the quick tier


def test_the_project_speaks_only_of_itself():
    files = user_facing_files()
    assert len(files) > 50  # git sees the tree
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if ELSEWHERE.search(line)
    ]
    assert not found, "\n".join(found)


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(((?!https?://)[^)#]+)\)", text)
    assert targets and all((ROOT / t).exists() for t in targets), [t for t in targets if not (ROOT / t).exists()]


def test_no_test_module_imports_another():
    """Shared helpers live in tests/conftest.py as fixtures, or in helper modules (tests/cli_args.py...): a test module
    that imports another runs its tests' module-level code twice and breaks when that module is renamed or skipped."""
    import ast

    modules = {path.stem for path in (ROOT / "tests").glob("test_*.py")}
    found = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            found += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in modules]
    assert modules and not found, found


def code_lines(function, lines: list[str], docstrings: set[int]) -> int:
    """Lines of code of ``function``'s body: neither blank, nor a comment, nor a docstring."""
    body = range(function.body[0].lineno, function.end_lineno + 1)
    return sum(
        1 for i in body if i not in docstrings and lines[i - 1].strip() and not lines[i - 1].strip().startswith("#")
    )


def test_no_file_over_450_lines_and_no_function_over_80_lines_of_code():
    import ast

    long_files, long_functions = [], []
    for path in sorted((ROOT / "vit").rglob("*.py")):
        text = path.read_text()
        lines, tree = text.splitlines(), ast.parse(text)
        name = path.relative_to(ROOT)
        if len(lines) > 450:
            long_files.append(f"{name}: {len(lines)} lines")
        docstrings = {
            i
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
            and isinstance(node.body[0].value.value, str)
            for i in range(node.body[0].lineno, node.body[0].end_lineno + 1)
        }  # fmt: skip
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and code_lines(node, lines, docstrings) > 80:
                long_functions.append(f"{name}:{node.lineno} {node.name}: {code_lines(node, lines, docstrings)}")
    for path in sorted([*(ROOT / "scripts").glob("*.py"), *(ROOT / "vit").rglob("*.js")]):  # the rule holds there too
        count = len(path.read_text().splitlines())
        long_files += [f"{path.relative_to(ROOT)}: {count} lines"] if count > 450 else []
    assert long_files == [] and long_functions == [], long_files + long_functions
