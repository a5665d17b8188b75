"""Resume bit-identically and survive preemption: the callback that owns ``last.ckpt``.

:class:`ResumeCheckpoint` (``--resume.*`` on the command line) writes ``last.ckpt`` at the end of every epoch, every
``every_n_train_steps`` optimizer steps, and on SIGTERM or SIGINT after the current step (then the run exits with
status ``128 + signal``, 143 or 130, printing the resume command). It keeps the global random states (torch, CUDA,
NumPy, ``random``) of every rank in every checkpoint, restores them on resume and shields the training streams from
validation, so a resumed run is bit-identical. Under DDP each rank draws its own numbers (dropout, drop-path and
PatchDropout masks differ between ranks), seeded with ``seed + rank`` as timm's training script does. The data side
(an order and augmentations that are a function of ``(seed, epoch)``, a loader that resumes mid-epoch) is in
:mod:`vit.data.sampler`.
"""

from __future__ import annotations

import atexit
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.fabric.utilities.types import _Stateful
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from timm.utils import random_seed

from ..runs import last_checkpoint_path


class Preempted(SystemExit):
    """Raised after a SIGTERM/SIGINT checkpoint was written: exits with status ``128 + signum`` (143, 130).

    Args:
        signum: The signal received.
        path: Where the checkpoint was written.
    """

    def __init__(self, signum: int, path: Path) -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.path = path


def rng_state() -> dict[str, Any]:
    """The global random states (torch CPU and CUDA, NumPy, ``random``) as tensors and plain Python values, so that
    a checkpoint holding them loads with ``torch.load(weights_only=True)``."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, mt, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": version, "state": list(mt), "gauss": gauss},
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore the states returned by :func:`rng_state` (CUDA states only when the device count matches).

    Args:
        state: The output of :func:`rng_state`.
    """
    torch.set_rng_state(state["torch"].cpu())
    cuda = list(state.get("cuda") or [])
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["kind"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))


