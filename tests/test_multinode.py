"""Two "nodes" of one process each on this machine (gloo), for the three ways data is read (image files through loader
workers, decoded once, streamed from shards): one run folder, one W&B run, every training sample seen once per epoch
across the two (an odd count pads one repeat so the parts are equal), and ``--ckpt_path last`` resumes both into the
same folder."""

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

from vit.data.shard_writer import prepare_shards
from vit.data.streaming import ShardLoader
from vit.runs import first_process_of_job

TINY = {"embed_dim": 16, "depth": 1, "num_heads": 2}


class RecordSamples(Callback):
    """Writes the indices of the training samples this rank draws in each epoch to ``<folder>/rank<r>-epoch<e>.json``
    (used as ``class_path: test_multinode.RecordSamples``)."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.streamed: list[int] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        loader = trainer.train_dataloader
        if isinstance(loader, ShardLoader):  # no sampler: the dataset reads each sample by its index in the split
            self.streamed = []
            dataset = loader.dataset
            if "__getitem__" not in vars(dataset):  # LitData calls self.__getitem__(ChunkedIndex) in the loop
                read = dataset.__getitem__
                dataset.__getitem__ = lambda index: self.streamed.append(int(index.index)) or read(index)
            return
        # A copy: iterating the loader's own sampler would use up the position a resumed epoch starts from.
        sampler = copy.copy(loader.sampler)
        indices = [int(item[0] if isinstance(item, tuple) else item) for item in sampler]  # (index, seed) or index
        self._write(trainer, indices)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if isinstance(trainer.train_dataloader, ShardLoader):
            self._write(trainer, self.streamed)

    def _write(self, trainer, indices: list[int]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"rank{trainer.global_rank}-epoch{trainer.current_epoch}.json"
        path.write_text(json.dumps(indices))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(tmp_path: Path, data: list[str], *extra: str) -> list[subprocess.CompletedProcess]:
    port = free_port()
    args = [
        str(Path(sys.executable).with_name("vit")), "fit", "--config", "quickstart",
        "--trainer.num_nodes", "2", "--trainer.devices", "1", "--trainer.strategy", "ddp",
        "--trainer.accelerator", "cpu", "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false",
        "--trainer.limit_val_batches", "1", "--model.model", "vit_tiny_patch4_32",
        "--model.model_overrides", json.dumps(TINY),
        "--data.num_workers", "0", "--data.batch_size", "4", "--torch_num_threads", "1", *data,
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


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory, photo_tree) -> Path:
    """21 training photographs (an odd count) in two class folders, and their shards beside them."""
    root = tmp_path_factory.mktemp("photos")
    photo_tree(root / "tree", per_class=10, big=False)
    (root / "tree" / "train" / "china" / "9.jpg").unlink()
    (root / "tree" / "val" / "china" / "4.jpg").rename(root / "tree" / "train" / "china" / "9.jpg")
    (root / "tree" / "val" / "flower" / "4.jpg").rename(root / "tree" / "train" / "flower" / "10.jpg")
    prepare_shards(dataset="imagefolder", data_dir=str(root / "tree"), out=str(root / "shards"), chunk_bytes="16kB")
    return root


DATA = {
    "files": ["--data.dataset", "imagefolder", "--data.data_dir", "{root}/tree", "--data.decode_once", "false"],
    "decoded_once": ["--data.dataset", "imagefolder", "--data.data_dir", "{root}/tree", "--data.decode_once", "true"],
    "streaming": ["--data.dataset", "streaming", "--data.data_dir", "{root}/shards", "--data.decode_once", "false"],
    "streaming_decoded_once": [
        *("--data.dataset", "streaming", "--data.data_dir", "{root}/shards", "--data.decode_once", "true")
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("path", list(DATA))
def test_two_nodes_share_one_run_folder_and_see_every_sample_once(tmp_path, photos, path):
    data = [item.format(root=photos) for item in DATA[path]]
    done = two_nodes(tmp_path, data)
    for proc in done:
        assert proc.returncode == 0, proc.stderr[-3000:]
    runs = list((tmp_path / "runs" / "quickstart").iterdir())
    assert len(runs) == 1, runs  # not one folder per node
    run = runs[0]
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1  # one W&B run
    ranks = [json.loads((tmp_path / "samples" / f"rank{r}-epoch0.json").read_text()) for r in (0, 1)]
    n, batch = 21, 4
    if path == "streaming":  # equal whole batches per rank, disjoint; the shuffled order's last 21 - 16 left out
        assert len(ranks[0]) == len(ranks[1]) == n // (2 * batch) * batch
        assert not set(ranks[0]) & set(ranks[1]) and set(ranks[0]) | set(ranks[1]) <= set(range(n))
    else:  # a sampler's parts: every sample, on one of the two, the odd count padded by one repeat, and no more
        assert set(ranks[0]) | set(ranks[1]) == set(range(n))
        assert len(ranks[0]) == len(ranks[1]) == -(-n // 2)
        assert len(set(ranks[0]) & set(ranks[1])) == 2 * len(ranks[0]) - n

    resumed = two_nodes(tmp_path, data, "--ckpt_path", "last", "--trainer.max_epochs", "2")
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
