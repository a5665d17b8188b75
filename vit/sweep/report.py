"""What a sweep found: the table of its trials, the best configuration as a config file, and its figures.

- :func:`table`: every trial of every rung (parameters, metric, budget, state or failure reason, run folder);
- :func:`write_best_config`: ``best.yaml``, the sweep's base config with the best trial's values, for ``vit fit
  --config best.yaml`` (the base config's own length: the sweep's budgets only served the search);
- :func:`write_figures`: parameter importance and parallel coordinates (Optuna's matplotlib plots, over rung 0,
  where every configuration ran) and the metric against the trial and against the minutes since the sweep started.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from vit.atomic import write_bytes, write_text
from vit.text import plural

from .budget import format_duration
from .halving import CONFIG_ATTR, Plan, counted, is_baseline, is_retry, load_rung
from .space import config_values
from .storage import REASON_ATTR

STATES = {TrialState.COMPLETE: "done", TrialState.FAIL: "failed", TrialState.RUNNING: "running",
          TrialState.WAITING: "waiting", TrialState.PRUNED: "pruned"}  # fmt: skip


@dataclass
class Row:
    """One trial of the table."""

    rung: int
    trial: FrozenTrial

    @property
    def config(self) -> int:
        return int(self.trial.user_attrs.get(CONFIG_ATTR, self.trial.number))


def rows(storage: Any, plan: Plan) -> list[Row]:
    """Every counted trial of every rung that exists, rung by rung."""
    found = []
    for rung in range(plan.rungs):
        study = load_rung(storage, plan, rung)
        if study is not None:
            found += [Row(rung, t) for t in counted(study.get_trials(deepcopy=False))]
    return found


def best_row(found: Sequence[Row], plan: Plan) -> Row | None:
    """The best completed trial of the highest rung that has one."""
    complete = [r for r in found if r.trial.state == TrialState.COMPLETE]
    if not complete:
        return None
    top = max(r.rung for r in complete)
    pick = max if plan.sweep.maximize else min
    return pick((r for r in complete if r.rung == top), key=lambda r: r.trial.value)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table(found: Sequence[Row], plan: Plan) -> str:
    """The trials as a text table, each rung best first: rung, budget, trial, configuration (``baseline`` marks the
    sweep command's own), the searched values, the metric as the trial's fit ended (``val/acc (last)``: a trial's
    value is its last, not its best), and the run folder or what stopped the trial."""
    names = [p.name for p in plan.sweep.searched]
    short = {n: n.rsplit(".", 1)[-1] for n in names}
    if len(set(short.values())) < len(names):
        short = {n: n for n in names}
    header = ["rung", "budget", "trial", "config", *short.values(), metric_label(plan), "run folder / state"]
    body = []
    order = sorted(found, key=lambda r: (r.rung, r.trial.state != TrialState.COMPLETE, _rank(r, plan)))
    for r in order:
        values = config_values(plan.sweep, r.trial.params)
        budget = r.trial.user_attrs.get("budget_s") or plan.budget(r.rung)
        value = f"{r.trial.value:.4f}" if r.trial.state == TrialState.COMPLETE else "-"
        note = _state(r.trial)
        if r.trial.state == TrialState.COMPLETE:
            note = r.trial.user_attrs.get("run_dir", "") + note.removeprefix("done")
        config = f"{r.config} baseline" if is_baseline(r.trial) else str(r.config)
        body.append([str(r.rung), format_duration(budget) if budget else "config", str(r.trial.number), config,
                     *(_cell(values.get(n, "")) for n in names), value, note])  # fmt: skip
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1]
             for row in [header, *body]]  # fmt: skip
    return "\n".join(line.rstrip() for line in lines)


def _rank(row: Row, plan: Plan) -> float:
    value = row.trial.value if row.trial.state == TrialState.COMPLETE else 0.0
    return -value if plan.sweep.maximize else value


def _state(trial: FrozenTrial) -> str:
    state = STATES.get(trial.state, trial.state.name.lower())
    reason = trial.user_attrs.get(REASON_ATTR) if trial.state == TrialState.FAIL else None  # a retry inherits one
    if trial.state == TrialState.FAIL and not reason:
        reason = "its worker was lost (killed, or its heartbeat stopped)"
    retried = f" (retry of trial {trial.system_attrs['failed_trial']})" if is_retry(trial) else ""
    return f"{state}{retried}" + (f": {reason}" if reason else "")


# ------------------------------------------------------------------------------------------------ best.yaml
def fit_config(fit_args: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """The config that ``vit fit`` would read from ``fit_args``: every ``--config`` file merged in order, then each
    ``--key value`` on top; and the config files read."""
    import yaml

    from vit.cli import resolve_config_args

    args = resolve_config_args(list(fit_args))
    config: dict[str, Any] = {}
    files = []
    i = 0
    while i < len(args):
        key, sep, text = args[i].partition("=")
        if not sep and i + 1 < len(args):
            text, i = args[i + 1], i + 1
        i += 1
        if key == "--config":
            files.append(text)
            _merge(config, yaml.safe_load(Path(text).read_text(encoding="utf-8")) or {})
        elif key.startswith("--") and key != "--runs_dir":
            set_key(config, key[2:], yaml.safe_load(text))
    return config, files


def set_key(config: dict[str, Any], dotted: str, value: Any) -> None:
    """``config["a"]["b"] = value`` for ``a.b``, creating the mappings on the way."""
    *parents, last = dotted.split(".")
    for part in parents:
        if not isinstance(config.get(part), dict):
            config[part] = {}
        config = config[part]
    config[last] = value


def _merge(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def write_best_config(path: Path, plan: Plan, best: Row) -> Path:
    """``best.yaml``: the sweep's base config with the best trial's values, opening with where it came from."""
    import yaml

    config, files = fit_config(plan.sweep.fit_args)  # not this machine's own arguments (a held-out data folder)
    values = config_values(plan.sweep, best.trial.params)
    for key, value in values.items():
        set_key(config, key, value)
    budget = plan.budget(best.rung)
    length = f"in {format_duration(budget)} (model.schedule time)" if budget else "as configured"
    lines = [
        f"# The best configuration of sweep {plan.sweep.name} ({plan.sweep.source}):",
        f"# trial {best.trial.number} of rung {best.rung}, trained {length}: "
        f"{plan.sweep.metric} {best.trial.value:.4f},",
        f"# run folder {best.trial.user_attrs.get('run_dir', '?')}.",
        f"# Base config: {', '.join(files) or 'none'}; its own length (trainer.max_time / max_epochs) is kept, and the",
        "# arguments given to every trial after `--` (a data folder) are not: give yours.",
        "#",
        "#   vit fit --config " + str(path),
        "#",
        "# The sweep's values:",
        *(
            f"#   {key}: {yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
            for key, value in values.items()
        ),  # fmt: skip
    ]
    return write_text(path, "\n".join(lines) + "\n" + yaml.safe_dump(config, sort_keys=False, width=120))


# ------------------------------------------------------------------------------------------------ figures
def write_figures(storage: Any, plan: Plan, found: Sequence[Row], folder: Path) -> list[Path]:
    """The sweep's PNGs in ``folder``: ``importance.png`` and ``parallel.png`` (rung 0, with at least two completed
    trials), ``progress.png`` (the metric against the trial and against the minutes). Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as optuna_plots

    written = []
    study = load_rung(storage, plan, 0)
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE] if study else []
    if len(complete) >= 2 and plan.sweep.searched:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, plot in (("importance", optuna_plots.plot_param_importances),
                               ("parallel", optuna_plots.plot_parallel_coordinate)):  # fmt: skip
                try:
                    axes = plot(study, target_name=plan.sweep.metric)
                except (ValueError, RuntimeError):  # e.g. every trial drew the same values: no importance
                    continue
                figure = axes.figure if hasattr(axes, "figure") else axes[0].figure
                figure.set_size_inches(max(9.0, 1.5 * (len(plan.sweep.searched) + 1)), 5)
                if name == "parallel":
                    _name_axes(axes, plan)
                for collection in getattr(axes, "collections", []):  # Optuna's white-to-blue lines vanish on grey
                    if collection.get_array() is not None:
                        collection.set_cmap("viridis")
                for loc in ("left", "center"):  # Optuna titles its plots on the left
                    title = axes.get_title(loc=loc) if hasattr(axes, "get_title") else ""
                    if title:
                        axes.set_title(f"{title} (rung 0: {plural(len(complete), 'trial')})", loc=loc)
                written.append(_save(figure, folder / f"{name}.png"))
                plt.close(figure)
    if any(r.trial.state == TrialState.COMPLETE for r in found):
        written.append(_save(progress_figure(found, plan), folder / "progress.png"))
    return written


