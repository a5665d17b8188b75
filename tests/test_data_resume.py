"""Resume on the decoded-once path (vit/data/decoded_loader.py): a run stopped mid-epoch and resumed with the CLI's
``--ckpt_path`` ends bit-identical to one never stopped (order and batched augmentation are functions of the seed and
epoch), and DDP ranks read disjoint shards.

As in tests/test_resume.py: runs go through ``vit.cli.cli_main`` in this process, one thread, a tiny model with
dropout, drop-path, Mixup/CutMix and an EMA, on the digits decoded once with ``strong`` batched augmentation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from vit.cli import cli_main
from vit.data import DecodedLoader, DecodedSplit, ImageDataModule
from vit.data.sampler import ResumableSampler


class Crash(Callback):
    """Raises at the start of optimizer step ``step`` (used as ``class_path: test_data_resume.Crash``)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"injected crash at step {self.step}")


@pytest.fixture
def decoded_args(fit_args):
    """The tiny run of tests/conftest.py, on the digits decoded once with ``strong`` batched augmentation, 2 epochs."""
    return lambda root, *extra: fit_args(root, "--data.augment=strong", *extra, dataset="digits", epochs=2)


def final_state(args: list[str]) -> dict[str, torch.Tensor]:
    cli = cli_main(args)
    assert isinstance(cli.trainer.train_dataloader, DecodedLoader)  # the decoded-once path, not the per-image one
    state = {f"module.{k}": v.detach().clone() for k, v in cli.model.state_dict().items()}
    for i, (p, s) in enumerate(cli.trainer.optimizers[0].state_dict()["state"].items()):
        state.update({f"optim.{i}.{p}.{k}": v.clone() for k, v in s.items() if isinstance(v, torch.Tensor)})
    return state


pytestmark = pytest.mark.usefixtures("one_thread_per_module")  # runs compared bit for bit must sum in the same order


@pytest.mark.slow
def test_decoded_run_stopped_mid_epoch_resumes_bit_identical(tmp_path: Path, decoded_args) -> None:
    reference = final_state(decoded_args(tmp_path / "reference"))
    root = tmp_path / "stopped"
    crash = "--trainer.callbacks=" + json.dumps([{"class_path": "test_data_resume.Crash", "init_args": {"step": 9}}])
    with pytest.raises(RuntimeError, match="injected crash at step 9"):
        cli_main(decoded_args(root, "--resume.every_n_train_steps=4", crash))
    last = root / "checkpoints" / "last.ckpt"
    saved = torch.load(last, map_location="cpu", weights_only=True)
    assert saved["global_step"] == 8 and saved["epoch"] == 1  # two steps into the second epoch: mid-epoch
    resumed = final_state(decoded_args(root, f"--ckpt_path={last}"))
    assert resumed.keys() == reference.keys()
    different = [k for k in reference if not torch.equal(reference[k], resumed[k])]
    assert not different, different[:5]
    # and the run really depends on the augmentation stream: another data seed ends elsewhere
    other = final_state(decoded_args(tmp_path / "other", "--data.seed=1"))
    assert any(not torch.equal(reference[k], other[k]) for k in reference)


def _split(n: int = 50) -> DecodedSplit:
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 3, 8, 8).contiguous()
    return DecodedSplit(images, torch.arange(n), [str(i) for i in range(n)])


def test_loader_resumes_mid_epoch_with_the_same_augmented_batches() -> None:
    dm = ImageDataModule("digits", img_size=16, batch_size=32, augment="strong")
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(3)
    epoch = list(loader)
    state = {"epoch": 3, "batches": 4}
    fresh = ImageDataModule("digits", img_size=16, batch_size=32, augment="strong").train_dataloader()
    fresh.load_state_dict(state)
    fresh.sampler.set_epoch(3)
    rest = list(fresh)
    assert len(rest) == len(epoch) - 4
    for (a, ya), (b, yb) in zip(epoch[4:], rest, strict=True):
        assert torch.equal(a, b) and torch.equal(ya, yb)
    loader.sampler.set_epoch(4)
    assert not torch.equal(next(iter(loader))[0], epoch[0][0])  # another epoch, another order and augmentation


def test_ddp_ranks_read_disjoint_shards() -> None:
    split = _split(50)
    seen = []
    for rank in range(3):
        sampler = ResumableSampler(split, seed=0, num_replicas=3, rank=rank, drop_last=True)
        loader = DecodedLoader(split, batch_size=4, sampler=sampler, drop_last=True)
        seen.append(torch.cat([y for _, y in loader]).tolist())
    assert [len(s) for s in seen] == [16, 16, 16]
    assert len(set(seen[0]) | set(seen[1]) | set(seen[2])) == 48  # disjoint
    for _, labels in DecodedLoader(split, 4, ResumableSampler(split, seed=0, num_replicas=3, rank=1, drop_last=True)):
        assert labels.tolist() == [i for i in labels.tolist() if i in seen[1]]
