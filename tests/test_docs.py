"""The documentation cannot rot: every ```python block of every page runs, and the site builds with --strict."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
LESSONS = sorted((DOCS / "lessons").glob("*.ipynb"))  # run by tests/test_notebooks.py
# A fenced python block; an HTML comment `<!-- no-run -->` on the line before it skips it.
BLOCK = re.compile(r"^(?P<marker><!-- no-run -->\n)?```python\n(?P<code>.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[tuple[int, str, bool]]:
    """``(line, code, skipped)`` of every python block of a page, in order."""
    return [
        (text.count("\n", 0, m.start("code")) + 1, m.group("code"), m.group("marker") is not None)
        for m in BLOCK.finditer(text)
    ]


def test_python_blocks_are_found_and_markers_honoured():
    text = "a\n```python\nx = 1\n```\n<!-- no-run -->\n```python\nraise SystemExit\n```\n```bash\nls\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n", False), (7, "raise SystemExit\n", True)]


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p.read_text())], ids=lambda p: p.name)
def test_page_code_runs(page, tmp_path, monkeypatch, one_thread):
    """The page's blocks share one namespace and run in order, on the CPU, in a fresh working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    from vit.data import DATASETS

    datasets = dict(DATASETS)  # a page may register a dataset: not for the tests that follow
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    try:
        for line, code, skipped in python_blocks(page.read_text()):
            if skipped:
                continue
            try:
                exec(compile(code, f"{page.relative_to(ROOT)}:{line}", "exec"), namespace)
            except Exception as err:
                raise AssertionError(f"the python block at {page.name} line {line} fails: {err!r}") from err
    finally:
        DATASETS.clear()
        DATASETS.update(datasets)


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of the project at ``root`` into ``site``; skips where mkdocs is not installed."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if mkdocs is None:
        pytest.skip("mkdocs is not installed")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [mkdocs, "build", "--strict", "--site-dir", str(site)]
    return subprocess.run(command, cwd=root, capture_output=True, text=True, env=env)


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    """The site builds with every warning an error (API pages included: a docstring griffe cannot read fails)."""
    result = mkdocs_build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    for lesson in LESSONS:  # rendered by mkdocs-jupyter, their links made site links (scripts/mkdocs_lesson_links.py)
        page = (tmp_path / "site" / "lessons" / lesson.stem / "index.html").read_text()
        assert 'src="../../figures/' in page and "../figures/" not in page.replace("../../figures/", "")
    assert 'id="vit.layers.Attention"' in (tmp_path / "site" / "api-layers" / "index.html").read_text()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("page", "text", "message"),
    [
        ("orphan.md", "# Not in the nav\n", 'not included in the "nav"'),
        ("index.md", "\n[a page](no-such-page.md)\n", "'no-such-page.md', but the target is not found"),
        ("index.md", "\n[a section](models.md#no-such-anchor)\n", "does not contain an anchor '#no-such-anchor'"),
        ("lessons/attention.ipynb", "[a page](../no-such-page.md)", "contains a link '../no-such-page.md'"),
        ("lessons/attention.ipynb", "[a section](../models.md#no-such-anchor)", "#no-such-anchor': no such anchor"),
    ],
    ids=["page-missing-from-nav", "broken-link", "missing-anchor", "lesson-broken-link", "lesson-missing-anchor"],
)
def test_mkdocs_build_strict_fails_on(tmp_path, page, text, message):
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    (tmp_path / "vit").symlink_to(ROOT / "vit")
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")  # the griffe extension mkdocs.yml names
    if page.endswith(".ipynb"):  # a markdown cell more
        notebook = json.loads((tmp_path / "docs" / page).read_text())
        notebook["cells"].append({"cell_type": "markdown", "id": "added", "metadata": {}, "source": text})
        (tmp_path / "docs" / page).write_text(json.dumps(notebook))
    else:
        with open(tmp_path / "docs" / page, "a") as f:
            f.write(text)
    result = mkdocs_build(tmp_path, tmp_path / "site")
    assert result.returncode != 0
    assert message in result.stdout + result.stderr


def load_results_tables():
    spec = importlib.util.spec_from_file_location("results_tables", ROOT / "scripts" / "results_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_performance_tables_match_results():
    """docs/performance_tables.md is what scripts/results_tables.py makes of docs/results/*.json."""
    tables = load_results_tables()
    assert (DOCS / "performance_tables.md").read_text() == tables.render(), (
        "docs/performance_tables.md is out of date: run python scripts/results_tables.py"
    )
    for suite in tables.SUITES:  # every committed result says where it comes from
        report = json.loads((DOCS / "results" / f"{suite}.json").read_text())
        assert {"date", "machine", "torch", "timm", "command"} <= report.keys(), suite
        assert report["command"].startswith(f"python -m vit.bench --suite {suite} ")
    for name in tables.GPU_REPORTS:  # the GPU check's benchmarks likewise, each under its own heading
        report = json.loads((DOCS / "results" / "gpu" / f"{name}.json").read_text())
        assert {"date", "machine", "torch", "timm", "command"} <= report.keys(), name
        assert report["device"] == "cuda" and f"--json docs/results/gpu/{name}.json" in report["command"]
        assert f"### {tables.GPU_REPORTS[name]}\n" in tables.render()


def test_results_tables_check_fails_on_a_stale_page(tmp_path, monkeypatch):
    tables = load_results_tables()
    monkeypatch.setattr(tables, "TABLES", tmp_path / "performance_tables.md")
    assert tables.main(["--check"]) == 1  # missing
    assert tables.main([]) == 0 and tables.main(["--check"]) == 0
    (tmp_path / "performance_tables.md").write_text(tables.render().replace("PASS", "FAIL", 1))
    assert tables.main(["--check"]) == 1


def lesson_text(path: Path) -> str:
    """The markdown cells of a lesson, its links written as from docs/ (``../figures/`` -> ``figures/``)."""
    cells = json.loads(path.read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return text.replace("](../", "](")


def test_every_figure_is_used_and_exists():
    """Each picture under docs/figures/ is shown by a page or a lesson, and each picture they show exists."""
    text = "\n".join([*(p.read_text() for p in PAGES), *map(lesson_text, LESSONS)])
    shown = set(re.findall(r"\]\((figures/[^)]+\.png)\)", text))
    present = {f"figures/{p.name}" for p in (DOCS / "figures").glob("*.png")}
    assert shown <= present, sorted(shown - present)
    assert present <= shown, sorted(present - shown)


def test_architecture_page_maps_every_module():
    """docs/architecture.md names every module of the package, and names no module that is gone."""
    text = (DOCS / "architecture.md").read_text()
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "vit").rglob("*.py")}
    listed = set(re.findall(r"^\| `(vit/[\w/]+\.py)` \|", text, re.MULTILINE))
    assert modules - listed == set(), "add a line per new module to docs/architecture.md"
    assert listed - modules == set(), "modules listed in docs/architecture.md that no longer exist"


def test_tests_named_in_the_docs_exist():
    """Every ``tests/<file>.py::<test>`` a page or lesson names (the canary tests of the architecture page) is still
    there."""
    text = "\n".join([*(p.read_text() for p in PAGES), *map(lesson_text, LESSONS)])
    named = re.findall(r"(tests/\w+\.py)((?:::\w+)?)", text)
    assert named, "the architecture page names its canary tests"
    for path, test in named:
        assert (ROOT / path).is_file(), path
        if test:
            assert re.search(rf"^def {test[2:]}\(", (ROOT / path).read_text(), re.MULTILINE), f"{path}{test}"
