"""Compare W&B runs: a table of the settings that differ, best val/acc, last loss and throughput, and a plot.

    vit compare runs/                                 # every fit run under a folder (offline)
    vit compare runs/quickstart/RUN_A runs/quickstart/RUN_B
    vit compare runs/ --all                           # also validate/predict runs and crashed ones
    vit compare --project ENTITY/PROJECT [--group quickstart] [--last 10]   # online, W&B API

Offline runs (``wandb/offline-run-*/run-*.wandb``) are read back with wandb's own tool, ``wandb leet inspect``, so
nothing needs a network. Only fit runs that finished are compared unless ``--all`` is given (a fit stopped by Ctrl-C or
SIGTERM is ``interrupted``, as ``vit fit`` records in its W&B summary); the parts of a resumed run
(the same W&B run id, or the same run folder ``runs/<config>/<run name>/``) count as one run. Settings are compared key
by key in the nested run config that ``vit fit`` logs (``model.lr``, ``data.dataset``, ...); only the keys whose
values differ between the runs are shown, beside the attention each run used (``global``, ``window``, ``sliding``).
The table's headers say which value each column holds (``val/acc (best)``, ``train/loss (last)``). The plot
(``--plot``, default ``runs/compare/<metric>-<MMDD-HHMMSS>.png``, a new file per comparison) draws every run's curve of
the metric against the epoch, or with ``--x minutes`` against the minutes of run time
(``runs/compare/<metric>_minutes-<MMDD-HHMMSS>.png``).

:mod:`~vit.compare.runs` reads and selects the runs, :mod:`~vit.compare.report` turns them into a table and a plot,
:mod:`~vit.compare.command` is ``vit compare``. Names are imported on first use (PEP 562): ``vit compare --help``
loads neither W&B nor matplotlib.
"""

from vit.lazy import attach

_NAMES = {
    "vit.compare.report": (
        "attention", "best", "default_plot", "differing_keys", "last", "plot", "series", "table", "throughput",
    ),
    "vit.compare.runs": (
        "X_AXES", "Run", "find_run_files", "merge_resumed", "read_offline_runs", "read_online_runs", "select",
    ),
    "vit.compare.command": ("build_parser", "main"),
    "vit.errors": ("InputError",),
}  # fmt: skip
_LAZY = {name: module for module, names in _NAMES.items() for name in names}
__getattr__, __dir__ = attach(__name__, _LAZY)
__all__ = sorted(_LAZY)
