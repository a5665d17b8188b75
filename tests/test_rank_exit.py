"""Rank 0 of a preempted DDP run outlives Lightning's watch over its other ranks.

Lightning's subprocess launcher starts ranks 1.. from rank 0 and watches them from a thread that SIGKILLs rank 0 once
one of them ends with a non-zero status. A preempted rank ends with 143, so rank 0 died with -9 whenever the others
exited first. These tests drive Lightning's own observer, against a stand-in for rank 0 so that nothing kills pytest.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

from vit.callbacks.resume import ranks_off_watch, wait_for_ranks


def python(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def watched(rank_code: str) -> tuple[SimpleNamespace, subprocess.Popen, subprocess.Popen, _ChildProcessObserver]:
    """A trainer whose launcher started one rank running ``rank_code``, rank 0's stand-in, and the observer that
    Lightning would start over them, looking every 50 ms."""
    launcher = _SubprocessScriptLauncher(LightningEnvironment(), num_processes=2, num_nodes=1)
    rank = python(rank_code)
    launcher.procs.append(rank)
    rank_zero = python("import time; time.sleep(60)")
    observer = _ChildProcessObserver(main_pid=rank_zero.pid, child_processes=launcher.procs, sleep_period=0.05)
    return SimpleNamespace(strategy=SimpleNamespace(launcher=launcher)), rank, rank_zero, observer


def test_lightning_kills_rank_zero_when_a_rank_exits_143_first():
    # The behaviour the fix works around: if this starts to pass differently, Lightning changed its observer.
    _, rank, rank_zero, observer = watched("raise SystemExit(143)")
    rank.wait(30)
    observer.start()
    observer.join(30)
    assert rank_zero.wait(30) == -9


def test_a_preempted_rank_zero_takes_its_ranks_off_the_watch_and_waits_for_them():
    trainer, rank, rank_zero, observer = watched("import time; time.sleep(0.5); raise SystemExit(143)")
    observer.start()
    ranks = ranks_off_watch(trainer)
    assert ranks == [rank] and trainer.strategy.launcher.procs == []
    wait_for_ranks(ranks, timeout=30)
    assert rank.returncode == 143
    observer.join(30)
    assert not observer.is_alive() and rank_zero.poll() is None  # the watch ended without a kill
    rank_zero.kill()
    rank_zero.wait()


def test_a_rank_that_does_not_exit_is_killed_after_the_timeout():
    rank = python("import time; time.sleep(60)")
    wait_for_ranks([rank], timeout=0.2)
    assert rank.returncode == -9


def test_without_a_subprocess_launcher_there_is_nothing_to_watch():
    assert ranks_off_watch(SimpleNamespace(strategy=SimpleNamespace(launcher=None))) == []