def _name_axes(axes, plan: Plan) -> None:
    """The parallel coordinates' axes named by the last part of each key (Optuna cuts names at 20 characters, which
    leaves ``model.model_overr...`` four times); its axes are the metric, then the parameters in sorted order."""
    labels = [label.get_text() for label in axes.get_xticklabels()]
    names = sorted(p.name for p in plan.sweep.searched)
    short = [n.rsplit(".", 1)[-1] for n in names]
    if len(labels) == len(names) + 1 and len(set(short)) == len(short):
        axes.set_xticks(axes.get_xticks(), [labels[0], *short])


def progress_figure(found: Sequence[Row], plan: Plan):
    """The metric of every completed trial against its start order and against the minutes since the sweep started
    (at its end), one colour per rung."""
    import matplotlib.pyplot as plt

    figure, (by_trial, by_time) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    starts = [r.trial.datetime_start for r in found if r.trial.datetime_start]
    origin = min(starts)
    order = sorted((r for r in found if r.trial.datetime_start), key=lambda r: r.trial.datetime_start)
    index = {id(r): i for i, r in enumerate(order)}
    for rung in sorted({r.rung for r in found}):
        done = [r for r in order if r.rung == rung and r.trial.state == TrialState.COMPLETE]
        budget = plan.budget(rung)
        label = f"rung {rung}" + (f" ({format_duration(budget)})" if budget else "")
        by_trial.scatter([index[id(r)] for r in done], [r.trial.value for r in done], label=label, s=28)
        minutes = [(r.trial.datetime_complete - origin).total_seconds() / 60 for r in done]
        by_time.scatter(minutes, [r.trial.value for r in done], label=label, s=28)
    from matplotlib.ticker import MaxNLocator

    by_trial.xaxis.set_major_locator(MaxNLocator(integer=True))  # trial 1, 2, 3: never 1.2
    by_trial.set_xlabel("trial (in the order started)")
    by_time.set_xlabel("minutes since the sweep started (trial's end)")
    by_trial.set_ylabel(metric_label(plan))
    for axes in (by_trial, by_time):
        axes.grid(alpha=0.3)
    by_trial.legend(loc="best")
    figure.suptitle(f"sweep {plan.sweep.name}: {metric_label(plan)} ({plan.sweep.goal})")
    figure.tight_layout()
    return figure


