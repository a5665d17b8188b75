"""Fault tolerance: resume bit-identically, survive preemption, and never write a bad or trust an unsafe checkpoint.

- :class:`ResumeCheckpoint` (a Lightning checkpoint callback, ``--resume.*`` on the command line) owns
  ``last.ckpt``: written at the end of every epoch, every ``every_n_train_steps`` optimizer steps, and on SIGTERM or
  SIGINT after the current step (then the run exits with status ``128 + signal``, 143 or 130, printing the resume
  command). It keeps the global random states (torch, CUDA, NumPy, ``random``) in every checkpoint, restores them
  on resume and shields the training streams from validation, so a resumed run is bit-identical.
- :class:`NonFiniteGuard` (``--nonfinite.*``) stops at the first non-finite loss or gradient, before the optimizer
  step, and refuses to save non-finite weights.
- :class:`AtomicCheckpointIO` (a Lightning ``CheckpointIO`` plugin) writes every checkpoint to a temporary file that
  is fsynced and renamed into place, so a kill during a write leaves the previous file intact; it reads checkpoints
  with ``weights_only=True`` and reports unsafe or truncated files in one sentence.
- :func:`check_checkpoint_fits` lists the missing, unexpected and mis-shaped keys of a checkpoint from another
  architecture; :func:`wandb_reachable` lets the CLI fall back to offline W&B logging within seconds.

The data side of a bit-identical resume (an order and augmentations that are a function of ``(seed, epoch)``, and a
loader that resumes mid-epoch) is in :mod:`vit.data.sampler`.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.types import _Stateful
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from .models import IncompatibleCheckpointError, UnsafeCheckpointError, describe_mismatch

EXIT_BAD_CHECKPOINT = 2
"""Exit status for a checkpoint that is unsafe, truncated or of another architecture (bad input, like data errors)."""
EXIT_NON_FINITE = 3
"""Exit status when training stopped at a non-finite loss or gradient."""

_DEFAULT_WANDB_URL = "https://api.wandb.ai"


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file that is truncated or not a checkpoint at all."""


class MissingCheckpointError(FileNotFoundError):
    """A checkpoint path that does not exist."""


class NonFiniteError(RuntimeError):
    """Training produced a non-finite loss, gradient or weight."""


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


# ------------------------------------------------------------------------------------------------ random state
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


