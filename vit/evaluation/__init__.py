"""Where a model fails: per-class metrics, calibration, robustness to common corruptions, and their pictures.

- :mod:`~vit.evaluation.metrics`: :class:`ClassificationMetrics`, torchmetrics states synced across DDP ranks
  (top-1 / top-5, per-class precision / recall / F1, confusion matrix, NLL, Brier, ECE / MCE, reliability bins);
- :mod:`~vit.evaluation.calibration`: temperature scaling (:func:`fit_temperature`, Guo et al. 2017);
- :mod:`~vit.evaluation.corruptions`: the 15 common corruptions x 5 severities (Hendrycks & Dietterich 2019);
- :mod:`~vit.evaluation.robustness`: :func:`evaluate_corruptions`, a model's accuracy under them;
- :mod:`~vit.evaluation.figures`: confusion matrix, reliability diagram, corrupted examples;
- :mod:`~vit.evaluation.report`: ``evaluation.json``, the PNGs, ``evaluation.html``, the terminal table, W&B.

``vit test`` runs them through :class:`vit.callbacks.EvaluationReport`; ``vit calibrate`` fits the temperature.
Names are imported on first use (PEP 562), so ``vit calibrate --help`` answers before torch is imported.
"""

from vit.lazy import attach

_NAMES = {
    "vit.evaluation.metrics": ("N_BINS", "ClassificationMetrics", "reliability_table"),
    "vit.evaluation.calibration": (
        "TEMPERATURE_KEY", "calibrate_checkpoint", "calibration_summary", "fit_temperature",
    ),
    "vit.evaluation.corruptions": ("CORRUPTIONS", "corrupt", "iter_corrupted"),
    "vit.evaluation.robustness": ("corruption_report", "evaluate_corruptions", "predict_classes"),
    "vit.evaluation.figures": (
        "confusion_matrix_figure", "corruption_grid_figure", "reliability_figure", "reliability_pair_figure",
    ),
    "vit.evaluation.report": ("EVALUATION_FILE", "summary_table", "write_evaluation"),
}  # fmt: skip
_LAZY = {name: module for module, names in _NAMES.items() for name in names}
__getattr__, __dir__ = attach(__name__, _LAZY)
__all__ = sorted(_LAZY)
