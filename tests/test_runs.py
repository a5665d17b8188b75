"""Runs never overwrite each other: each fit in its own folder runs/<config>/<run name>/, named by the attention it
uses; ``--ckpt_path last`` resumes the newest run of the config in its own folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from vit.cli import cli_main

CPU = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto"]
CPU += ["--trainer.precision", "32-true", "--data.num_workers", "0", "--trainer.enable_progress_bar", "false"]
SMALL = [
    "--data.dataset",
    "synthetic",
    "--data.synthetic_size",
    "32",
    "--data.batch_size",
    "8",
    "--data.img_size",
    "16",
]
TINY_VIT = ["--model.model", "vit_tiny_patch4_32", "--model.model_overrides", "{embed_dim: 32, depth: 2, num_heads: 2}"]


pytestmark = pytest.mark.usefixtures("one_thread")


def run_args(runs: Path, *extra: str) -> list[str]:
    """A quickstart fit of the tiny model on synthetic images, its run folder chosen by the CLI under ``runs``."""
    base = ["fit", "--config", "quickstart", *SMALL, *TINY_VIT, "--trainer.logger", "false", *CPU]
    return [*base, "--runs_dir", str(runs), *extra]


@pytest.mark.slow
def test_two_fits_keep_two_runs_and_last_continues_the_newer(tmp_path, capsys):
    first = cli_main(run_args(tmp_path, "--trainer.max_epochs", "1"))
    second = cli_main(run_args(tmp_path, "--trainer.max_epochs", "2"))
    folders = sorted((tmp_path / "quickstart").iterdir())
    assert len(folders) == 2 and {Path(first.trainer.default_root_dir), Path(second.trainer.default_root_dir)} == set(
        folders
    )
    for cli, epochs in ((first, 1), (second, 2)):
        folder = Path(cli.trainer.default_root_dir)
        assert folder.name.startswith("quickstart-vit_tiny_patch4_32-global-synthetic-")  # window_size 0: global
        assert (folder / "config.yaml").is_file()
        assert ckpt(folder / "checkpoints" / "last.ckpt")["epoch"] == epochs - 1  # each run keeps its own
    out = capsys.readouterr().out
    assert "val/acc: best " in out and "last checkpoint: " in out and "Run folder: " in out  # the end-of-fit report

    os.utime(Path(first.trainer.default_root_dir) / "checkpoints" / "last.ckpt", (1, 1))  # the second is newer
    third = cli_main(run_args(tmp_path, "--trainer.max_epochs", "3", "--ckpt_path", "last"))
    newer = Path(second.trainer.default_root_dir)
    assert Path(third.trainer.default_root_dir) == newer and len(list((tmp_path / "quickstart").iterdir())) == 2
    assert Path(third.trainer.ckpt_path) == newer / "checkpoints" / "last.ckpt"
    err = capsys.readouterr().err
    assert f"--ckpt_path last: resuming {newer / 'checkpoints' / 'last.ckpt'}" in err
    # where it continues: the second run's 2 epochs of 4 steps (32 images, batches of 8) are done, epoch 2 is next
    assert f"resuming from {newer / 'checkpoints' / 'last.ckpt'}: step 8, epoch 2\n" in err
    assert third.trainer.global_step == 12 and ckpt(newer / "checkpoints" / "last.ckpt")["epoch"] == 2
    assert ckpt(Path(first.trainer.default_root_dir) / "checkpoints" / "last.ckpt")["epoch"] == 0  # untouched
    fourth = cli_main(run_args(tmp_path, "--trainer.max_epochs", "4", "--ckpt_path", str(newer)))  # a run folder
    assert Path(fourth.trainer.default_root_dir) == newer and len(list((tmp_path / "quickstart").iterdir())) == 2
    assert fourth.trainer.global_step == 16 == ckpt(newer / "checkpoints" / "last.ckpt")["global_step"]  # in place


def test_window_sliding_and_linear_runs_are_named_by_their_attention():
    from vit.runs import attention_kind

    assert attention_kind({"model": {"model": "vit_tiny_patch4_32"}}) == "global"
    assert attention_kind({"model": {"model": "vit_tiny_window_patch4_32"}}) == "window"
    overrides = {"window_size": 0}
    assert attention_kind({"model": {"model": "vit_tiny_window_patch4_32", "model_overrides": overrides}}) == "global"
    net = {"class_path": "vit.VisionTransformer", "init_args": {"window_size": 3, "window_type": "sliding"}}
    assert attention_kind({"model": {"model": net}}) == "sliding"
    assert attention_kind({"model": {"model": "vit_tiny_linear_patch4_32"}}) == "linear"
    overrides = {"linear_attention": True, "global_pool": "map"}
    assert attention_kind({"model": {"model": "vit_tiny_patch4_32", "model_overrides": overrides}}) == "linear"


def test_a_timm_model_run_is_named_by_timms_name_and_family():
    from vit.runs import attention_kind, model_name

    config = {"model": {"model": "timm:resnet18"}}
    assert (model_name(config), attention_kind(config)) == ("resnet18", "timm")  # no ':' in the run folder's name


def test_attention_of_settings_is_the_kind_of_the_models_local_blocks():
    from vit.runs import attention_of

    assert attention_of({}) == "global"
    assert attention_of({"window_size": 4, "global_attn_indexes": (2,)}) == "window"
    assert attention_of({"window_size": 4, "depth": 2, "global_attn_indexes": (0, 1)}) == "global"  # no local block
    assert attention_of({"window_size": 3, "window_type": "sliding", "linear_attention": None}) == "sliding"
    assert attention_of({"linear_attention": True, "depth": 3, "global_attn_indexes": [0, 2]}) == "linear"


def ckpt(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def test_last_without_any_run_starts_a_new_one(tmp_path, capsys):
    cli = cli_main(run_args(tmp_path, "--trainer.max_steps", "1", "--ckpt_path", "last"))
    assert "--ckpt_path last: no last.ckpt of this config yet, starting a new run" in capsys.readouterr().err
    assert cli.trainer.ckpt_path is None and Path(cli.trainer.default_root_dir).parent == tmp_path / "quickstart"


def test_a_run_that_fails_before_writing_leaves_no_folder(tmp_path, capsys):
    (tmp_path / "quickstart").mkdir()  # as an earlier run of this config leaves it
    with pytest.raises(SystemExit) as exit_info:
        cli_main(run_args(tmp_path, "--model.model_overrides", "{depth: 2, global_attn_indexes: [5]}"))
    assert exit_info.value.code == 2 and "global_attn_indexes" in capsys.readouterr().err
    assert list((tmp_path / "quickstart").iterdir()) == []  # the config's folder existed before: it stays
    with pytest.raises(SystemExit):  # the first run of a config: its folder and a new runs folder go too
        cli_main(run_args(tmp_path / "new", "--model.model_overrides", "{depth: 2, global_attn_indexes: [5]}"))
    assert not (tmp_path / "new").exists()


def test_evaluating_last_writes_below_the_run_and_leaves_its_files_alone(tmp_path):
    fit = cli_main(run_args(tmp_path, "--trainer.max_epochs", "1"))
    run = Path(fit.trainer.default_root_dir)
    config_before = (run / "config.yaml").read_bytes()
    last_before = (run / "checkpoints" / "last.ckpt").read_bytes()
    args = run_args(tmp_path, "--ckpt_path", "last")
    validate = cli_main(["validate", *args[1:]])
    folder = Path(validate.trainer.default_root_dir)
    assert folder.parent == run and folder.name.startswith("validate-")  # below the run, its own folder
    assert validate.trainer.ckpt_path == str(run / "checkpoints" / "last.ckpt")
    assert (run / "config.yaml").read_bytes() == config_before  # the fit's files are untouched
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == last_before
    best = next(p for p in (run / "checkpoints").iterdir() if p.name.startswith("epoch000-acc"))
    for name, expected in (("best", best), (str(run), run / "checkpoints" / "last.ckpt")):  # the other forms
        args = run_args(tmp_path, "--ckpt_path", name)
        assert cli_main(["validate", *args[1:]]).trainer.ckpt_path == str(expected)


def test_evaluating_last_without_any_run_is_one_error(tmp_path, capsys):
    args = run_args(tmp_path, "--ckpt_path", "last")
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["validate", *args[1:]])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: --ckpt_path last: no last.ckpt of config 'quickstart'" in err and "Traceback" not in err


def test_the_end_of_fit_names_checkpoints_as_the_user_types_them(tmp_path, monkeypatch):
    """Lightning records checkpoints by absolute path; the summary shows them relative to the current folder, as the
    README does, and a path outside it as it is."""
    from vit.callbacks.run_summary import shown_path

    monkeypatch.chdir(tmp_path)
    inside = tmp_path / "runs" / "q" / "checkpoints" / "last.ckpt"
    assert shown_path(inside) == str(Path("runs/q/checkpoints/last.ckpt"))
    assert shown_path("/elsewhere/last.ckpt") == "/elsewhere/last.ckpt"