# ------------------------------------------------------------------------------------------------ the callback
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
            Ctrl-C stops at once, without a checkpoint.
    """

    def __init__(self, every_n_train_steps: int = 0, save_on_signal: bool = True) -> None:
        if every_n_train_steps < 0:
            raise ValueError(f"every_n_train_steps must be >= 0 (0: no step checkpoints), got {every_n_train_steps}")
        self.every_n_train_steps = every_n_train_steps
        self.save_on_signal = save_on_signal
        self._pending: dict[str, Any] | None = None  # random state to apply before the next training batch
        self._snapshot: dict[str, Any] | None = None  # random state at the end of the last training batch
        self._signal: int | None = None
        self._handlers: dict[int, Any] = {}
        self._last_step = -1
        self._loader_states: list[dict[str, Any]] = []

    # ------------------------------------------------------------------------------------------- random state
    def state_dict(self) -> dict[str, Any]:
        """The random state the next training batch will start from."""
        return {"rng": self._pending if self._pending is not None else rng_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the checkpoint's random state; it is applied right before the first training batch (after the
        sanity check, data loading and anything else that draws random numbers while a run starts)."""
        self._pending = state_dict.get("rng")

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
        self._signal = None
        self._last_step = trainer.global_step
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
        signalled = self._signal is not None
        if trainer.world_size > 1:  # every rank saves together and stops together
            signalled = trainer.strategy.reduce_boolean_decision(signalled, all=False)
        if not stepped:
            return
        if signalled:
            path = self._save_last(trainer)
            signum = self._signal if self._signal is not None else signal.SIGTERM
            self._announce_preemption(trainer, signum, path)
            raise Preempted(signum, path)
        every = self.every_n_train_steps
        if every and trainer.global_step % every == 0 and not _skip_saving(trainer):
            self._save_last(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
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


class NonFiniteGuard(Callback):
    """Stop training at the first non-finite loss or gradient, before the optimizer step, so the weights stay finite;
    refuse to save a checkpoint of non-finite weights, so the last good one is never overwritten.

    The error (:class:`NonFiniteError`; the CLI prints it and exits with status 3) names the step, the learning rate
    and precision, the likely causes and the checkpoint that is kept. Under fp16 mixed precision only a NaN loss
    stops the run: infinite gradients are the grad scaler's to skip.

    Args:
        check_gradients: Also check the gradients before each optimizer step (one reduction over them per step).
    """

    def __init__(self, check_gradients: bool = True) -> None:
        self.check_gradients = check_gradients

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        scaled = _grad_scaler(trainer) is not None  # a scaled fp16 loss may overflow to inf: the scaler skips it
        bad = torch.isnan(loss).any() if scaled else ~torch.isfinite(loss).all()
        if bool(bad):
            raise NonFiniteError(non_finite_message(trainer, f"non-finite loss ({loss.detach().float().item()})"))

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        if not self.check_gradients or _grad_scaler(trainer) is not None:  # inf gradients: the scaler skips them
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if grads and not bool(torch.isfinite(torch.nn.utils.get_total_norm(grads))):  # one foreach reduction
            names = {p: n for n, p in pl_module.named_parameters()}
            first = next(
                names.get(p, "?")
                for group in optimizer.param_groups
                for p in group["params"]
                if p.grad is not None and not bool(torch.isfinite(p.grad).all())
            )
            raise NonFiniteError(non_finite_message(trainer, f"non-finite gradient (first in {first})"))

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        for name, param in pl_module.named_parameters():
            if param.is_floating_point() and not bool(torch.isfinite(param).all()):
                raise NonFiniteError(
                    f"refusing to save a checkpoint at step {trainer.global_step}: parameter {name} is not finite. "
                    f"The previous checkpoint is kept. {_LIKELY_CAUSES}"
                )


_LIKELY_CAUSES = (
    "Likely causes: a learning rate too high for the batch size (lower --model.lr, or lengthen the warm-up with "
    "--model.warmup_epochs), overflow in reduced precision (--trainer.precision 16-mixed: use bf16-mixed or 32-true), "
    "or NaN/Inf in the input data."
)


def non_finite_message(trainer: Trainer, what: str) -> str:
    """The message for a non-finite value at the current step: where, the learning rate and precision, the likely
    causes, and the checkpoint that is kept.

    Args:
        trainer: The running trainer.
        what: What was non-finite, e.g. ``"non-finite loss (nan)"``.
    """
    lrs = sorted({group["lr"] for optimizer in trainer.optimizers for group in optimizer.param_groups})
    lr = f"{lrs[-1]:.3g}" if lrs else "?"
    last = last_checkpoint_path(trainer)
    kept = (
        f"The last good checkpoint is kept: {last}; resume from it (--ckpt_path {last}) after the change."
        if last.is_file()
        else "No checkpoint had been written yet."
    )
    return (
        f"{what} at step {trainer.global_step} (epoch {trainer.current_epoch}, batch "
        f"{trainer.fit_loop.epoch_loop.batch_idx}): training stopped before the optimizer step, so the weights are "
        f"still finite (learning rate {lr}, precision {trainer.precision}). {_LIKELY_CAUSES} {kept}"
    )


def _train_loaders(trainer: Trainer) -> list[Any]:
    loaders = trainer.train_dataloader
    if isinstance(loaders, Mapping):
        return list(loaders.values())
    return list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]


def _grad_scaler(trainer: Trainer) -> Any:
    return getattr(trainer.precision_plugin, "scaler", None)


def last_checkpoint_path(trainer: Trainer) -> Path:
    """Where ``last.ckpt`` goes: the folder of the trainer's :class:`ModelCheckpoint`, else
    ``<default_root_dir>/checkpoints``.

    Args:
        trainer: The trainer (after its callbacks are set up).
    """
    callback = _model_checkpoint(trainer)
    if callback is not None and callback.dirpath:
        return Path(callback.dirpath) / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"
    return Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"


def _model_checkpoint(trainer: Trainer) -> ModelCheckpoint | None:
    return next((cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)), None)


def _skip_saving(trainer: Trainer) -> bool:
    return bool(trainer.fast_dev_run) or trainer.sanity_checking


