"""End the processes Lightning's launcher started when the process that started them fails (see the class)."""

from __future__ import annotations

import contextlib
import subprocess
import time

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback


class StopStartedProcesses(Callback):
    """On an exception in the process that started the others (DDP's rank 0 of a node), end the processes that
    Lightning's launcher started before the command exits.

    Lightning kills them on Ctrl-C only: after any other failure of rank 0 (a download that fails, a missing data
    folder) they outlive the command, and print a traceback after the shell prompt once rank 0's connection closes.
    This runs in ``on_exception``, before Lightning's teardown closes that connection: the others are killed while
    they still wait in a collective, so they print nothing. A :class:`SystemExit` (a SIGTERM/SIGINT checkpoint that
    every rank agreed on) lets them finish first, for up to ``grace`` seconds.

    Args:
        grace: Seconds the others get to exit on their own after a :class:`SystemExit`.
    """

    def __init__(self, grace: float = 60.0) -> None:
        self.grace = grace

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        stop_started_processes(trainer, self.grace if isinstance(exception, SystemExit) else 0.0)


def stop_started_processes(trainer: Trainer, grace: float = 0.0) -> None:
    """Kill the processes ``trainer``'s launcher started (after ``grace`` seconds), wait for them, and forget them.

    Args:
        trainer: A trainer whose strategy may have started processes (``launcher.procs`` of Lightning's
            subprocess launcher; none on the processes it started, or without DDP).
        grace: Seconds to wait for them to exit on their own first.
    """
    procs: list[subprocess.Popen] = getattr(trainer.strategy.launcher, "procs", None) or []
    deadline = time.monotonic() + grace
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        if proc.poll() is None:
            proc.kill()  # SIGKILL: a process blocked in a collective does not answer SIGTERM
    for proc in procs:
        proc.wait()
    # Lightning's observer thread watches this list and kills this process too once a child ends non-zero: a killed
    # child must not take rank 0 down before it has printed its error.
    procs.clear()
