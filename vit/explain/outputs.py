"""What ``vit explain`` writes: overlays and a grid per method, the benchmark's JSON and curves, the HTML report.

Every file is written whole (:func:`vit.atomic.write_bytes`: a temporary name, then a rename), so a reader never
sees half a file and a failed run leaves no partial picture behind.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from ..atomic import write_bytes
from ..text import plural
from .colors import is_signed
from .explanation import Explanation
from .method_benchmark import MethodBenchmark, plot_benchmarks
from .methods import METHODS
from .mistakes import Mistakes
from .progress import Progress
from .render.images import png_bytes
from .render.mistakes import render_mistakes
from .render.panels import render_grid, render_panel
from .render.report import render_report

CURVES = "faithfulness_curves.png"
MISTAKES = "mistakes.png"
GRID_IMAGES = 32  # the grid PNG shows the first images only


def faithfulness_table(bench: MethodBenchmark) -> str:
    """The benchmark as an aligned text table under a line saying how it was measured."""
    return (
        f"faithfulness on {plural(bench.num_images, 'image')} ({bench.steps} steps, {bench.baseline} baseline): "
        "lower deletion and higher insertion area are better, and higher SRG (least-relevant-first area minus deletion "
        "area); x random = the ratio to a random patch order; 95 % bootstrap intervals over the images\n"
        + bench.table()
    )


def report_header(*, model: str, checkpoint: Path, images: str, methods: Sequence[str], command: str) -> dict:
    """What every JSON of ``vit explain`` starts with: the model, checkpoint, images and methods, then where and how
    it was measured (:func:`vit.env.run_header`)."""
    from ..env import run_header

    header = {"model": model, "checkpoint": str(checkpoint), "images": images, "methods": list(methods)}
    return {**header, **run_header(command)}


def benchmark_report(benchmarks: Mapping[str, MethodBenchmark], header: dict) -> dict:
    """The JSON of ``--faithfulness``: ``header``, the first removal's :meth:`MethodBenchmark.to_dict` at the top (as
    before there were several), and every removal's under ``removals``."""
    first = next(iter(benchmarks.values()))
    removals = {name: bench.to_dict() for name, bench in benchmarks.items()}
    return {**header, **first.to_dict(), "removals": removals}


def write_outputs(
    explanation: Explanation,
    *,
    files: Sequence[Path],
    out: Path,
    alpha: float,
    overlays: bool = True,
    json_path: Path | None = None,
    curves_title: str = "",
    report: dict | None = None,
    measured: Mapping[str, dict] | None = None,
    html_path: Path | None = None,
    html_title: str = "explanations",
    model: nn.Module | None = None,
    pixels: torch.Tensor | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    bits: int | str = "auto",
    mistakes: Mistakes | None = None,
) -> None:
    """Overlays (``overlays``) and a grid per method into ``out``, the benchmark's ``report`` as JSON
    (``json_path``, else ``out/faithfulness.json``) with its curves, the other measurements (file name -> JSON, e.g.
    ``sanity.json``) into ``out``, the most confident ``mistakes`` as ``out/mistakes.png`` (and in the report), and the
    HTML report at ``html_path``."""
    captions = explanation.captions()
    first = explanation.select(slice(0, GRID_IMAGES))
    for method, maps in explanation.maps.items():
        class_specific = METHODS[method].class_specific and explanation.target is not None
        label = f"{method} of {explanation.class_name(explanation.target)}" if class_specific else method
        signed = is_signed(method)
        if overlays:
            progress = Progress(method, len(files), enabled=True)
            for stem, image, grid_map, caption in zip(
                output_stems(files), explanation.images, maps, captions, strict=True
            ):
                panel = render_panel(image, grid_map, f"{caption} · {label}", signed=signed, alpha=alpha, size=224)
                write_bytes(out / f"{stem}_{method}.png", png_bytes(panel))
                progress.update(1)
            progress.close(f"overlays of {plural(len(files), 'image')} in {progress.seconds:.1f} s")
        grid = render_grid(first, first.maps[method], ncols=min(4, len(files)), title=label, signed=signed, alpha=alpha)
        write_bytes(out / f"{method}_grid.png", png_bytes(grid))
    if explanation.benchmark is not None and report is not None:
        write_bytes(json_path or out / "faithfulness.json", (json.dumps(report, indent=2) + "\n").encode())
        plot_benchmarks(explanation.benchmarks, out / CURVES, title=curves_title)
    for name, value in (measured or {}).items():
        write_bytes(out / name, (json.dumps(value, indent=2) + "\n").encode())
    picture = None if mistakes is None else render_mistakes(mistakes, alpha=alpha)
    if picture is not None:
        write_bytes(out / MISTAKES, png_bytes(picture))
    if html_path is not None:
        progress = Progress("report", len(files), enabled=True)
        html = render_report(files, explanation, title=html_title, alpha=alpha, model=model, pixels=pixels,
                             mean=mean, std=std, bits=bits, mistakes=mistakes)  # fmt: skip
        write_bytes(html_path, html.encode())
        progress.close(f"{html_path} with the explorer, {len(html) / 1e6:.1f} MB in {progress.seconds:.1f} s")


def output_stems(files: Sequence[Path]) -> list[str]:
    """One output stem per file: its stem, ``<folder>_<stem>`` where stems repeat, then an index if still equal."""
    stems = [file.stem for file in files]
    names = [f"{file.parent.name}_{file.stem}" if stems.count(file.stem) > 1 else file.stem for file in files]
    return [f"{name}_{i}" if names.count(name) > 1 else name for i, name in enumerate(names)]