class ResumeCheckpoint(Checkpoint):
    """``last.ckpt`` at every epoch end, every ``every_n_train_steps`` steps and on SIGTERM/SIGINT, holding what a
    bit-identical resume needs (the random states; the data position is the loader's, :mod:`vit.data.sampler`).

    The file goes to the folder of the trainer's first :class:`ModelCheckpoint`, so ``--ckpt_path last`` finds it.
    It is written at every epoch end because, since Lightning 2.6, ``ModelCheckpoint(save_last=True)`` with a
    monitor rewrites ``last.ckpt`` only when the monitored metric improves (resuming would go back to the best
    epoch); step and signal checkpoints are written at the end of a training batch, where Lightning resumes
    mid-epoch. As a checkpoint callback it runs after the other callbacks, and after the checkpoint callbacks listed
    before it: list it after the ``ModelCheckpoint`` so its files hold that epoch's best-model bookkeeping. (A Trainer
    given a checkpoint callback adds no default ``ModelCheckpoint``.)

    Args:
        every_n_train_steps: Also write ``last.ckpt`` every this many optimizer steps (0: at epoch ends only). A
            killed run loses at most the steps since.
        save_on_signal: On SIGTERM (cluster preemption) or SIGINT (Ctrl-C), finish the current step, write
            ``last.ckpt`` and exit with status 128 + signal number (143 for SIGTERM, 130 for SIGINT). A second
            Ctrl-C stops at once, without a checkpoint. Under DDP the step is the next one at which the ranks
            agree (``signal_sync_every_n_steps``).
        signal_sync_every_n_steps: With several processes (DDP), the ranks agree on a received signal every this
            many optimizer steps, so that all of them save and stop at the same step. The agreement is an
            all-reduce read on the host, which waits for the device: not every step.
    """

    def __init__(
        self, every_n_train_steps: int = 0, save_on_signal: bool = True, signal_sync_every_n_steps: int = 10
    ) -> None:
        if every_n_train_steps < 0:
            raise ValueError(f"every_n_train_steps must be >= 0 (0: no step checkpoints), got {every_n_train_steps}")
        if signal_sync_every_n_steps < 1:
            raise ValueError(f"signal_sync_every_n_steps must be >= 1, got {signal_sync_every_n_steps}")
        self.every_n_train_steps = every_n_train_steps
        self.save_on_signal = save_on_signal
        self.signal_sync_every_n_steps = signal_sync_every_n_steps
        self._pending: dict[str, Any] | None = None  # random state to apply before the next training batch
        self._snapshot: dict[str, Any] | None = None  # random state at the end of the last training batch
        self._signal: int | None = None
        self._handlers: dict[int, Any] = {}
        self._last_step = -1
        self._loader_states: list[dict[str, Any]] = []
        self._rank, self._world_size = 0, 1

    # ------------------------------------------------------------------------------------------- random state
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._rank, self._world_size = trainer.global_rank, trainer.world_size  # before a checkpoint is restored

    def state_dict(self) -> dict[str, Any]:
        """The random state the next training batch will start from, of every rank (``rng`` is rank 0's).

        Under DDP this gathers the ranks' states, so it must run on every rank, as ``Trainer.save_checkpoint``
        does. A save on one rank alone (SLURM's SIGUSR1 requeue handler, a save on an exception raised by one rank)
        waits for the others here, as Lightning's own save barrier already did."""
        state = self._pending if self._pending is not None else rng_state()
        if self._world_size == 1 or not torch.distributed.is_initialized():
            return {"rng": state}
        states: list[Any] = [None] * self._world_size
        torch.distributed.all_gather_object(states, state)
        return {"rng": states[0], "rng_per_rank": states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep this rank's random state from the checkpoint; it is applied right before the first training batch
        (after the sanity check, data loading and anything else that draws random numbers while a run starts). A
        checkpoint from a different number of processes gives every rank rank 0's state."""
        per_rank = state_dict.get("rng_per_rank") or []
        own = len(per_rank) == self._world_size and self._rank < len(per_rank)
        self._pending = per_rank[self._rank] if own else state_dict.get("rng")

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        # Lightning restores the training loader's position only when it builds the loader after the checkpoint is
        # read; ``estimated_stepping_batches`` (the LR schedule's length) builds it earlier, so it is done here
        # (Lightning issue #20550).
        fit_loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
        self._loader_states = list((fit_loop.get("state_dict") or {}).get("combined_loader") or [])

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self._pending is not None:
            set_rng_state(self._pending)
            self._pending = None

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Validation inside fit draws random numbers (the loader's worker seeds, callbacks). A run resumed from a
        # checkpoint may skip or repeat a validation, so training continues from the state before validation.
        if trainer.training or trainer.sanity_checking or self._snapshot is None or self._pending is not None:
            return
        self._pending = self._snapshot

    # ---------------------------------------------------------------------------- step and signal checkpoints
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.global_rank > 0 and self._pending is None:  # a fresh DDP run: every rank its own random stream
            seed = int(os.environ.get("PL_GLOBAL_SEED", torch.initial_seed() % 2**31))  # NumPy takes < 2**32
            random_seed(seed, trainer.global_rank)  # timm's: seed + rank for torch, NumPy and random
        self._signal = None
        self._last_step = trainer.global_step
        if trainer.ckpt_path and trainer.is_global_zero:  # where the run continues, before its first step
            where = f"step {trainer.global_step}, epoch {trainer.current_epoch}"
            say(f"resuming from {trainer.ckpt_path}: {where}")
        if self._loader_states:  # the loader is built but not yet iterated: position it where the checkpoint was
            stateful = [dl for dl in _train_loaders(trainer) if isinstance(dl, _Stateful)]
            if len(stateful) == len(self._loader_states):
                for loader, state in zip(stateful, self._loader_states, strict=True):
                    loader.load_state_dict(state)
            self._loader_states = []
        if self.save_on_signal and threading.current_thread() is threading.main_thread():
            # Installed after Lightning's own SIGTERM handler (set up just before this hook): ours replaces it so
            # that a SIGTERM does not abort a validation half-way, and Lightning restores the originals at teardown.
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._handlers[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._signal is not None and signum == signal.SIGINT:  # second Ctrl-C: stop now, no checkpoint
            self._restore_handlers()
            raise KeyboardInterrupt
        self._signal = signum

    def _restore_handlers(self) -> None:
        for signum, handler in self._handlers.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._handlers = {}

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._restore_handlers()
        if self._signal is not None:
            rank_zero_warn(f"{signal.Signals(self._signal).name} received while the run was finishing: it finished.")

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore_handlers()  # never saves: the state at an exception may be half a step (or non-finite)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._snapshot = rng_state()
        stepped = trainer.global_step != self._last_step  # not in the middle of gradient accumulation
        self._last_step = trainer.global_step
        if not stepped:
            return
        signalled = self._signal is not None
        if trainer.world_size > 1:  # every rank saves together and stops together, at the same step
            signalled = trainer.global_step % self.signal_sync_every_n_steps == 0 and (
                trainer.strategy.reduce_boolean_decision(signalled, all=False)
            )
        if signalled:
            path = self._save_last(trainer)
            signum = self._signal if self._signal is not None else signal.SIGTERM
            self._announce_preemption(trainer, signum, path)
            atexit.register(wait_for_ranks, ranks_off_watch(trainer))
            raise Preempted(signum, path)
        every = self.every_n_train_steps
        if every and trainer.global_step % every == 0 and not _skip_saving(trainer):
            self._save_last(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        sync_epoch_metrics(trainer)  # before the save's barrier
        if _skip_saving(trainer):
            return
        callback = _model_checkpoint(trainer)
        path = last_checkpoint_path(trainer)
        if (
            callback is not None
            and callback.last_model_path == str(path)
            and getattr(callback, "_last_global_step_saved", None) == trainer.global_step
        ):
            return  # the ModelCheckpoint has just written this very state to last.ckpt
        self._save_last(trainer)

    def _save_last(self, trainer: Trainer) -> Path:
        path = last_checkpoint_path(trainer)
        callback = _model_checkpoint(trainer)
        if callback is not None and callback.save_last:
            callback.last_model_path = str(path)  # part of the saved state, as when the callback saves it
        trainer.save_checkpoint(path, weights_only=False)  # the full training state (explicit: no log line)
        return path

    @staticmethod
    def _announce_preemption(trainer: Trainer, signum: int, path: Path) -> None:
        if trainer.is_global_zero:
            name = signal.Signals(signum).name
            sys.stderr.write(
                f"\n{name} received: stopped after step {trainer.global_step} (epoch {trainer.current_epoch}) and "
                f"saved a checkpoint to {path}\nResume: run the same command with --ckpt_path {path} "
                f"(or --ckpt_path last). Exit status {128 + signum}.\n"
            )
            sys.stderr.flush()


def ranks_off_watch(trainer: Trainer) -> list[subprocess.Popen]:
    """The ranks that Lightning's subprocess launcher started from this process, taken off its watch.

    That launcher's observer thread SIGKILLs this process (rank 0) as soon as it sees another rank ended with a
    non-zero status, as a preempted rank does (143): rank 0 then died with -9 before it could exit 143 itself,
    whenever the others were faster. Its list is the launcher's own, so emptying it ends the watch at its next look.
    """
    # Private API used: _SubprocessScriptLauncher.procs is the list its _ChildProcessObserver thread watches.
    launcher = trainer.strategy.launcher
    if not isinstance(launcher, _SubprocessScriptLauncher):
        return []
    ranks = list(launcher.procs)
    launcher.procs.clear()
    return ranks


def wait_for_ranks(ranks: list[subprocess.Popen], timeout: float = 120.0) -> None:
    """Wait up to ``timeout`` seconds in all for ``ranks`` to exit, then kill those still running: the observer's
    duty, taken over at exit so that no rank is left behind."""
    deadline = time.monotonic() + timeout
    for rank in ranks:
        try:
            rank.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rank.kill()
            rank.wait()


def say(message: str) -> None:
    """``message`` as one line on stderr, above any progress bar tqdm draws (Lightning's are tqdm's: it clears and
    redraws them), not after the bar's last character; a plain line when none is drawn."""
    from tqdm import tqdm

    tqdm.write(message, file=sys.stderr)


def _train_loaders(trainer: Trainer) -> list[Any]:
    loaders = trainer.train_dataloader
    if isinstance(loaders, Mapping):
        return list(loaders.values())
    return list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]


def sync_epoch_metrics(trainer: Trainer) -> None:
    """Reduce the training epoch's ``sync_dist`` metrics now, on every rank, before a collective of our own.

    Lightning reduces them lazily, when first read: rank 0's progress bar reads them in its ``on_train_epoch_end``,
    the other ranks only after every callback. A barrier or all-reduce issued by a callback in between pairs with
    rank 0's metric reduction instead of its own, and DDP hangs. Reading them here (cached afterwards) keeps the
    ranks' collectives in the same order, whichever callback runs first.
    """
    if trainer.world_size > 1:
        trainer.callback_metrics  # noqa: B018  (the read computes and caches the reduced values)


def _model_checkpoint(trainer: Trainer) -> ModelCheckpoint | None:
    return next((cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)), None)


def _skip_saving(trainer: Trainer) -> bool:
    return bool(trainer.fast_dev_run) or trainer.sanity_checking
