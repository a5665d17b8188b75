"""Fault tolerance (vit/callbacks/resume.py, nonfinite.py, vit/checkpoints/writing.py, vit/checkpoints/files.py,
vit/data/sampler.py), each fault injected for real: runs stopped and resumed
bit-identically, SIGKILL, SIGTERM and SIGINT, a crash in the middle of a checkpoint write, a truncated file, a loss
or gradient made non-finite, a pickle carrying code, a checkpoint of another architecture (an unreachable W&B server
is in test_wandb.py).

Runs go through ``vit.cli.cli_main`` in this process (a fresh interpreter spends ~20 s importing torch on the test
machine), except where the fault needs its own process (SIGKILL). Tiny model: depth 2,
width 32, 16x16 images, 6 steps an epoch, with dropout, drop-path, Mixup/CutMix, augmentation and an EMA, so every
random stream and every piece of optimiser state takes part in the bit-identity checks.
"""

from __future__ import annotations

import ast
import gc
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Callback

from vit import ImageClassifier, ImageDataModule
from vit.callbacks.nonfinite import NonFiniteGuard
from vit.callbacks.resume import rng_state, say, set_rng_state
from vit.checkpoints.writing import AtomicCheckpointIO
from vit.cli import cli_main
from vit.errors import EXIT_BAD_INPUT as EXIT_BAD_CHECKPOINT
from vit.errors import EXIT_NON_FINITE, CorruptCheckpointError, NonFiniteError, UnsafeCheckpointError

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


# -------------------------------------------------------------------------------------------- fault injection
class Fault(Callback):
    """Test helper, used as ``--trainer.callbacks`` ``class_path: test_resume.Fault``: injects ``kind`` at optimizer
    step ``step`` (``global_step == step``).

    ``crash`` raises before the step starts; ``sigkill``/``sigterm``/``sigint`` signal this process in the middle of
    the step (after the forward pass); ``nan_loss`` makes the network's output NaN; ``nan_grad`` makes the gradient
    of the patch embedding NaN while the loss stays finite.
    """

    def __init__(self, step: int, kind: str) -> None:
        self.step, self.kind = step, kind

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step != self.step:
            return
        if self.kind == "crash":
            raise RuntimeError(f"injected crash at step {self.step}")
        if self.kind == "nan_loss":
            pl_module.model.register_forward_hook(lambda module, args, out: out * float("nan"))
        if self.kind == "nan_grad":
            pl_module.model.patch_embed.proj.weight.register_hook(lambda grad: grad * float("nan"))

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        signals = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigint": signal.SIGINT}
        if trainer.global_step == self.step and self.kind in signals:
            os.kill(os.getpid(), signals[self.kind])


def fault(step: int, kind: str) -> str:
    return "--trainer.callbacks=" + json.dumps(
        [{"class_path": "test_resume.Fault", "init_args": {"step": step, "kind": kind}}]
    )


def final_state(args: list[str]) -> dict[str, torch.Tensor]:
    """Run the CLI and return the module's state dict (model, EMA) and the optimizer state, flattened."""
    cli = cli_main(args)
    state = {f"module.{k}": v.detach().clone() for k, v in cli.model.state_dict().items()}
    for i, (p, s) in enumerate(cli.trainer.optimizers[0].state_dict()["state"].items()):
        state.update({f"optim.{i}.{p}.{k}": v.clone() for k, v in s.items() if isinstance(v, torch.Tensor)})
    return state


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def ckpt(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, fit_args) -> dict[str, torch.Tensor]:
    """The final state of the uninterrupted synthetic run that the stopped-and-resumed runs must reproduce."""
    return final_state(fit_args(tmp_path_factory.mktemp("reference")))


def run_stopped(args: list[str], capsys) -> tuple[int | None, str]:
    """Run the CLI expecting it to stop (SystemExit or an injected crash); return the exit status and stderr."""
    capsys.readouterr()
    code = None
    try:
        cli_main(args)
    except SystemExit as exit_:
        code = exit_.code
    except RuntimeError as err:
        assert "injected crash" in str(err)
    return code, capsys.readouterr().err


