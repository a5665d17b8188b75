"""W&B offline runs through the CLI, read back with wandb's own tool: rollout panel, attention metrics, nested config,
names/groups/tags, summaries, each run in its own folder (vit.compare has its tests in test_scripts.py); an unreachable
W&B server makes a run log offline at once."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

from vit import loggers
from vit.loggers import wandb_reachable

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--trainer.max_epochs=2",
    "--trainer.limit_train_batches=3",
    "--trainer.limit_val_batches=1",
    "--trainer.enable_progress_bar=false",
    "--model.model_overrides.embed_dim=32",
    "--model.model_overrides.num_heads=2",
    "--model.model_overrides.depth=2",
    "--model.model_overrides.global_attn_indexes=[1]",
]
VARIANTS = {  # two runs that differ in the attention pattern and the learning rate
    "window": ["--model.lr=0.002"],
    "global": ["--model.lr=0.001", "--model.model_overrides.window_size=0"],
}


def inspect(run_dir: Path, *flags: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", *flags, str(run_dir)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def offline_runs(tmp_path_factory) -> dict[str, Path]:
    """Two short offline quickstart fits (tiny model, 2 epochs of 3 batches), in this process, each in its own run
    folder ``<root>/quickstart/<run name>/`` chosen by the CLI; their W&B run folders."""
    from vit.cli import cli_main

    root = tmp_path_factory.mktemp("runs")
    runs = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_DIR", str(root))
        mp.chdir(root)
        for name, extra in VARIANTS.items():
            cli = cli_main(
                ["fit", "--config", str(ROOT / "configs" / "quickstart.yaml"), f"--runs_dir={root}", *TINY, *extra]
            )
            cli.trainer.logger.experiment.finish()  # close the run file, as the end of the process would
            folder = Path(cli.trainer.default_root_dir)
            assert folder.parent == root / "quickstart" and folder.name == cli.trainer.logger.experiment.name
            assert f"-{name}-digits-" in folder.name  # the attention actually used
            assert (folder / "checkpoints" / "last.ckpt").is_file() and (folder / "config.yaml").is_file()
            (run,) = (folder / "wandb").glob("offline-run-*")
            runs[name] = run
    return runs


@pytest.fixture(scope="module")
def window_run(offline_runs) -> tuple[dict, list[dict]]:
    """``(state, records)`` of the window run: ``wandb leet inspect --summary --json`` and ``--json``."""
    run = offline_runs["window"]
    state = json.loads(inspect(run, "--summary", "--json"))
    records = [json.loads(line) for line in inspect(run, "--json").splitlines() if line.strip()]
    return state, records


def media(history: list[dict], key: str) -> list[dict]:
    """The image entries logged under ``key`` (the records spell their fields ``key._type``, ``key.count``...)."""
    prefix = f"{key}."
    return [
        {k[len(prefix) :]: v for k, v in row.items() if k.startswith(prefix)}
        for row in history
        if f"{prefix}_type" in row
    ]


@pytest.mark.slow
def test_run_has_the_rollout_panel_and_attention_metrics(offline_runs, window_run):
    state, records = window_run
    assert state["state"] == "finished" and state["exit_code"] == 0
    history = [r["history"]["item"] for r in records if r["type"] == "history"]

    panels = media(history, "val/attention_rollout")
    assert len(panels) == 2  # one per epoch
    for panel in panels:
        assert panel["_type"] == "images/separated" and panel["count"] == 8
        assert len(panel["captions"]) == 8
        for caption in panel["captions"]:  # "true 3 · pred 5 (12 %)"
            assert re.fullmatch(r"true \d · pred \d \(\d+ %\)", caption), caption
        for file in panel["filenames"]:
            with Image.open(offline_runs["window"] / "files" / file) as image:
                assert image.width > image.height >= 128  # image | rollout overlay side by side, readable size
    grids = media(history, "val/attention_rollout_grid")
    assert len(grids) == 2 and grids[0]["count"] == 1  # the captioned grid beside the per-image panels
    # The same grid as a PNG in the run folder, with W&B on.
    run_folder = offline_runs["window"].parent.parent
    assert sorted(p.name for p in (run_folder / "rollout").glob("epoch_*.png")) == ["epoch_000.png", "epoch_001.png"]
    plots = media(history, "val/attention_distance")
    assert len(plots) == 2 and plots[0]["count"] == 1

    metrics = [row for row in history if "attn/entropy/block_0" in row]
    assert len(metrics) == 2
    # Logged with the validation metrics, and the panels at the same step.
    panel_steps = [row["trainer/global_step"] for row in history if "val/attention_rollout._type" in row]
    assert [row["trainer/global_step"] for row in metrics] == panel_steps
    for row in metrics:
        assert "val/acc" in row
        for block in (0, 1):
            # 2x2 windows without a class token: at most 4 keys per query in block 0, all 16 in global block 1.
            assert 0 < row[f"attn/entropy/block_{block}"] <= [1.3863, 2.7726][block] + 1e-4
            assert 0 < row[f"attn/distance/block_{block}"] < 16 * 2**0.5


@pytest.mark.slow
def test_run_config_is_nested_and_runs_are_named_grouped_and_tagged(window_run):
    state, records = window_run
    config = state["config"]
    assert config["model"]["model"] == "vit_tiny_window_patch4_32"
    assert config["model"]["lr"] == 0.002 and config["model"]["model_overrides"]["depth"] == 2
    assert config["data"]["dataset"] == "digits" and config["data"]["img_size"] == 16
    assert config["trainer"]["max_epochs"] == 2
    assert any(cb["class_path"].endswith("ExplanationLogger") for cb in config["trainer"]["callbacks"])
    assert "lr" not in config and "dataset" not in config  # no flat copies of the module's hyper-parameters

    assert state["name"].startswith("quickstart-vit_tiny_window_patch4_32-window-digits-")
    assert set(state["tags"]) >= {"window", "digits"}
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    assert run["run_group"] == "quickstart"
    metric = {r["metric"]["name"]: r["metric"] for r in records if r["type"] == "metric" and "name" in r["metric"]}
    assert metric["val/acc"]["summary"] == {"max": True}

    summary = state["summary"]
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    accuracies = [row["val/acc"] for row in history if "val/acc" in row]
    assert summary["val/acc"] == {"max": max(accuracies)}
    assert summary["model/params"] > 0 and summary["model/gflops"] == pytest.approx(2 * summary["model/gmacs"])
    assert summary["train/img_per_sec"] > 0  # the mean of the module's train/img_per_sec over the fit


def test_lightning_still_passes_anonymous(tmp_path):
    """vit.loggers.without_anonymous_setting removes WandbLogger._wandb_init["anonymous"] (None), for which wandb
    warns at every start; if Lightning stops passing it (or renames the dict) the workaround can go."""
    from types import SimpleNamespace

    from lightning.pytorch.loggers import WandbLogger

    from vit.loggers import without_anonymous_setting

    logger = WandbLogger(save_dir=str(tmp_path), offline=True)
    assert "anonymous" in logger._wandb_init and logger._wandb_init["anonymous"] is None
    without_anonymous_setting(SimpleNamespace(loggers=[logger]))
    assert "anonymous" not in logger._wandb_init


@pytest.mark.slow
def test_vit_test_ends_with_its_wandb_folder_and_sync_command(offline_runs, tmp_path, monkeypatch, capsys):
    """The start of an offline run promises the `wandb sync` command at its end: `vit test` keeps the promise."""
    from vit.cli import cli_main

    run = offline_runs["window"].parent.parent  # the fit's run folder: --ckpt_path takes it
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    argv = ["test", "--config", str(ROOT / "configs" / "quickstart.yaml"), f"--runs_dir={run.parent.parent}", *TINY]
    cli = cli_main([*argv, "--trainer.limit_test_batches=1", f"--ckpt_path={run}"])
    cli.trainer.logger.experiment.finish()
    (folder,) = Path(cli.trainer.default_root_dir, "wandb").glob("offline-run-*")
    page = Path(cli.trainer.default_root_dir, "evaluation.html")
    # the last lines, after the evaluation's table: the page a person opens, then the W&B run and its upload
    assert capsys.readouterr().out.splitlines()[-2:] == [
        f"evaluation: {page}  (open in a browser; evaluation.json, confusion_matrix.png, reliability.png beside it)",
        f"W&B run: {folder}  (upload: wandb sync {folder})",
    ]


def test_the_sync_command_of_a_resumed_offline_run_uploads_every_part(tmp_path, monkeypatch):
    """Offline, each resume writes one more offline-run-<time>-<id> folder: one command uploads them all, which
    `wandb sync` joins into one run."""
    from vit.callbacks import run_summary

    wandb_dir = tmp_path / "wandb"
    names = [
        "offline-run-20261205_080000-abc123",
        "offline-run-20261205_090000-abc123",
        "offline-run-20261205_070000-zz9",
    ]
    for name in names:
        (wandb_dir / name).mkdir(parents=True)
    resumed, alone = wandb_dir / names[1], wandb_dir / names[2]
    monkeypatch.setattr(run_summary, "wandb_run_folders", lambda trainer: [(resumed, True), (alone, True)])
    pattern = "offline-run-*-abc123"
    assert run_summary.wandb_lines(None) == [
        f"W&B run: {resumed} and 1 earlier part of this resumed run  (upload: wandb sync {wandb_dir}/{pattern})",
        f"W&B run: {alone}  (upload: wandb sync {alone})",
    ]
    assert sorted(p.name for p in wandb_dir.glob(pattern)) == names[:2]  # the shell's expansion: both parts


# ------------------------------------------------------------------------------------- an unreachable server
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: connections are refused


def test_wandb_probe_answers_loopback_and_gives_up_after_its_timeout(monkeypatch):
    assert not wandb_reachable(f"http://127.0.0.1:{_closed_port()}", timeout=2.0)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert wandb_reachable(f"http://127.0.0.1:{server.getsockname()[1]}", timeout=30.0)  # returns once connected
    release, calls = threading.Event(), []

    def hanging(address, timeout):  # a name lookup that answers only when released (getaddrinfo has no timeout)
        calls.append((address, timeout))
        release.wait(60)
        return SimpleNamespace(close=lambda: None)

    monkeypatch.setattr(loggers.socket, "create_connection", hanging)
    assert not wandb_reachable("http://wandb.invalid:8080", timeout=0.05)  # it did not wait for the answer
    release.set()
    assert calls == [(("wandb.invalid", 8080), 0.05)]


@pytest.mark.slow
def test_wandb_without_network_goes_offline_at_once(tmp_path, fit_args):
    # Credentials present, server unreachable, WANDB_MODE unset: without the probe wandb.init retries for 90 s and
    # then raises, failing the run.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        WANDB_API_KEY="x" * 40,
        WANDB_BASE_URL=f"http://127.0.0.1:{_closed_port()}",
        WANDB_SILENT="true",
        WANDB_DISABLE_GIT="true",
        WANDB_DIR=str(tmp_path),
        WANDB_CONFIG_DIR=str(tmp_path / "config"),
        WANDB_CACHE_DIR=str(tmp_path / "cache"),
        OMP_NUM_THREADS="1",
    )
    logger = {
        "class_path": "lightning.pytorch.loggers.WandbLogger",
        "init_args": {"project": "t", "save_dir": str(tmp_path)},
    }
    args = [a for a in fit_args(tmp_path, epochs=1) if not a.startswith("--trainer.logger")]
    args += [f"--trainer.logger={json.dumps(logger)}", "--trainer.max_steps=2"]
    code = "import sys\nfrom vit.cli import cli_main\ncli_main(sys.argv[1:])\n"
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "unreachable" in proc.stderr and "logging offline" in proc.stderr
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
