"""One trial of a sweep: an ordinary ``vit fit`` run in its own process, and the metric it ended with.

The worker starts ``python -m vit.sweep.trial RESULT.json METRIC fit ARGS...``: this module runs ``vit fit`` on ``ARGS``
(its own run folder under ``<sweep>/trials/``, its config saved, its W&B run in the sweep's group, resumable with
``--ckpt_path``) and writes the final values of the logged metrics, the run folder and the exit status to
``RESULT.json``. Its output goes to a log file of the sweep folder; a trial that fails on its own (a non-finite loss,
a config ``vit fit`` refuses) leaves its one-line ``error:`` as the reason. The process gets SIGTERM when its worker
dies (Linux ``PR_SET_PDEATHSIG``): it writes its checkpoint and stops, as on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit.atomic import write_text

from .budget import max_time


@dataclass
class Outcome:
    """What a trial process ended with: ``value`` of the metric, or ``reason`` it has none."""

    value: float | None
    reason: str
    run_dir: str
    exit_status: int


def fit_arguments(
    base: Sequence[str], values: Mapping[str, Any], runs_dir: Path, budget_s: float | None, group: str | None
) -> list[str]:
    """The ``vit fit`` arguments of a trial, in order: the sweep's command (``--config FILE``...), its run folder
    root, the time budget, its W&B group, then the trial's values as W&B passes them (``--key=value``).

    Args:
        base: The sweep command's arguments and those given after ``--`` on the ``vit sweep`` command line.
        values: Config values by dotted key.
        runs_dir: ``--runs_dir``: the trial's run folder is ``<runs_dir>/<config>/<run name>/``.
        budget_s: ``trainer.max_time`` with ``model.schedule: time`` and no epoch limit; ``None``: as configured.
        group: The W&B group (the logger's ``group``), or ``None`` when the config logs to no single W&B logger.
    """
    import yaml

    args = [*base, f"--runs_dir={runs_dir}"]
    if budget_s is not None:
        args += ["--model.schedule=time", f"--trainer.max_time={max_time(budget_s)}", "--trainer.max_epochs=-1"]
    if group:
        args.append(f"--trainer.logger.init_args.group={group}")
    for key, value in values.items():
        text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True, width=10**6)
        args.append(f"--{key}={text.removesuffix(chr(10)).removesuffix('...').strip()}")
    return args


def run_trial(args: Sequence[str], metric: str, result: Path, log: Path) -> Outcome:
    """Run ``vit fit`` on ``args`` in a child process (output to ``log``) and read the final value of ``metric``.

    Raises:
        KeyboardInterrupt: When this process is interrupted; the child gets the same signal and is waited for.
    """
    result.unlink(missing_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "vit.sweep.trial", str(result), metric, "fit", *args]
    with open(log, "ab") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        try:
            status = child.wait()
        except BaseException:
            hold_signals()  # a second interrupt (vit sweep passes one on after 5 s) must not cut this wait short
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)  # its checkpoint is written, then it stops (vit's SIGTERM handler)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=60)
            child.kill()
            raise
    return read_outcome(result, log, status)


def hold_signals() -> None:
    """Ignore SIGINT and SIGTERM from now on in this process (a worker that is stopping; its waits are bounded)."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


def read_outcome(result: Path, log: Path, status: int) -> Outcome:
    """The :class:`Outcome` of a finished trial process: its result file, else the last ``error:`` line of its log."""
    try:
        data = json.loads(result.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    run_dir = str(data.get("run_dir", ""))
    metric, value = data.get("metric"), data.get("value")
    if status == 0 and isinstance(value, (int, float)) and math.isfinite(value):
        return Outcome(float(value), "", run_dir, status)
    if status == 0:
        logged = ", ".join(sorted(data.get("logged", []))) or "none"
        reason = f"{metric} is {value}" if value is not None else f"{metric} was not logged (logged: {logged})"
        return Outcome(None, reason, run_dir, status)
    return Outcome(None, _last_error(log) or f"vit fit exited with status {status} (log: {log})", run_dir, status)


def _last_error(log: Path) -> str:
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    if errors:
        return errors[-1]
    tail = [line.strip() for line in lines if line.strip()]
    return tail[-1][:300] if tail and "Error" in tail[-1] else ""


def _die_with_parent() -> None:
    """In the child, before it runs: SIGTERM when the worker that started it dies (Linux), so no trial outlives its
    worker; elsewhere nothing."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def main(argv: Sequence[str]) -> int:
    """``python -m vit.sweep.trial RESULT METRIC fit ARGS...``: run ``vit fit``, then write ``RESULT``: the final
    value of ``METRIC``, validated again on the final weights when the fit's last validation came before its end."""
    result, metric, *fit = argv
    from vit.cli import cli_main

    cli = cli_main(fit)
    trainer = cli.trainer
    if stale(trainer, cli.model, metric):  # every rank decides alike: validation is a collective under DDP
        trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
    if not trainer.is_global_zero:
        return 0
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
    value = logged.get(metric)
    data = {"metric": metric, "value": value, "logged": sorted(logged), "run_dir": str(cli.run_dir)}
    write_text(result, json.dumps(data, allow_nan=True) + "\n")
    return 0


def stale(trainer: Any, module: Any, metric: str) -> bool:
    """Whether ``metric`` must be measured again after the fit: a validation metric that was never logged, or one
    whose last validation came before the end, because Lightning's ``max_time`` stopped the run before the step where
    the time plan (``model.schedule: time``) validates and stops it (a budget too short to time a step)."""
    if not metric.startswith("val"):
        return False
    plan = getattr(module, "time_plan", None)
    cut = plan is not None and trainer.global_step < getattr(plan, "total_steps", 0)
    return metric not in trainer.callback_metrics or cut


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