# ------------------------------------------------------------------------------------------ resume, preemption
@pytest.mark.slow
@pytest.mark.parametrize(("dataset", "stop_epoch"), [("synthetic", 1), ("digits", 2)])
def test_stopped_at_an_epoch_end_and_resumed_is_bit_identical(
    dataset, stop_epoch, reference, tmp_path, capsys, fit_args
):
    epochs = 3 if dataset == "digits" else fit_args.epochs
    expected = (
        reference if dataset == "synthetic" else final_state(fit_args(tmp_path / "ref", dataset=dataset, epochs=epochs))
    )
    args = fit_args(tmp_path / "run", dataset=dataset, epochs=epochs)
    run_stopped([*args, fault(stop_epoch * fit_args.steps_per_epoch, "crash")], capsys)  # dies as the next epoch starts
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert ckpt(last)["global_step"] == stop_epoch * fit_args.steps_per_epoch
    resumed = final_state([*args, "--ckpt_path=last"])
    assert max_difference(resumed, expected) == 0.0


@pytest.mark.slow
def test_sigkill_mid_epoch_loses_only_the_steps_since_the_checkpoint(reference, tmp_path, fit_args):
    args = fit_args(tmp_path, "--resume.every_n_train_steps=2", fault(9, "sigkill"))  # killed inside step 9
    env = {**os.environ, "PYTHONPATH": str(TESTS), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "vit", *args], env=env, cwd=ROOT, capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert ckpt(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 8  # steps 8..9 lost, nothing else
    resumed = final_state([*fit_args(tmp_path, "--resume.every_n_train_steps=2"), "--ckpt_path=last"])
    assert max_difference(resumed, reference) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sigterm", "sigint"])
def test_sigterm_and_sigint_save_a_checkpoint_and_resume_continues(kind, reference, tmp_path, capsys, fit_args):
    signum = signal.SIGTERM if kind == "sigterm" else signal.SIGINT
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN, not Python's handler, when launched in the background with &
    code, err = run_stopped([*fit_args(tmp_path), fault(7, kind)], capsys)  # signalled inside step 7, mid-epoch
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert code == 128 + signum  # 143 / 130: the shell's "terminated by signal", after the checkpoint
    assert f"{signal.Signals(signum).name} received: stopped after step 8 (epoch 1)" in err
    assert f"saved a checkpoint to {last}" in err and f"--ckpt_path {last}" in err
    assert ckpt(last)["global_step"] == 8  # step 7 was finished first
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored
    resumed = final_state([*fit_args(tmp_path), "--ckpt_path=last"])
    assert max_difference(resumed, reference) == 0.0


def test_data_workers_ignore_termination_signals():
    # Ctrl-C and SLURM's SIGTERM reach every process of the group: workers must live until the checkpoint is written.
    dm = ImageDataModule("synthetic", img_size=16, batch_size=8, synthetic_size=32, num_workers=1)
    loader = dm.train_dataloader()
    batches = iter(loader)
    next(batches)
    (worker,) = loader._iterator._workers
    for signum in (signal.SIGTERM, signal.SIGINT):
        os.kill(worker.pid, signum)
    time.sleep(0.5)
    assert worker.is_alive() and len(list(batches)) == 3
    loader._iterator._shutdown_workers()  # persistent worker: stop it now rather than at garbage collection
    assert not worker.is_alive()


@pytest.mark.slow
def test_a_script_holding_loaders_with_workers_exits():
    # Workers ignore SIGTERM, and multiprocessing's exit handler terminates and then joins them: a script that still
    # holds its loaders at exit used to wait forever. Its own interpreter, since the hang is at interpreter exit.
    script = (
        "from vit import ImageDataModule\n"
        "dm = ImageDataModule('synthetic', img_size=16, batch_size=8, synthetic_size=32, num_workers=2)\n"
        "train, val = dm.train_dataloader(), dm.val_dataloader()\n"
        "next(iter(train)), list(val)\n"  # one worker mid-epoch, the others idle
        "print('held', len(train._iterator._workers) + len(val._iterator._workers))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "held 4" and "Traceback" not in done.stderr


def test_sampler_order_is_a_function_of_seed_and_epoch_and_resumes_mid_epoch():
    dm = ImageDataModule("synthetic", img_size=16, batch_size=4, synthetic_size=32, num_workers=0)
    loader = dm.train_dataloader()

    def epoch(e: int) -> list[torch.Tensor]:
        loader.sampler.set_epoch(e)
        return [x for x, _ in loader]

    first, second = epoch(0), epoch(1)
    assert all(torch.equal(a, b) for a, b in zip(first, epoch(0), strict=True))  # repeats, whatever ran before
    assert not torch.equal(first[0], second[0])
    batches = iter(loader)
    loader.sampler.set_epoch(1)
    next(batches), next(batches), next(batches)
    state = loader.state_dict()
    assert state == {"epoch": 1, "batches": 3}
    fresh = ImageDataModule("synthetic", img_size=16, batch_size=4, synthetic_size=32, num_workers=0).train_dataloader()
    fresh.load_state_dict(state)
    fresh.sampler.set_epoch(1)
    rest = [x for x, _ in fresh]
    assert len(rest) == 5 and all(torch.equal(a, b) for a, b in zip(rest, second[3:], strict=True))


def test_rng_state_survives_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(3)
    state = rng_state()
    torch.save({"rng": state}, tmp_path / "s.pt")
    expected = (torch.rand(3), __import__("numpy").random.rand(3).tolist(), __import__("random").random())
    set_rng_state(torch.load(tmp_path / "s.pt", weights_only=True)["rng"])
    assert torch.equal(torch.rand(3), expected[0])
    assert __import__("numpy").random.rand(3).tolist() == expected[1]
    assert __import__("random").random() == expected[2]


# ---------------------------------------------------------------------------------------------- atomic writes
_TORCH_SAVE = torch.save


def _half_then(action):
    """A ``torch.save`` that writes the first half of the file, then calls ``action`` (which raises or exits)."""

    def save(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        _TORCH_SAVE(obj, buffer)
        f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        f.flush()
        action()

    return save


def test_crash_in_the_middle_of_a_checkpoint_write_keeps_the_previous_file(tmp_path, monkeypatch):
    io_ = AtomicCheckpointIO()
    last = tmp_path / "checkpoints" / "last.ckpt"
    io_.save_checkpoint({"global_step": 1, "w": torch.ones(1000)}, last)
    before = last.read_bytes()

    # 1. an exception (disk full, Ctrl-C) half-way: previous file intact, no temporary left
    def disk_full():
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", _half_then(disk_full))
    with pytest.raises(OSError, match="No space left"):
        io_.save_checkpoint({"global_step": 2, "w": torch.zeros(1000)}, last)
    assert last.read_bytes() == before and sorted(p.name for p in last.parent.iterdir()) == ["last.ckpt"]

    monkeypatch.undo()
    # 2. the process dies half-way (os._exit: no cleanup at all), in a forked child
    gc.collect()  # finalize here, not in the child, anything (a DataLoader's workers) left by earlier tests
    pid = os.fork()
    if pid == 0:  # child
        gc.disable()
        try:
            torch.save = _half_then(lambda: os._exit(9))
            io_.save_checkpoint({"global_step": 3, "w": torch.zeros(1000)}, last)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 9
    assert last.read_bytes() == before
    loaded = io_.load_checkpoint(last)
    assert loaded["global_step"] == 1 and torch.equal(loaded["w"], torch.ones(1000))
    leftovers = [p.name for p in last.parent.glob(".last.ckpt.tmp-*")]  # vit.atomic's .<name>.tmp-<pid>-<random>
    assert len(leftovers) == 1 and leftovers[0].startswith(f".last.ckpt.tmp-{pid}-")
    io_.save_checkpoint({"global_step": 4}, last)  # the next write clears the dead process's leftover
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.ckpt"] and ckpt(last)["global_step"] == 4


def test_truncated_checkpoint_is_named_on_resume(tmp_path, capsys, fit_args):
    good = tmp_path / "good.ckpt"
    AtomicCheckpointIO().save_checkpoint({"global_step": 1, "w": torch.ones(1000)}, good)
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(good.read_bytes()[:-300])
    with pytest.raises(CorruptCheckpointError, match="cut.ckpt is not a PyTorch checkpoint .a zip archive cut short"):
        AtomicCheckpointIO().load_checkpoint(cut)
    code, err = run_stopped([*fit_args(tmp_path), f"--ckpt_path={cut}"], capsys)
    assert code == EXIT_BAD_CHECKPOINT
    assert err.strip().splitlines()[-1].startswith(f"error: {cut} is not a PyTorch checkpoint")
    assert "Traceback" not in err


# ---------------------------------------------------------------------------------------------- numerical faults
@pytest.mark.slow
def test_non_finite_loss_stops_at_once_and_keeps_the_last_good_checkpoint(tmp_path, capsys, fit_args):
    code, err = run_stopped([*fit_args(tmp_path, "--resume.every_n_train_steps=1"), fault(3, "nan_loss")], capsys)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert code == EXIT_NON_FINITE
    message = err.strip().splitlines()[-1]
    assert message.startswith("error: non-finite loss (nan) at step 3 (epoch 0, batch 3): training stopped")
    assert "learning rate" in message and "precision 32-true" in message and "bf16-mixed" in message
    assert f"The last good checkpoint is kept: {last}" in message
    saved = ckpt(last)
    assert saved["global_step"] == 3  # written after step 2, never after the NaN
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values() if v.is_floating_point())
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.ckpt"]


def test_non_finite_gradient_stops_before_the_optimizer_step(tmp_path, capsys, fit_args):
    code, err = run_stopped([*fit_args(tmp_path, epochs=1), fault(1, "nan_grad")], capsys)
    assert code == EXIT_NON_FINITE
    assert "non-finite gradient (first in model.patch_embed.proj.weight) at step 1" in err
    assert "No checkpoint had been written yet." in err


def test_deferred_non_finite_check_stops_within_n_steps_and_never_saves_the_bad_weights(tmp_path, capsys, fit_args):
    # Flags on the device, read every 4 steps and before each checkpoint: the NaN gradient of step 1 is applied,
    # and the checkpoint after it is refused.
    extra = ("--resume.every_n_train_steps=1", "--nonfinite.check_every_n_steps=4")
    code, err = run_stopped([*fit_args(tmp_path, *extra, epochs=1), fault(1, "nan_grad")], capsys)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert code == EXIT_NON_FINITE
    message = err.strip().splitlines()[-1]
    assert message.startswith("error: non-finite gradient in steps 1..1 (epoch 0; checked every 4 steps")
    assert f"The last good checkpoint is kept: {last}" in message
    saved = ckpt(last)
    assert saved["global_step"] == 1
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values() if v.is_floating_point())


def test_deferred_non_finite_check_reads_the_device_every_n_steps(tmp_path, capsys, fit_args):
    code, err = run_stopped(
        [*fit_args(tmp_path, "--nonfinite.check_every_n_steps=4", epochs=1), fault(1, "nan_loss")], capsys
    )
    assert code == EXIT_NON_FINITE
    assert "error: non-finite loss and gradient in steps 0..3 (epoch 0; checked every 4 steps" in err
    assert "No checkpoint had been written yet." in err


def test_non_finite_weights_are_never_saved(fit_args):
    module = ImageClassifier("vit_tiny_patch4_32", num_classes=10, img_size=16, model_overrides=fit_args.overrides)
    with torch.no_grad():
        module.model.head.bias[0] = float("inf")
    with pytest.raises(NonFiniteError, match=r"refusing to save a checkpoint at step 7: parameter model.head.bias"):
        NonFiniteGuard().on_save_checkpoint(SimpleNamespace(global_step=7), module, {})
    stem = ImageClassifier(
        "vit_tiny_patch4_32", num_classes=10, img_size=16, model_overrides={**fit_args.overrides, "conv_stem": True}
    )
    with torch.no_grad():  # BatchNorm statistics are weights too
        stem.model.patch_embed.stem[0].bn.running_var[0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"buffer model.patch_embed.stem.0.bn.running_var is not finite"):
        NonFiniteGuard().on_save_checkpoint(SimpleNamespace(global_step=7), stem, {})


# ------------------------------------------------------------------------------------------------ safe loading
class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_carrying_code_is_refused(tmp_path, capsys, fit_args):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "payload": _RunsCode(marker)}, evil)
    code, err = run_stopped([*fit_args(tmp_path), f"--ckpt_path={evil}"], capsys)
    assert code == EXIT_BAD_CHECKPOINT
    assert f"error: refusing to load {evil}: it is a pickle that needs arbitrary code" in err
    with pytest.raises((UnsafeCheckpointError, pickle.UnpicklingError)):
        ImageClassifier.load_from_checkpoint(evil)
    with pytest.raises(UnsafeCheckpointError):
        AtomicCheckpointIO().load_checkpoint(evil)
    assert not marker.exists()


