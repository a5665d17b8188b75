"""What an evaluation writes: ``evaluation.json`` (the run header, then every number), ``confusion_matrix.png``,
``reliability.png``, with corruptions ``corruptions.png``, and ``evaluation.html``, one self-contained page of them
all (``assets/evaluation.html``, Jinja2); the short table printed on the terminal; the W&B charts and tables.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import write_bytes, write_text
from ..text import plural

EVALUATION_FILE = "evaluation.json"
MAX_TABLE_CLASSES = 20
"""Classes the terminal's table lists; with more, the ones of lowest F1."""
ASSETS = Path(__file__).with_name("assets")


def write_evaluation(
    folder: str | Path,
    result: Mapping[str, Any],
    class_names: Sequence[str],
    corruption_examples: Mapping[str, Sequence[np.ndarray]] | None = None,
) -> list[Path]:
    """Write the evaluation ``result`` into ``folder`` (each file atomically) and return the files written.

    Args:
        folder: The run folder.
        result: The header and metrics (:meth:`~vit.evaluation.ClassificationMetrics.compute`'s, with optional
            ``corruptions`` from :func:`~vit.evaluation.evaluate_corruptions` and ``calibration``).
        class_names: The class names, in class order.
        corruption_examples: One example per corruption and severity, for ``corruptions.png``.
    """
    from ..explain.render.images import png_bytes
    from .figures import confusion_matrix_figure, corruption_grid_figure, reliability_figure

    folder = Path(folder)
    pictures = {
        "confusion_matrix.png": confusion_matrix_figure(result["confusion_matrix"], class_names),
        "reliability.png": reliability_figure(result["reliability"], result["ece"]),
    }
    corruptions = result.get("corruptions")
    if corruptions and corruption_examples:
        pictures["corruptions.png"] = corruption_grid_figure(corruption_examples, corruptions["accuracy"])
    written = [write_text(folder / EVALUATION_FILE, json.dumps(result, indent=2) + "\n")]
    encoded = {name: png_bytes(image) for name, image in pictures.items()}
    written += [write_bytes(folder / name, data) for name, data in encoded.items()]
    written.append(write_text(folder / "evaluation.html", render_html(result, encoded)))
    return written


def render_html(result: Mapping[str, Any], pictures: Mapping[str, bytes]) -> str:
    """The evaluation as one HTML page, its pictures embedded (``assets/evaluation.html``)."""
    import jinja2

    from ..explain.render.images import b64

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(ASSETS), autoescape=True, undefined=jinja2.StrictUndefined
    )
    images = {name.removesuffix(".png"): f"data:image/png;base64,{b64(data)}" for name, data in pictures.items()}
    return environment.get_template("evaluation.html").render(r=result, images=images)


def summary_table(result: Mapping[str, Any]) -> str:
    """The terminal's short table: the headline numbers, then precision / recall / F1 / support per class."""
    lines = [f"evaluation of {plural(result['num_images'], 'image')}"]
    head = [("accuracy", result["accuracy"]), ("top-5", result.get("top5")), ("macro F1", result["macro"]["f1"])]
    head += [("NLL", result["nll"]), ("Brier", result["brier"]), ("ECE", result["ece"]), ("MCE", result["mce"])]
    lines.append("  ".join(f"{name} {value:.4f}" for name, value in head if value is not None))
    if result.get("temperature") is not None:
        lines.append(f"probabilities divided by the checkpoint's temperature {result['temperature']:.4f}")
    rows = result["per_class"]
    if len(rows) > MAX_TABLE_CLASSES:  # a short table: the classes the model fails most, the rest in the JSON
        rows = sorted(rows, key=lambda row: row["f1"])[:MAX_TABLE_CLASSES]
        lines.append(f"the {len(rows)} classes of lowest F1 of {len(result['per_class'])} (all in {EVALUATION_FILE}):")
    width = max(8, *(len(row["class"]) for row in rows))
    lines.append(f"{'class':{width}s}  precision  recall     F1  support")
    for row in rows:
        numbers = f"{row['precision']:9.4f}  {row['recall']:6.4f}  {row['f1']:.4f}  {row['support']:7d}"
        lines.append(f"{row['class']:{width}s}  {numbers}")
    corruptions = result.get("corruptions")
    if corruptions:
        lines.append(
            f"corruptions ({corruptions['source']}): mean accuracy {corruptions['mean_corruption_accuracy']:.4f}, "
            f"clean {corruptions['clean_accuracy']:.4f} (one view)"
        )
        worst = sorted(corruptions["drop"].items(), key=lambda item: -item[1])[:3]
        lines.append("largest drops: " + ", ".join(f"{name} {drop:.4f}" for name, drop in worst))
    return "\n".join(lines)


def wandb_payload(
    result: Mapping[str, Any], class_names: Sequence[str], samples: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """W&B's own chart and table types for ``result``: the confusion matrix chart, the per-class table, the
    predictions table (``samples``: ``image`` uint8 ``(H, W, 3)``, ``label``, ``pred``, ``confidence``), the
    reliability and confusion pictures and, with corruptions, their 15 x 5 table.

    The chart is built from the synced counts (every rank's images), expanded to one (true, predicted) pair per image.
    """
    import wandb

    counts = np.asarray(result["confusion_matrix"])
    y_true = np.repeat(np.repeat(np.arange(len(counts)), len(counts)), counts.ravel()).tolist()
    y_pred = np.repeat(np.tile(np.arange(len(counts)), len(counts)), counts.ravel()).tolist()
    names = [str(n) for n in class_names]
    payload: dict[str, Any] = {
        "evaluation/confusion_matrix": wandb.plot.confusion_matrix(y_true=y_true, preds=y_pred, class_names=names),
        "evaluation/per_class": wandb.Table(
            columns=["class", "precision", "recall", "f1", "support"],
            data=[[r["class"], r["precision"], r["recall"], r["f1"], r["support"]] for r in result["per_class"]],
        ),
    }
    if samples:
        payload["evaluation/predictions"] = wandb.Table(
            columns=["image", "label", "prediction", "confidence", "correct"],
            data=[
                [wandb.Image(s["image"]), names[s["label"]], names[s["pred"]], s["confidence"], s["label"] == s["pred"]]
                for s in samples
            ],
        )
    corruptions = result.get("corruptions")
    if corruptions:
        payload["evaluation/corruptions"] = wandb.Table(
            columns=["corruption", *[f"severity {i + 1}" for i in range(5)], "drop"],
            data=[[name, *values, corruptions["drop"][name]] for name, values in corruptions["accuracy"].items()],
        )
    return payload


def scalar_summary(result: Mapping[str, Any]) -> dict[str, float]:
    """The headline numbers as W&B run summary columns (``evaluation/ece`` ...)."""
    keys = ("accuracy", "top5", "nll", "brier", "ece", "mce", "temperature")
    out = {f"evaluation/{k}": float(result[k]) for k in keys if result.get(k) is not None}
    out |= {f"evaluation/macro_{k}": float(v) for k, v in result["macro"].items()}
    if result.get("corruptions"):
        out["evaluation/mean_corruption_accuracy"] = float(result["corruptions"]["mean_corruption_accuracy"])
    return out


__all__ = ["EVALUATION_FILE", "render_html", "scalar_summary", "summary_table", "wandb_payload", "write_evaluation"]
