"""The README and the docs pages say the same thing: the default explanation, the CIFAR-10 command, the benchmark
suites, and digits for trying the quick-start model that it never trained on."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_home_page_leads_with_the_default_map():
    """AttnLRP is the default of ``vit explain`` and the README's picture; the home page shows it, not rollout."""
    index = (ROOT / "docs" / "index.md").read_text()
    understanding = next(line for line in index.splitlines() if line.startswith("- **Understanding**"))
    assert understanding.startswith("- **Understanding**: AttnLRP")
    assert re.findall(r"\]\((figures/[^)]+)\)", index) == ["figures/attnlrp_grid_digits.png"]
    assert "docs/figures/attnlrp_grid_digits.png" in README
    from vit.explain.command import DEFAULT_METHOD

    assert DEFAULT_METHOD == "attnlrp"


def test_every_cifar10_command_names_its_data_folder():
    pages = [README, *(p.read_text() for p in (ROOT / "docs").glob("*.md"))]
    commands = [line for text in pages for line in re.findall(r"vit fit [^`\n]*--data\.dataset cifar10\b[^`\n]*", text)]
    assert commands
    assert [c for c in commands if "--data.data_dir" not in c] == []


def test_the_readme_lists_every_bench_suite():
    from vit.bench.cli import SUITES

    listed = re.search(r"`vit bench --suite ([\w\\|]+)`", README).group(1).split("\\|")
    assert set(SUITES) <= set(listed), set(SUITES) - set(listed)


def test_the_readme_digits_are_validation_digits(tmp_path):
    """The README's one-liner writes digits 0 to 7 from the validation split, none of them a training image."""
    line = next(line for line in README.splitlines() if line.startswith('python -c "') and "my_digits" in line)
    code = line.removeprefix('python -c "').removesuffix('"')
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, env={"PYTHONPATH": str(ROOT)})
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    train, val = train_test_split(np.arange(len(digits.target)), test_size=0.2, stratify=digits.target, random_state=0)
    gray = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    files = sorted((tmp_path / "my_digits").glob("*.png"))
    assert [f.name for f in files] == [f"{k}.png" for k in range(8)]
    for k, file in enumerate(files):
        image = np.asarray(Image.open(file).convert("L"))
        same = [i for i in range(len(gray)) if np.array_equal(gray[i], image)]
        assert same and set(same) <= set(val), f"{file.name} is a training image"
        assert {int(digits.target[i]) for i in same} == {k}