def test_every_torch_load_in_the_project_is_weights_only():
    calls = []
    for path in [*ROOT.glob("vit/**/*.py"), *ROOT.glob("scripts/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            func = getattr(node, "func", None)
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if isinstance(node, ast.Call) and name in ("load", "load_from_checkpoint"):
                owner = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
                if name == "load" and owner != "torch":
                    continue
                safe = any(k.arg == "weights_only" and getattr(k.value, "value", None) is True for k in node.keywords)
                calls.append((f"{path.relative_to(ROOT)}:{node.lineno}", ast.unparse(node), safe))
    assert len(calls) >= 3 and all(safe for *_, safe in calls), [c for c in calls if not c[2]]


@pytest.mark.slow
def test_resuming_a_checkpoint_of_another_architecture_lists_the_keys(tmp_path, capsys, fit_args):
    # The config changed (wider, deeper), the run folder did not: --ckpt_path last finds the old architecture.
    final_state([*fit_args(tmp_path, "--resume.every_n_train_steps=1"), "--trainer.max_steps=1"])
    last = tmp_path / "checkpoints" / "last.ckpt"
    wider = {**fit_args.overrides, "embed_dim": 48, "depth": 3}
    code, err = run_stopped(
        [*fit_args(tmp_path), f"--model.model_overrides={json.dumps(wider)}", "--ckpt_path=last"], capsys
    )
    assert code == EXIT_BAD_CHECKPOINT
    message = err.strip().splitlines()[-1]
    assert message.startswith(f"error: {last} does not fit this model: ")
    assert "24 missing key(s): model.blocks.2." in message and "model_ema.module.blocks.2." in message
    assert "mis-shaped key(s): model.blocks.0.attn.proj.bias: checkpoint (32,) vs model (48,)" in message
    assert "It was trained with model='vit_tiny_patch4_32', model_overrides={'embed_dim': 32, " in message
    assert "Traceback" not in err


def test_the_resume_line_stands_above_the_progress_bar_not_after_it(monkeypatch):
    """With a tqdm bar drawn on the same terminal, the line is written on a line of its own (tqdm clears the bar,
    writes, redraws); without a bar, it is a plain line on stderr."""
    from tqdm import tqdm

    terminal = io.StringIO()  # stdout and stderr of one terminal
    monkeypatch.setattr(sys, "stderr", terminal)
    bar = tqdm(total=10, file=terminal, desc="Training")
    bar.update(3)
    say("resuming from x: step 3")
    bar.close()
    lines = terminal.getvalue().replace("\r", "\n").splitlines()
    assert "resuming from x: step 3" in lines  # a line of its own, not glued to the bar's last character
    assert any(line.startswith("Training:") for line in lines[lines.index("resuming from x: step 3") :])  # redrawn
    monkeypatch.setattr(sys, "stderr", terminal := io.StringIO())
    say("resuming from y")
    assert terminal.getvalue() == "resuming from y\n"
