"""Where a sweep's Optuna study lives, and how a trial whose worker died is found, failed and retried.

- Default: an Optuna ``JournalStorage`` file in the sweep folder (``study.journal``): any number of worker processes
  on one machine append to it under a file lock. Optuna's FAQ advises against SQLite for parallel writers.
- ``--storage postgresql://user@host/db`` (or any SQLAlchemy URL): Optuna's ``RDBStorage``, so that workers on many
  machines join one study. Each running trial beats a heartbeat every ``heartbeat_interval`` seconds; a trial silent
  for ``grace_period`` seconds is failed by the next worker that asks for a trial and retried
  (``RetryHeartbeatStaleTrialCallback``).
- The journal has no heartbeat: every running trial records its worker (``host:pid``), and a worker on the same host
  that finds the process gone (killed, the machine restarted) fails the trial and retries it, as the heartbeat would,
  at its next start or its next look at the study.
"""

from __future__ import annotations

import os
import socket
import warnings
from datetime import datetime, timedelta
from pathlib import Path

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from vit.atomic import process_alive
from vit.errors import UsageError

JOURNAL_FILE = "study.journal"
WORKER_ATTR = "worker"
"""Trial user attribute: the ``host:pid`` of the worker process running it."""
REASON_ATTR = "reason"
"""Trial user attribute: why a trial failed, one line."""
UNCLAIMED_AFTER = timedelta(minutes=5)
"""A running trial that never named its worker (killed in the instant after it was created) is lost after this."""


def worker_id() -> str:
    """``host:pid`` of this process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def open_storage(
    url: str | None, folder: Path, max_retry: int, heartbeat_interval: int = 30, grace_period: int = 120
) -> BaseStorage:
    """The study's storage: ``url`` (an SQLAlchemy URL, e.g. ``postgresql://...``) with heartbeats, else the
    journal file in ``folder``.

    Args:
        url: ``--storage``; ``None`` for the journal.
        folder: The sweep folder.
        max_retry: How many times a trial whose worker died is run again.
        heartbeat_interval: Seconds between two heartbeats of a running trial (RDB only).
        grace_period: Seconds of silence after which a running trial counts as lost (RDB only).

    Raises:
        UsageError: For a URL that cannot be opened (with the reason of the database driver).
    """
    if url is None:
        folder.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(folder / JOURNAL_FILE)))
    try:
        with warnings.catch_warnings():  # the retry callback is "experimental" in Optuna since 2.8
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return RDBStorage(
                url,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=max_retry),
                engine_kwargs={"pool_pre_ping": True},
            )
    except Exception as err:  # the driver's own errors (psycopg2.OperationalError, ImportError, ArgumentError...)
        reason = " ".join(str(err).split())[:300]
        raise UsageError(f"--storage {_without_password(url)}: cannot open the database ({reason})") from None


def describe(storage: BaseStorage, folder: Path) -> str:
    """Where the study lives, for the progress lines (never a password)."""
    if isinstance(storage, RDBStorage):
        return _without_password(storage.url)
    return str(folder / JOURNAL_FILE)


def reap_lost_trials(study: optuna.Study, max_retry: int) -> list[int]:
    """Fail the running trials of ``study`` whose worker process on this host is gone, and enqueue each again (up to
    ``max_retry`` times). The heartbeat of an RDB storage does the same through
    :func:`optuna.storages.fail_stale_trials`, called here too.

    Returns:
        The numbers of the trials failed here.
    """
    with warnings.catch_warnings():  # both are "experimental" in Optuna since 2.8 / 2.9
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
        retry = RetryHeartbeatStaleTrialCallback(max_retry=max_retry)
    host = socket.gethostname()
    lost = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = str(trial.user_attrs.get(WORKER_ATTR, ""))
        where, _, pid = worker.rpartition(":")
        if worker:
            gone = where == host and pid.isdigit() and not process_alive(int(pid))
        else:
            started = trial.datetime_start or datetime.now()
            gone = datetime.now() - started > UNCLAIMED_AFTER
        if not gone:
            continue
        try:
            study.tell(trial.number, state=TrialState.FAIL)
        except (RuntimeError, ValueError):  # another worker failed it first
            continue
        lost.append(trial.number)
        retry(study, study.get_trials(deepcopy=False)[trial.number])
    return lost


def _without_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    return f"{scheme}{sep}{credentials.split(':', 1)[0]}:***@{host}"
