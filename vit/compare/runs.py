"""W&B runs read back for comparison: offline run files (``wandb leet inspect``) or an online project (``wandb.Api``).

A comparison is about training runs: by default only fit runs that finished are kept; validate, test and predict
runs (W&B ``job_type``) and crashed or unfinished runs are dropped unless asked for. The parts of a resumed run are
one run: offline, a resumed run writes a new ``offline-run-*`` folder with the same run id, and ``vit fit --ckpt_path
last`` keeps writing into the run's own folder ``runs/<config>/<run name>/wandb/``; parts that share either are merged.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vit.errors import InputError
from vit.text import plural

X_AXES = {"epoch": "epoch", "minutes": "minutes of run time (W&B _runtime)"}
"""What a curve can be drawn against, and the axis label."""


@dataclass
class Run:
    """One run as read back: flat dotted config, final summary, and the history rows that hold a metric.

    ``kind`` is the W&B job type (``fit``, ``validate``, ...); ``state`` is ``finished``, ``failed``, ``crashed`` or
    ``running``; ``parts`` counts the W&B runs (a resumed run has several) merged into this one.
    """

    name: str
    source: str
    group: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    run_id: str = ""
    kind: str = ""
    state: str = "finished"
    tags: list[str] = field(default_factory=list)
    start: str = ""
    parts: int = 1

    @property
    def folder(self) -> Path | None:
        """The run folder that holds this run's ``wandb/`` (``runs/<config>/<run name>/``), when it is one."""
        path = Path(self.source)
        if path.parent.name != "wandb":
            return None
        folder = path.parent.parent
        return folder if (folder / "config.yaml").is_file() or (folder / "checkpoints").is_dir() else None

    def is_fit(self) -> bool:
        """A fit run: W&B job type ``fit``, or, without a job type, a run that logged training metrics."""
        if self.kind:
            return self.kind == "fit"
        return any(key.startswith("train/") for row in self.history for key in row)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"lr": 1}}`` -> ``{"model.lr": 1}``; W&B's ``{"value": x}`` wrappers are unwrapped."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and set(value) == {"value"}:
            value = value["value"]
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def number(value: Any) -> float | None:
    """``value`` as a finite float, else ``None`` (booleans, strings, NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


# ------------------------------------------------------------------------------------------------ offline runs
def find_run_files(paths: Iterable[str | Path]) -> list[Path]:
    """The ``run-*.wandb`` files of the given run folders, ``.wandb`` files, or folders holding runs (recursively).

    Raises:
        InputError: For a path that does not exist, or that holds no run.
    """
    files: dict[Path, None] = {}
    for item in paths:
        path = Path(item)
        if not path.exists():
            raise InputError(f"{path} does not exist; pass W&B run folders (wandb/offline-run-*) or a folder with runs")
        if path.is_file():
            if path.suffix != ".wandb":
                raise InputError(
                    f"{path} is not a W&B run: expected a run-*.wandb file or a wandb/offline-run-* folder"
                )
            found = [path]
        else:
            found = sorted(p for p in path.rglob("run-*.wandb") if p.is_file())
            if not found:
                raise InputError(
                    f"{path} is not a W&B run and holds none: expected wandb/offline-run-*/run-*.wandb under it"
                )
        for file in found:
            files.setdefault(file.resolve(), None)  # wandb/latest-run is a link to one of the others
    return list(files)


def _inspect(file: Path, *flags: str) -> str:
    env = {**os.environ, "WANDB_SILENT": "true"}
    command = [sys.executable, "-m", "wandb", "leet", "inspect", *flags, str(file)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        if any("No such command" in line for line in detail):
            raise InputError("reading offline runs needs `wandb leet inspect` (wandb >= 0.31): pip install -U wandb")
        raise InputError(f"cannot read W&B run {file}: {detail[-1] if detail else f'exit status {result.returncode}'}")
    return result.stdout


def read_offline_run(file: Path) -> Run:
    """Read an offline run back with ``wandb leet inspect`` (state as JSON, then the records for the history)."""
    with ThreadPoolExecutor(2) as pool:
        state_job = pool.submit(_inspect, file, "--summary", "--json")
        records_job = pool.submit(_inspect, file, "--json")
        state_text, records_text = state_job.result(), records_job.result()
    try:
        state = json.loads(state_text)
        records = [json.loads(line) for line in records_text.splitlines() if line.strip()]
    except json.JSONDecodeError as err:
        raise InputError(f"cannot read W&B run {file}: wandb leet printed no JSON ({err})") from None
    group, kind, history = "", "", []
    for record in records:
        if record.get("type") == "run":
            group = record["run"].get("run_group", "")
            kind = record["run"].get("job_type", "")
        elif record.get("type") == "history":
            history.append(record["history"].get("item", {}))
    status = state.get("state") or "running"
    if status == "finished" and (state.get("exit_code") or 0) != 0:
        status = "failed"
    status = recorded_state(status, state.get("summary") or {})
    return Run(
        name=state.get("name") or state.get("run_id") or file.parent.name,
        source=str(file.parent),
        group=group,
        config=flatten(state.get("config") or {}),
        summary=state.get("summary") or {},
        history=history,
        run_id=state.get("run_id") or "",
        kind=kind,
        state=status,
        tags=list(state.get("tags") or []),
        start=state.get("start_time") or "",
    )


def recorded_state(state: str, summary: Mapping[str, Any]) -> str:
    """A run's state from W&B's (``finished``, ``failed``, ``crashed``, ``running``) and what ``vit fit`` recorded in
    its summary (:data:`vit.loggers.STATUS_KEY`): a fit stopped by Ctrl-C or SIGTERM ends its process normally, so
    W&B says ``finished`` of a run that left a partial ``last.ckpt``; ``vit fit`` says ``interrupted``."""
    from vit.loggers import STATUS_KEY

    recorded = summary.get(STATUS_KEY)
    if recorded in ("interrupted", "failed") and state in ("finished", "crashed", "failed"):
        return str(recorded)
    if recorded == "running" and state == "finished":  # ended without saying how: killed before its end
        return "interrupted"
    return state


def read_offline_runs(paths: Iterable[str | Path]) -> list[Run]:
    """Every offline run under ``paths``, the parts of a resumed run merged into one (see :func:`merge_resumed`)."""
    files = find_run_files(paths)
    with ThreadPoolExecutor(min(4, len(files))) as pool:
        return merge_resumed(list(pool.map(read_offline_run, files)))


def merge_resumed(parts: list[Run]) -> list[Run]:
    """Merge the W&B runs that are parts of one resumed run: same kind and the same run id or the same run folder.

    Parts are joined in start order: histories one after the other, config and summary of later parts over earlier
    ones, the name and state of the last part. The result keeps the order of each run's first part.
    """
    parent = list(range(len(parts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[str, str, str], int] = {}
    for i, run in enumerate(parts):
        keys = [("id", run.kind, run.run_id)] if run.run_id else []
        if run.folder is not None:
            keys.append(("folder", run.kind, str(run.folder)))
        for key in keys:
            j = first.setdefault(key, i)
            parent[root(i)] = root(j)
    groups: dict[int, list[Run]] = {}
    for i, run in enumerate(parts):
        groups.setdefault(root(i), []).append(run)
    merged = []
    for members in groups.values():
        members.sort(key=lambda run: run.start)
        last = members[-1]
        config: dict[str, Any] = {}
        summary: dict[str, Any] = {}
        for run in members:
            config.update(run.config)
            summary.update(run.summary)
        merged.append(
            Run(
                name=last.name,
                source=last.source if len(members) == 1 else str(last.folder or Path(last.source).parent),
                group=last.group,
                config=config,
                summary=summary,
                history=_continued_history(members),
                run_id=last.run_id,
                kind=last.kind,
                state=last.state,
                tags=sorted({tag for run in members for tag in run.tags}),
                start=members[0].start,
                parts=len(members),
            )
        )
    return merged


def _continued_history(members: list[Run]) -> list[dict[str, Any]]:
    """The parts' histories one after the other, each part's ``_runtime`` moved on by the run time of the parts
    before it (every W&B run's clock starts at 0): run time without the pauses between the parts."""
    rows: list[dict[str, Any]] = []
    offset = 0.0
    for run in members:
        end = 0.0
        for row in run.history:
            runtime = number(row.get("_runtime"))
            if runtime is not None:
                end = max(end, runtime)
                row = {**row, "_runtime": offset + runtime}
            rows.append(row)
        offset += end
    return rows


# ------------------------------------------------------------------------------------------------- online runs
def read_online_runs(project: str, group: str | None, last: int | None, metric: str) -> list[Run]:
    """Runs of ``ENTITY/PROJECT`` through ``wandb.Api()`` (needs a login and a network)."""
    import wandb

    runs = []
    try:
        api = wandb.Api(timeout=30)
        filters = {"group": group} if group else None
        for run in api.runs(project, filters=filters, order="-created_at", per_page=min(last or 50, 200)):
            history = [
                *run.scan_history(keys=[metric, "epoch", "_runtime"]),
                *run.scan_history(keys=["train/loss_epoch", "epoch"]),
            ]
            config, summary = flatten(dict(run.config)), dict(run.summary_metrics)
            runs.append(
                Run(
                    name=run.name,
                    source=run.url,
                    group=run.group or "",
                    config=config,
                    summary=summary,
                    history=history,
                    run_id=run.id,
                    kind=run.job_type or "",
                    state=recorded_state(run.state, summary),
                    tags=list(run.tags or []),
                )
            )
            if last and len(runs) >= last:
                break
    except Exception as err:  # no login, no network, no such project
        raise InputError(f"cannot read W&B project {project}: {type(err).__name__}: {err}") from None
    if not runs:
        raise InputError(f"no runs in W&B project {project}" + (f" with group {group!r}" if group else ""))
    return runs


def select(runs: list[Run], everything: bool = False) -> tuple[list[Run], str | None]:
    """The runs to compare (finished fit runs, or all with ``everything``) and a note on what was left out."""
    if everything:
        return runs, None
    kept, left = [], Counter()
    for run in runs:
        if not run.is_fit():
            left[f"{run.kind or 'non-fit'}"] += 1
        elif run.state != "finished":
            left[run.state] += 1
        else:
            kept.append(run)
    if not left:
        return kept, None
    what = ", ".join(f"{count} {reason}" for reason, count in sorted(left.items()))
    return kept, f"left out {plural(sum(left.values()), 'run')}: {what}; --all shows them"
