"""Benchmark result files and the tables the performance page shows from them.

    python scripts/results_tables.py record model -- --threads 1 --models vit_small_patch4_32 --batch-sizes 16
    python scripts/results_tables.py                 # rewrite docs/performance_tables.md from docs/results/*.json
    python scripts/results_tables.py --check         # exit 1 when docs/performance_tables.md is out of date

``record SUITE -- ARGS`` runs ``python -m vit.bench --suite SUITE ARGS --json docs/results/SUITE.json`` and adds
the command and the machine's CPU model to the report, so every committed number says where it comes from.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from vit.atomic import write_text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
TABLES = ROOT / "docs" / "performance_tables.md"
SUITES = ("model", "attention", "data")


def cpu_model() -> str:
    """The CPU model as /proc/cpuinfo names it (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def record(suite: str, bench_args: list[str]) -> int:
    """Run one suite into ``docs/results/<suite>.json`` and stamp it with its command and machine."""
    path = RESULTS / f"{suite}.json"
    args = ["--suite", suite, *bench_args, "--json", str(path.relative_to(ROOT))]
    rc = subprocess.call([sys.executable, "-m", "vit.bench", *args], cwd=ROOT)
    if rc:
        return rc
    report = json.loads(path.read_text())
    report["command"] = shlex.join(["python", "-m", "vit.bench", *args])
    report["machine"] = f"{cpu_model()}, {report.get('cpu_count')} cores"
    write_text(path, json.dumps(report, indent=2, default=str) + "\n")
    return 0


def fmt(value: Any, spec: str = "") -> str:
    """A table cell: ``–`` for a missing value."""
    if value is None:
        return "–"
    return format(value, spec) if spec else str(value)


def table(columns: list[tuple[str, str, str]], rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines of ``rows`` under ``columns`` (key, header, format spec)."""
    lines = ["| " + " | ".join(header for _, header, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(row.get(key), spec) for key, _, spec in columns) + " |" for row in rows]
    return lines


def header(suite: str, report: dict[str, Any]) -> list[str]:
    """Where a table's numbers come from: date, machine, versions, threads, load and command."""
    load = report.get("load_average") or []
    return [
        f"### {suite} suite",
        "",
        f"- date: {report['date']}",
        f"- machine: {report.get('machine', report.get('device_name'))} ({report['device']})",
        f"- versions: torch {report['torch']}, timm {report['timm']}, Python {report['python']}",
        f"- threads: {report['threads']}; load average at start: {', '.join(f'{x:.2f}' for x in load) or '–'}",
        f"- command: `{report.get('command', '–')}`",
        "",
    ]


def model_rows(report: dict[str, Any]) -> list[str]:
    rows = [
        {
            "model": result["model"],
            "phase": phase,
            "batch_size": result["batch_size"],
            "ours_img_s": result[phase]["ours_images_per_s"]["median"],
            "timm_img_s": result[phase]["timm_images_per_s"]["median"],
            "median_ratio": result[phase]["median_ratio"],
            "ratio_iqr": "{q1:.3f}–{q3:.3f}".format(**result[phase]["ratio_spread"]),
            "gflops_per_img": result[f"{'forward' if phase == 'inference' else 'train'}_gflops_per_image"],
        }
        for result in report["model"]["results"]
        for phase in ("train", "inference")
        if phase in result
    ]
    return table(
        [
            ("model", "model", ""),
            ("phase", "phase", ""),
            ("batch_size", "batch", ""),
            ("ours_img_s", "ours img/s", ".1f"),
            ("timm_img_s", "timm img/s", ".1f"),
            ("median_ratio", "median ratio ours/timm", ".3f"),
            ("ratio_iqr", "ratio IQR", ""),
            ("gflops_per_img", "GFLOP/img", ".2f"),
        ],
        rows,
    )


def attention_rows(report: dict[str, Any]) -> list[str]:
    rows = report["attention"]["results"]
    layers = list(dict.fromkeys(row["layer"] for row in rows))
    grids = list(dict.fromkeys(row["grid"] for row in rows))
    value = {(row["grid"], row["layer"]): row.get("us_per_token_cpu_time", row["us_per_token"]) for row in rows}
    lines = ["| grid (CPU µs / token) | " + " | ".join(layers) + " |", "|" + "---|" * (len(layers) + 1)]
    for grid in grids:
        lines.append(
            f"| {grid}×{grid} | " + " | ".join(fmt(value.get((grid, layer)), ".1f") for layer in layers) + " |"
        )
    last = grids[-1]
    speedup = {
        row["layer"]: row.get("speedup_vs_global_cpu_time", row.get("speedup_vs_global"))
        for row in rows
        if row["grid"] == last
    }
    cells = " | ".join(fmt(speedup.get(layer), ".2f") for layer in layers)
    lines.append(f"| speed-up over global at {last}×{last} | {cells} |")
    return lines


def data_rows(report: dict[str, Any]) -> list[str]:
    rows = report["data"]["results"]
    return table(
        [
            ("pipeline", "pipeline", ""),
            ("implementation", "implementation", ""),
            ("decoder", "decoder", ""),
            ("input", "input", ""),
            ("normalise", "normalise", ""),
            ("images_per_s", "images / wall s", ",.0f"),
            ("images_per_cpu_s", "images / CPU s", ",.0f"),
        ],
        rows,
    )


def checks(report: dict[str, Any]) -> list[str]:
    return [f"- {'PASS' if c['passed'] else 'FAIL'} {c['name']}: {c['detail']}" for c in report.get("checks", [])]


def render() -> str:
    """The whole generated page, from every ``docs/results/<suite>.json`` that exists."""
    out = [
        "<!-- generated by scripts/results_tables.py from docs/results/*.json: do not edit by hand -->",
        "",
        "# Result tables",
        "",
        "Generated from the JSON reports under `docs/results/`; see [Performance](performance.md) for how to read "
        "them and how to run the benchmarks on your own machine.",
        "",
    ]
    builders = {"model": model_rows, "attention": attention_rows, "data": data_rows}
    for suite in SUITES:
        path = RESULTS / f"{suite}.json"
        if not path.exists():
            continue
        report = json.loads(path.read_text())
        out += header(suite, report) + builders[suite](report) + [""] + checks(report) + [""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["record"]:
        rest = argv[1:]
        if not rest or rest[0] not in SUITES:
            print(f"error: record needs a suite, one of {', '.join(SUITES)}", file=sys.stderr)
            return 2
        return record(rest[0], [a for a in rest[1:] if a != "--"])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the tables are out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not TABLES.exists() or TABLES.read_text() != text:
            print(f"{TABLES} is out of date: run python scripts/results_tables.py", file=sys.stderr)
            return 1
        return 0
    write_text(TABLES, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
