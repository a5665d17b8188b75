"""Run a W&B sweep file with Optuna, on one machine or many: every trial an ordinary ``vit fit`` run, judged by time.

    vit sweep configs/sweeps/linear_vs_global.yaml                           # each trial as its config says
    vit sweep FILE --budget 5m -- --data.data_dir DATA                        # every trial 5 minutes, annealed
    vit sweep FILE --budget 5m,15m,45m --workers 2                            # successive halving, 2 processes
    vit sweep FILE --budget 5m --baseline                                     # the config's own values: trial 0
    vit sweep FILE --budget 5m --storage postgresql://USER@HOST/DB            # on each machine: one study
    vit sweep FILE --report                                                   # the table, best.yaml, figures

The file is the one ``wandb sweep`` takes (method grid|random|bayes, metric, parameters, run_cap, command with its
--config, early_terminate: hyperband); what it says that vit sweep cannot do is an error naming the key. Arguments
after ``--`` go to every trial's ``vit fit`` (a data folder). ``--budget`` gives every trial the same
trainer.max_time with model.schedule time, so each run anneals as its time ends; several budgets are the rungs of
successive halving: rung k runs the best 1/eta of rung k-1 again, from scratch, for the longer time
(early_terminate: hyperband's eta and s, or min_iter and max_iter, make one --budget into rungs budget * eta**k).
``--baseline`` enqueues the configuration the command trains without the sweep (each parameter at its --config's
value) as the first trial of rung 0, one of its configurations: it rises through the rungs only if it ranks there,
and the table marks it, so the search is read against the config it started from.

The sweep folder (runs/sweeps/<name>/, or --out) holds the study (an Optuna journal file unless --storage), the
trials' run folders (trials/), their logs (logs/), best.yaml and the figures. Starting the same command again
resumes the study and says so; a trial whose worker died (Ctrl-C, SIGKILL, a lost machine) is failed and run
again, up to --max_retry times; a trial that fails on its own (a non-finite loss, a config vit fit refuses) keeps
its one-line reason and the sweep goes on. Trials log to W&B in the group named after the sweep.

:mod:`~vit.sweep.spec` reads the sweep file, :mod:`~vit.sweep.space` maps it onto Optuna, :mod:`~vit.sweep.budget`
reads the budgets, :mod:`~vit.sweep.halving` runs the rungs, :mod:`~vit.sweep.storage` holds the study,
:mod:`~vit.sweep.trial` runs one trial, :mod:`~vit.sweep.worker` is a worker process, :mod:`~vit.sweep.driver` the
``vit sweep`` process, :mod:`~vit.sweep.report` the table, best.yaml and figures, :mod:`~vit.sweep.command` the
command line. Names are imported on first use: ``vit sweep --help`` loads neither Optuna nor torch.
"""

from vit.lazy import attach

_NAMES = {
    "vit.sweep.spec": ("Parameter", "Sweep", "SweepFileError", "parse_sweep", "read_sweep"),
    "vit.sweep.budget": ("parse_duration", "rung_budgets"),
    "vit.sweep.command": ("build_parser", "main"),
}
_LAZY = {name: module for module, names in _NAMES.items() for name in names}
__getattr__, __dir__ = attach(__name__, _LAZY)
__all__ = sorted(_LAZY)
