"""Two "nodes" of one process each on this machine (gloo): one run folder, one W&B run, every training sample seen
once per epoch across the two (an odd count pads one repeat so the shards are equal), and ``--ckpt_path last``
resumes both into the same folder."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from lightning.pytorch import Callback

from vit.runs import first_process_of_job

TINY = {"embed_dim": 16, "depth": 1, "num_heads": 2}


class RecordSamples(Callback):
    """Writes the indices of the training samples this rank draws in each epoch to ``<folder>/rank<r>-epoch<e>.json``
    (used as ``class_path: test_multinode.RecordSamples``)."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        # A copy: iterating the loader's own sampler would use up the position a resumed epoch starts from.
        sampler = copy.copy(trainer.train_dataloader.sampler)
        indices = [int(item[0] if isinstance(item, tuple) else item) for item in sampler]  # (index, seed) or index
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"rank{trainer.global_rank}-epoch{trainer.current_epoch}.json"
        path.write_text(json.dumps(indices))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(tmp_path: Path, *extra: str) -> list[subprocess.CompletedProcess]:
    port = free_port()
    args = [
        str(Path(sys.executable).with_name("vit")), "fit", "--config", "quickstart",
        "--trainer.num_nodes", "2", "--trainer.devices", "1", "--trainer.strategy", "ddp",
        "--trainer.accelerator", "cpu", "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false",
        "--trainer.limit_val_batches", "1", "--model.model", "vit_tiny_patch4_32",
        "--model.model_overrides", json.dumps(TINY),
        "--data.num_workers", "0", "--data.batch_size", "64", "--torch_num_threads", "1",
        "--runs_dir", str(tmp_path / "runs"),
        "--trainer.callbacks+=test_multinode.RecordSamples", f"--trainer.callbacks.folder={tmp_path / 'samples'}",
        *extra,
    ]  # fmt: skip
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    # Not this test process's rank settings, nor its W&B service (earlier tests started one): each "node" is a fresh
    # job, whose rank 0 starts its own, as on a cluster.
    for variable in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "WANDB_SERVICE"):
        env.pop(variable, None)
    procs = [
        subprocess.Popen(args, env={**env, "NODE_RANK": str(r)}, cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for r in (0, 1)
    ]  # fmt: skip
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=600), *p.communicate()) for p in procs]


@pytest.mark.slow
def test_two_nodes_share_one_run_folder_and_see_every_sample_once(tmp_path):
    done = two_nodes(tmp_path)
    for proc in done:
        assert proc.returncode == 0, proc.stderr[-3000:]
    runs = list((tmp_path / "runs" / "quickstart").iterdir())
    assert len(runs) == 1, runs  # not one folder per node
    run = runs[0]
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1  # one W&B run
    ranks = [json.loads((tmp_path / "samples" / f"rank{r}-epoch0.json").read_text()) for r in (0, 1)]
    n = max(ranks[0] + ranks[1]) + 1
    assert set(ranks[0]) | set(ranks[1]) == set(range(n))  # every sample, on one of the two
    assert len(ranks[0]) == len(ranks[1]) == -(-n // 2)  # equal shards: an odd count pads one repeat, as
    assert len(set(ranks[0]) & set(ranks[1])) == 2 * len(ranks[0]) - n  # DistributedSampler does, and no more

    resumed = two_nodes(tmp_path, "--ckpt_path", "last", "--trainer.max_epochs", "2")
    for proc in resumed:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"--ckpt_path last: resuming {run.relative_to(tmp_path)}" in proc.stderr or str(run) in proc.stderr
    assert list((tmp_path / "runs" / "quickstart").iterdir()) == [run]
    parts = list((run / "wandb").glob("offline-run-*"))  # offline, each part of a resumed run has its own folder
    assert len(parts) == 2 and len({p.name.rsplit("-", 1)[1] for p in parts}) == 1  # of the one W&B run id
    assert (tmp_path / "samples" / "rank1-epoch1.json").is_file()


@pytest.mark.parametrize(
    ("env", "first"),
    [
        ({}, True),
        ({"NODE_RANK": "1", "LOCAL_RANK": "0"}, False),
        ({"NODE_RANK": "0", "LOCAL_RANK": "1"}, False),
        ({"GROUP_RANK": "1"}, False),
        ({"RANK": "0", "NODE_RANK": "1"}, True),  # torchrun's global rank wins
        ({"SLURM_PROCID": "3"}, False),
    ],
)
def test_first_process_of_job(env, first, monkeypatch):
    for variable in ("RANK", "SLURM_PROCID", "NODE_RANK", "GROUP_RANK", "LOCAL_RANK"):
        monkeypatch.delenv(variable, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert first_process_of_job() is first
