"""The sweep in W&B: the trials are runs of one group named after the sweep, and one more run of job type ``sweep``
in that group holds the table of trials and the sweep's figures. W&B's own parallel-coordinates and
parameter-importance panels then work on the group as on a W&B sweep. Offline without credentials or server, as the
trials are (:func:`vit.loggers.offline_without_server`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from .halving import Plan
from .report import Row, best_row, fit_config, metric_label
from .space import config_values

WANDB_LOGGERS = ("lightning.pytorch.loggers.WandbLogger", "lightning.pytorch.loggers.wandb.WandbLogger")


def wandb_project(plan: Plan) -> str | None:
    """The W&B project the trials log to: that of the base config's one ``WandbLogger``, unless a sweep parameter
    replaces the logger; ``None`` when the trials log to no single W&B logger (then they get no group either)."""
    if any(p.name.startswith("trainer.logger") for p in plan.sweep.parameters):
        return None
    logger = fit_config(plan.fit_args)[0].get("trainer", {}).get("logger")
    if not isinstance(logger, dict) or logger.get("class_path") not in WANDB_LOGGERS:
        return None
    return str((logger.get("init_args") or {}).get("project") or "vit")


def log_sweep(plan: Plan, found: Sequence[Row], figures: Sequence[Path], folder: Path, project: str) -> Path | None:
    """Log the table of trials and the figures as the group's ``sweep`` run; returns its run folder (``None`` with
    ``WANDB_MODE=disabled``)."""
    import wandb

    from vit.loggers import wandb_credentials_configured, wandb_reachable

    mode = os.environ.get("WANDB_MODE") or "online"
    if mode == "disabled":
        return None
    if mode == "online" and not (wandb_credentials_configured() and wandb_reachable(timeout=3.0)):
        mode = "offline"
    names = [p.name for p in plan.sweep.searched]
    columns = ["rung", "budget_s", "trial", "config", *names, metric_label(plan), "state", "run_dir"]
    data = []
    for r in found:
        values = config_values(plan.sweep, r.trial.params)
        value = r.trial.value if r.trial.state == TrialState.COMPLETE else None
        data.append([r.rung, plan.budget(r.rung), r.trial.number, r.config, *(_cell(values.get(n)) for n in names),
                     value, r.trial.state.name.lower(), r.trial.user_attrs.get("run_dir", "")])  # fmt: skip
    run = wandb.init(project=project, group=plan.sweep.name, job_type="sweep", name=f"{plan.sweep.name}-sweep",
                     dir=str(folder), mode=mode, config=plan.fingerprint())  # fmt: skip
    try:
        run.log({"sweep/trials": wandb.Table(columns=columns, data=data),
                 **{f"sweep/{path.stem}": wandb.Image(str(path)) for path in figures}})  # fmt: skip
        best = best_row(found, plan)
        if best is not None:
            run.summary[f"best/{plan.sweep.metric}"] = best.trial.value
            run.summary["best/trial"] = best.trial.number
        where = Path(run.dir).parent
    finally:
        run.finish()
    return where


def _cell(value: Any) -> Any:
    """A table cell: numbers, text and booleans as they are, anything else as its text."""
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
