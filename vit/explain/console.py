"""What ``vit explain`` prints on stdout: a line per image (with ``--split val``, its true class and a mark on each
mistake, then the accuracy), and the tables of the measurements asked for."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..text import plural

MISTAKE = "<- wrong"
"""The mark after an image whose prediction is not its true class."""


def prediction_lines(explanation: Any, files: Sequence[Any]) -> list[str]:
    """``<file>  <predicted class>  <probability>``, with ``true <class>`` and :data:`MISTAKE` where the true class is
    known, and a last line with the accuracy over those images.

    Args:
        explanation: The :class:`~vit.explain.Explanation` (``preds``, ``probs``, ``labels``, ``class_name``).
        files: The image of each row (a path, or the name ``--split val`` gives it).
    """
    preds = explanation.preds.tolist()
    confidence = explanation.probs.gather(1, explanation.preds[:, None])[:, 0].tolist()
    labels = explanation.labels.tolist() if explanation.labels is not None else [-1] * len(preds)
    names = [explanation.class_name(p) for p in preds]
    width, name_width = max(len(str(f)) for f in files), max(len(n) for n in names)
    lines, known, wrong = [], 0, 0
    for file, pred, name, p, label in zip(files, preds, names, confidence, labels, strict=True):
        line = f"{str(file):<{width}}  {name:<{name_width}}  {p:.3f}"
        if label >= 0:
            known, wrong = known + 1, wrong + (pred != label)
            line += f"  true {explanation.class_name(label)}" + (f"  {MISTAKE}" if pred != label else "")
        lines.append(line.rstrip())
    if known:
        lines.append(f"accuracy {(known - wrong) / known:.1%}: {wrong} of {plural(known, 'image')} wrong")
    return lines


def measurement_text(explanation: Any, out: Path, json_path: Path | None) -> tuple[str, list[str]]:
    """The tables of ``--faithfulness``, ``--sanity`` and ``--heads`` (empty when none ran), and the files written
    for them, as the closing line names them."""
    parts, written = [], []
    if explanation.benchmark is not None:
        from .outputs import CURVES, faithfulness_table

        parts.append("\n\n".join(faithfulness_table(bench) for bench in explanation.benchmarks.values()))
        written += [f"JSON {json_path or out / 'faithfulness.json'}", f"curves {out / CURVES}"]
    if explanation.sanity is not None:
        parts.append(f"\nsanity check, cascading randomisation of {plural(explanation.sanity.num_images, 'image')}:")
        parts.append(explanation.sanity.table())
        written += [f"sanity {out / 'sanity.json'}"]
    if explanation.heads is not None:
        parts.append(f"\nwhich heads matter, mean ablation of {plural(explanation.heads.num_images, 'image')}:")
        parts.append(explanation.heads.table())
        written += [f"heads {out / 'heads.json'}"]
    return "\n".join(parts), written