# ------------------------------------------------------------------------------------------- checkpoint files
class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoint files written atomically and read safely.

    ``save_checkpoint`` writes ``<path>.tmp-<pid>``, fsyncs it, renames it over ``<path>`` (``os.replace``) and
    fsyncs the folder: a process killed at any moment leaves either the old file or the new one, never half of one.
    ``load_checkpoint`` always reads with ``torch.load(weights_only=True)``: a pickle that needs arbitrary code is
    refused (:class:`~vit.models.UnsafeCheckpointError`) and a truncated file named (:class:`CorruptCheckpointError`).
    Remote paths (``s3://`` ...) go through Lightning's ``TorchCheckpointIO``.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        _fsync_dir(path.parent)
        _remove_stale_temporaries(path)

    def load_checkpoint(
        self,
        path: Any,
        map_location: Callable | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        if "://" in str(path):
            with checkpoint_errors(path):
                return super().load_checkpoint(path, map_location=map_location, weights_only=True)
        path = Path(path)
        if not path.is_file():
            raise MissingCheckpointError(f"checkpoint file not found: {path}")
        with checkpoint_errors(path):
            return torch.load(path, map_location=map_location, weights_only=True)


def with_atomic_checkpoint_io(plugins: Any) -> list[Any]:
    """The trainer's ``plugins`` plus an :class:`AtomicCheckpointIO`, unless one of them already is a
    ``CheckpointIO``.

    Args:
        plugins: ``Trainer(plugins=...)``: ``None``, one plugin or a list.
    """
    items = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if not any(isinstance(plugin, CheckpointIO) for plugin in items):
        items.append(AtomicCheckpointIO())
    return items


@contextlib.contextmanager
def checkpoint_errors(path: Any) -> Iterator[None]:
    """Around a ``torch.load(path, weights_only=True)``: a pickle needing code becomes
    :class:`~vit.models.UnsafeCheckpointError`, a truncated or non-checkpoint file :class:`CorruptCheckpointError`,
    each naming ``path``.

    Args:
        path: The file being read.
    """
    try:
        yield
    except pickle.UnpicklingError as err:
        if "weights_only" in str(err) or "Weights only load failed" in str(err):
            raise UnsafeCheckpointError(
                f"refusing to load {path}: it is a pickle that needs arbitrary code to load (never executed here). "
                "Only tensors and plain containers are accepted; if you trust the file, load it in Python, re-save "
                "its state dict with torch.save(...) or convert it to .safetensors."
            ) from None
        raise CorruptCheckpointError(f"{path} is not a checkpoint, or is corrupt ({err}); use another one") from None
    except (RuntimeError, EOFError, OSError) as err:
        text = str(err)
        corrupt = isinstance(err, (EOFError, OSError)) or "zip archive" in text or "PytorchStreamReader" in text
        if corrupt and not isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError)):
            raise CorruptCheckpointError(
                f"{path} is truncated or corrupt ({text.splitlines()[0] if text else type(err).__name__}); it was "
                "probably cut short by a crash or a full disk. Resume from another checkpoint."
            ) from None
        raise


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem (nor Windows) can fsync a directory
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove_stale_temporaries(path: Path) -> None:
    """Delete ``<path>.tmp-<pid>`` files left by processes killed mid-write (whose pid is gone)."""
    for tmp in path.parent.glob(f"{path.name}.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                tmp.unlink()
        except OSError:
            pass  # alive, another user's: leave it


def check_checkpoint_fits(module: torch.nn.Module, checkpoint: Mapping[str, Any], source: Any = None) -> None:
    """Raise one clear error when a Lightning checkpoint's weights do not fit ``module``.

    Args:
        module: The module about to load ``checkpoint["state_dict"]``.
        checkpoint: The loaded checkpoint.
        source: The checkpoint's path, named in the message.

    Raises:
        IncompatibleCheckpointError: Listing the missing, unexpected and mis-shaped keys, and the model the
            checkpoint was trained with when it says so.
    """
    name = str(source) if source else "the checkpoint"
    state = checkpoint.get("state_dict")
    if not isinstance(state, Mapping):
        raise IncompatibleCheckpointError(
            f"{name} has no 'state_dict': it is not a Lightning checkpoint of this module "
            "(for a bare weights file, pass it as --model.pretrained instead)"
        )
    problem = describe_mismatch(module, state)
    if not problem:
        return
    hparams = checkpoint.get("hyper_parameters") or {}
    trained = ", ".join(f"{k}={hparams[k]!r}" for k in ("model", "model_overrides", "img_size") if k in hparams)
    origin = f" It was trained with {trained}." if trained else ""
    raise IncompatibleCheckpointError(
        f"{name} does not fit this model: {problem}.{origin} Resume with the config the checkpoint was "
        "trained with, or start a new run from its weights with --model.pretrained <checkpoint>."
    )


# ------------------------------------------------------------------------------------------------------- W&B
def wandb_reachable(base_url: str | None = None, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the W&B server opens within ``timeout`` seconds (name lookup included).

    Args:
        base_url: The server; default ``WANDB_BASE_URL`` or ``https://api.wandb.ai``.
        timeout: Seconds to wait at most.
    """
    url = urlparse(base_url or os.environ.get("WANDB_BASE_URL") or _DEFAULT_WANDB_URL)
    host = url.hostname
    if not host:
        return False
    port = url.port or (443 if url.scheme == "https" else 80)
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)  # getaddrinfo has no timeout of its own
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


# ------------------------------------------------------------------------------------------ the command line
@contextlib.contextmanager
def exit_on_fault() -> Iterator[None]:
    """Turn checkpoint and numerical faults into one ``error:`` line on stderr and an exit status, no traceback:
    :data:`EXIT_BAD_CHECKPOINT` for unsafe, corrupt, missing or mismatched checkpoints, :data:`EXIT_NON_FINITE` for
    a non-finite loss or gradient. (A preempted run exits through :class:`Preempted`.)
    """
    try:
        yield
    except (UnsafeCheckpointError, CorruptCheckpointError, MissingCheckpointError, IncompatibleCheckpointError) as err:
        sys.stderr.write(f"error: {err}\n")
        raise SystemExit(EXIT_BAD_CHECKPOINT) from None
    except NonFiniteError as err:
        sys.stderr.write(f"error: {err}\n")
        raise SystemExit(EXIT_NON_FINITE) from None