def _save(figure, path: Path) -> Path:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    return write_bytes(path, buffer.getvalue())


def metric_label(plan: Plan) -> str:
    """The sweep's metric as every listing of trials names it: ``val/acc (last)``, the value its fit ended with (a
    trial's value is its last, not its best, which ``vit compare`` shows)."""
    return f"{plan.sweep.metric} (last)"


def summary(found: Sequence[Row], plan: Plan) -> str:
    """One line: configurations, trials by state, the best trial."""
    states = [r.trial.state for r in found]
    best = best_row(found, plan)
    started = len({r.config for r in found})
    text = (f"{started} of {plural(max(plan.count, started), 'configuration')}, {plural(len(found), 'trial')}: "
            f"{states.count(TrialState.COMPLETE)} done, {states.count(TrialState.FAIL)} failed, "
            f"{states.count(TrialState.RUNNING)} running, {states.count(TrialState.WAITING)} waiting")  # fmt: skip
    if best is not None:
        value = f"{plan.sweep.metric} (last) {best.trial.value:.4f}"  # a trial's value is its fit's last
        text += f"; best {value} (rung {best.rung}, trial {best.trial.number})"
    base = [r for r in found if is_baseline(r.trial) and r.trial.state == TrialState.COMPLETE]
    if base:
        top = max(base, key=lambda r: r.rung)
        text += f"; the baseline {top.trial.value:.4f} (rung {top.rung}, trial {top.trial.number})"
    return text


def folder_report(folder: str | Path) -> str:
    """The summary and table of the sweep whose folder is ``folder`` (it holds the ``plan.json`` that ``vit sweep``
    writes), with its figures: for ``vit compare SWEEP_FOLDER``."""
    import json

    plan_file = Path(folder, "plan.json")
    data = json.loads(plan_file.read_text(encoding="utf-8"))
    plan = Plan.from_fingerprint(data["plan"], data["fit_args"], data["source"])
    if not Path(folder, "study.journal").is_file():
        where = f"`vit sweep {plan.sweep.source} --storage URL --report` shows it"
        return f"sweep {plan.sweep.name}: its study is in a database; {where}"
    from .storage import open_storage

    found = rows(open_storage(None, Path(folder), data["max_retry"]), plan)
    figures = sorted(Path(folder).glob("*.png"))
    lines = [f"sweep {plan.sweep.name}: {summary(found, plan)}", "", table(found, plan)]
    if figures:
        lines += ["", "figures: " + ", ".join(str(p) for p in figures)]
    return "\n".join(lines)
