"""The command line: every config runs, config lookup and stacking, checkpoints and resuming, W&B offline, and error
messages. Training itself (DDP on CPU, the quickstart's accuracy) is in test_cli_training.py."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from cli_args import CPU, ROOT, SMALL, TINY_VIT, dirs, subprocess_env
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

import vit
from vit import ImageDataModule, VisionTransformer, create_model
from vit.callbacks import NonFiniteGuard, PredictionWriter, ResumeCheckpoint, RunSummary
from vit.cli import cli_main, resolve_config_args
from vit.lit_module import ImageClassifier

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


pytestmark = pytest.mark.usefixtures("one_thread")  # as quickstart.yaml's torch_num_threads sets


# ------------------------------------------------------------------------------------------------ every config
@pytest.fixture(scope="module")
def vit_small_weights(tmp_path_factory) -> Path:
    """A ViT-S/16 ImageNet-shaped state dict (224 px, 1000 classes), as a downloaded timm file would be."""
    from safetensors.torch import save_file

    path = tmp_path_factory.mktemp("weights") / "vit_small_patch16_224.safetensors"
    save_file(create_model("vit_small_patch16_224").state_dict(), str(path))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_runs_fast_dev_run_on_cpu(config, tmp_path, vit_small_weights):
    text = config.read_text()
    assert text.startswith("#") and "python scripts/fit.py --config" in text.split("\n\n")[0] + text[:600]
    assert "Expected:" in text[:1500] and "Hardware:" in text[:1500]
    args = ["fit", "--config", config.name, "--trainer.fast_dev_run", "true", "--trainer.logger", "false"]
    args += ["--data.dataset", "synthetic", "--data.batch_size", "4", "--data.img_size", "32", *CPU, *dirs(tmp_path)]
    model = yaml.safe_load(text)["model"]
    if model.get("pretrained"):
        args += ["--model.pretrained", str(vit_small_weights)]
    if model.get("compile"):
        args += ["--model.compile", "false"]  # a CPU inductor compile takes minutes; test_compile.py covers it
    if model.get("basic_augment_epochs"):
        args += ["--model.basic_augment_epochs", "0"]  # it switches images decoded once, which synthetic data is not
    cli = cli_main(args)
    metrics = cli.trainer.callback_metrics
    assert cli.trainer.state.finished and cli.trainer.global_step == 1
    assert torch.isfinite(metrics["train/loss_epoch"]) and 0.0 <= metrics["val/acc"] <= 1.0
    assert cli.model.num_classes == cli.datamodule.num_classes == 10  # linked from the data


# -------------------------------------------------------------------------------------------- config handling
def test_bare_config_name_is_found_in_configs():
    quickstart = str(ROOT / "configs" / "quickstart.yaml")
    for name in ("quickstart", "quickstart.yaml"):
        resolved = resolve_config_args(["fit", "--config", name, "-c", name, f"--config={name}"])
        assert Path(resolved[2]).resolve() == Path(resolved[4]).resolve() == Path(quickstart).resolve()
        assert Path(resolved[5].split("=", 1)[1]).resolve() == Path(quickstart).resolve()
    assert resolve_config_args(["fit", "--config", quickstart]) == ["fit", "--config", quickstart]


def test_unknown_config_name_lists_the_known_ones(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", "no_such_config"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "no_such_config" in err and "quickstart.yaml" in err and "vit_small.yaml" in err


@pytest.mark.parametrize(
    ("name", "meant"),
    [("quickstrat", "quickstart"), ("vit_small_windows.yaml", "vit_small_window"), ("no_such_config", None)],
)
def test_a_mistyped_config_name_suggests_the_config(name, meant, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", name])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: config file {name!r} not found")
    assert (f"(did you mean {meant}?)" in err) if meant else "did you mean" not in err


def test_print_config_with_stacked_configs_and_dotted_overrides(tmp_path, capsys):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("model:\n  lr: 0.01\ndata:\n  batch_size: 8\n")
    second.write_text("model:\n  lr: 0.02\n")
    args = ["fit", "--config", "quickstart", "--config", str(first), "--config", str(second)]
    with pytest.raises(SystemExit) as exit_info:
        cli_main([*args, "--data.batch_size", "16", "--print_config"])
    assert exit_info.value.code == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["model"]["lr"] == 0.02  # the later file wins
    assert config["data"]["batch_size"] == 16  # the command line wins over files
    assert config["data"]["dataset"] == "digits" and config["model"]["model_overrides"]["window_size"] == 2
    assert config["checkpoint"]["monitor"] == "val/acc" and config["checkpoint"]["save_last"] is True


@pytest.mark.slow
def test_console_script_exits_zero():
    vit = Path(sys.executable).with_name("vit")  # installed by `pip install -e .` from pyproject's [project.scripts]
    done = subprocess.run(
        [str(vit), "fit", "--config", "quickstart", "--print_config"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert yaml.safe_load(done.stdout)["data"]["dataset"] == "digits"


@pytest.mark.parametrize(
    "bad, culprit",
    [
        (["--model.not_a_key", "1"], "not_a_key"),
        (["--model.lr", "fast"], "lr"),
        (["--data.dataset", "cifar11"], "dataset"),
        (["--trainer.max_epochs", "many"], "max_epochs"),
    ],
)
def test_bad_argument_names_the_key_and_exits(bad, culprit, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", "quickstart", *bad])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert culprit in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")  # no usage dump
    assert f"'{bad[1]}'" in err and "on the command line" in err  # the value, and where it came from


@pytest.mark.parametrize(
    "typo, meant",
    [
        ("--trainer.max_epoch", "trainer.max_epochs"),
        ("--model.l", "model.lr"),
        ("--no_such_setting", None),
        ("--data.batch", "data.batch_size"),
    ],
)
def test_a_prefix_of_an_option_is_an_error_never_that_option(typo, meant, capsys):
    # argparse's prefix matching would take --trainer.max_epoch for --trainer.max_epochs and print max_epochs: 1.
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", "quickstart", typo, "1", "--print_config"])
    out = capsys.readouterr()
    assert exit_info.value.code == 2 and out.out == ""
    assert out.err.startswith(f"error: unknown option {typo[2:]} on the command line") and out.err.count("\n") == 1
    assert (f"(did you mean {meant}?)" in out.err) if meant else "did you mean" not in out.err


@pytest.mark.parametrize(
    "bad, culprit",
    [
        (["--model.model", "vit_huge_patch1_1"], "vit_huge_patch1_1"),
        (["--model.model_overrides", "{depthh: 3}"], "depthh"),
    ],
)
def test_bad_model_setting_is_one_message(bad, culprit, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", "quickstart", *bad])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model.model") and culprit in err


@pytest.mark.parametrize(
    "bad, message",
    [
        (["--trainer.max_epochs", "-1"], "error: the cosine schedule needs a length, but trainer.max_epochs is -1 and"),
        (
            ["--model.model_overrides", "{window_size: 0, patch_drop_rate: 0.5}", "--model.unmasked_epochs", "1"]
            + ["--trainer.max_epochs", "-1", "--trainer.max_steps", "5"],
            "error: model.unmasked_epochs 1 counts back from trainer.max_epochs, which is -1: set trainer.max_epochs",
        ),
        (
            ["--model.basic_augment_epochs", "2", "--data.augment", "none"],
            "error: model.basic_augment_epochs 2 switches data.augment strong to basic for the last epochs of images "
            "decoded once and augmented in batches, but data.augment is none: set data.augment strong",
        ),
        (
            ["--model.basic_augment_epochs", "2", "--data.augment", "strong", "--data.decode_once", "true"]
            + ["--trainer.max_epochs", "-1", "--trainer.max_steps", "5"],
            "error: model.basic_augment_epochs 2 counts back from trainer.max_epochs, which is -1",
        ),
    ],
)
def test_training_length_the_schedule_cannot_use_is_refused_before_the_run_starts(bad, message, tmp_path, capsys):
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", "quickstart", "--runs_dir", str(runs), *bad])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.strip().splitlines()) == 1
    assert not any(path.is_file() for path in runs.rglob("*"))  # no config, no W&B run, no checkpoint


@pytest.mark.parametrize(
    "config, asks",
    [
        ("vit_small", "(trainer.accelerator auto with trainer.precision bf16-mixed)"),
        ("vit_small_imagenet", "(trainer.accelerator auto with trainer.precision bf16-mixed)"),
        ("cifar10_speedrun", "(trainer.accelerator gpu)"),
    ],
)
def test_a_gpu_recipe_without_a_gpu_is_refused_naming_the_cpu_configs(config, asks, tmp_path, monkeypatch, capsys):
    from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator

    for accelerator in (CUDAAccelerator, MPSAccelerator):
        monkeypatch.setattr(accelerator, "is_available", staticmethod(lambda: False))
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", config, "--runs_dir", str(tmp_path / "runs"), "--data.dataset", "synthetic"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: ") and f"configs/{config}.yaml is a GPU recipe {asks} and no GPU was found: " in err
    assert "(--config cifar10_cpu, --config quickstart)" in err and "--trainer.accelerator cpu" in err
    assert not (tmp_path / "runs").exists()


def test_a_gpu_recipe_runs_on_the_cpu_when_the_command_line_says_so(tmp_path, monkeypatch):
    from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator

    for accelerator in (CUDAAccelerator, MPSAccelerator):
        monkeypatch.setattr(accelerator, "is_available", staticmethod(lambda: False))
    args = ["fit", "--config", "vit_small", *SMALL, *TINY_VIT, "--trainer.fast_dev_run", "true"]
    args += ["--trainer.accelerator", "cpu", "--trainer.logger", "false", "--data.num_workers", "0"]
    cli = cli_main([*args, "--trainer.enable_progress_bar", "false", *dirs(tmp_path)])
    assert cli.trainer.global_step == 1 and cli.trainer.accelerator.__class__.__name__ == "CPUAccelerator"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("model:\n  lrr: 0.1\n", "error: unknown option model.lrr in {file} (value 0.1) (did you mean model.lr?)"),
        (
            "trainer: {max_epoch: 3}\n",
            "error: unknown option trainer.max_epoch in {file} (value 3) (did you mean "
            "trainer.max_epochs?); `vit fit --help` lists the options",
        ),
        ("modle:\n  lr: 0.1\n", "error: unknown option modle.lr in {file} (value 0.1) (did you mean model.lr?)"),
        ("modle:\n  foo: 1\n", "error: unknown option modle.foo in {file} (value 1) (did you mean model?)"),
        ("model:\n  lr: fast\n", "error: bad value for model.lr in {file}: expected float, got 'fast'"),
        ("trainer:\n  max_epochs: many\n", "error: bad value for trainer.max_epochs in {file}: expected one of int"),
    ],
)
@pytest.mark.parametrize("extra", [[], ["--print_config"]])
def test_bad_key_in_config_file_names_the_file(text, expected, extra, tmp_path, capsys):
    """A typo in a YAML key gets the closest key, as one on the command line does (jsonargparse reports either with
    the parser of the whole command line, or of the subcommand under --print_config)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", "quickstart", "--config", str(bad), "--runs_dir", str(tmp_path / "runs"), *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(expected.format(file=bad)) and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and "usage" not in err
    assert not (tmp_path / "runs").exists()


def test_help_is_small_and_lists_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert len(text.encode()) < 42_000  # was 141 KB: every nn.Module subclass listed for model.model
    sections = {
        "trainer": Trainer,
        "model": ImageClassifier,
        "data": ImageDataModule,
        "checkpoint": ModelCheckpoint,
        "resume": ResumeCheckpoint,
        "nonfinite": NonFiniteGuard,
        "run_summary": RunSummary,
        "predictions": PredictionWriter,
    }
    listed = set(re.findall(r"\n  (--[\w.]+)", text))
    for section, cls in sections.items():
        for name in inspect.signature(cls.__init__).parameters:
            if (
                name not in ("self", "args", "kwargs")
                and not name.startswith("_")
                and not (section == "model" and name in ("num_classes", "img_size"))
            ):
                assert f"--{section}.{name}" in listed, f"--{section}.{name}"  # (num_classes, img_size: linked)
    for option in ("--runs_dir", "--ckpt_path", "--torch_num_threads", "--keep_freed_memory", "--seed_everything"):
        assert option in listed
    assert "torch.nn.Identity" not in text and "known subclasses" not in text


def test_help_after_config_shows_the_configs_values_as_defaults(capsys):
    """The --config files before --help set the defaults shown; without one, the code's defaults."""
    config = Path(vit.__file__).resolve().parents[1] / "configs" / "cifar10_cpu.yaml"
    values = yaml.safe_load(config.read_text())
    shown = {}
    for argv in (["fit", "--help"], ["fit", "--config", "cifar10_cpu", "--help"]):
        with pytest.raises(SystemExit):
            cli_main(argv)
        text = " ".join(capsys.readouterr().out.split())
        shown[len(argv)] = {key: re.search(rf"--{key} \S+ .*?default: ([^)]*)\)", text).group(1)
                            for key in ("model.lr", "data.batch_size", "trainer.max_epochs")}  # fmt: skip
    lr = inspect.signature(ImageClassifier.__init__).parameters["lr"].default
    assert shown[2]["model.lr"] == str(lr) and float(shown[4]["model.lr"]) == values["model"]["lr"] != lr
    assert int(shown[4]["data.batch_size"]) == values["data"]["batch_size"]
    assert shown[2]["trainer.max_epochs"] == "null" and int(shown[4]["trainer.max_epochs"]) == -1
    assert values["trainer"]["max_epochs"] == -1


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_epochs: 3\n  devices: [1, 2\nmodel:\n  lr: 0.1\n")
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", "quickstart", "--config", str(bad), "--runs_dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f'error: config file {bad} is not valid YAML: while parsing a flow sequence in "{bad}", '
                          "line 3, column 12")  # fmt: skip
    assert "<unicode string>" not in err and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("keep", [True, False])
def test_keep_freed_memory_is_set_before_the_run_only_when_asked(keep, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr("vit.cli.keep_freed_memory", lambda: calls.append("kept") or True)
    args = ["fit", "--config", "quickstart", "--trainer.fast_dev_run", "true", "--trainer.logger", "false"]
    args += [*SMALL, *TINY_VIT, *CPU, *dirs(tmp_path), "--torch_num_threads", "1"]
    cli = cli_main(args + (["--keep_freed_memory", "true"] if keep else []))
    assert cli.trainer.state.finished
    assert calls == (["kept"] if keep else [])


@pytest.mark.parametrize("kind", ["text", "random", "empty", "truncated"])
def test_a_file_that_is_not_a_checkpoint_is_one_line(kind, tmp_path, capsys):
    path = tmp_path / f"{kind}.ckpt"
    good = tmp_path / "good.ckpt"
    torch.save({"state_dict": {"w": torch.ones(1000)}}, good)
    content = {
        "text": b"these are my notes, not a checkpoint\n" * 20,
        "random": bytes(torch.randint(0, 256, (4000,), generator=torch.Generator().manual_seed(0)).tolist()),
        "empty": b"",
        "truncated": good.read_bytes()[:-500],
    }[kind]
    path.write_bytes(content)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(
            ["fit", *SMALL, *TINY_VIT, "--trainer.logger", "false", *CPU, *dirs(tmp_path), "--ckpt_path", str(path)]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path} is not a PyTorch checkpoint (") and len(err.strip().splitlines()) == 1
    assert "unsafe" not in err and "arbitrary code" not in err and "Traceback" not in err


def test_missing_data_dir_is_one_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", "vit_small_imagenet", "--data.data_dir", str(tmp_path / "nowhere"), *CPU])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nowhere" in err and "does not exist" in err


@pytest.mark.slow
def test_absent_cifar_stops_without_stack_dump(tmp_path):
    (tmp_path / "empty").mkdir()
    cmd = [sys.executable, str(ROOT / "scripts" / "fit.py"), "--config", "vit_small", "--data.download", "false"]
    cmd += ["--data.data_dir", str(tmp_path / "empty"), "--trainer.logger", "false", *CPU, *dirs(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "cifar10 not found" in done.stderr and "--data.download true" in done.stderr
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------------------------ checkpoints and loading
def test_class_path_model_trains_and_loads_from_checkpoint(tmp_path):
    net = {
        "class_path": "vit.VisionTransformer",
        "init_args": {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 3},
    }
    args = ["fit", "--model.model", json.dumps(net), *SMALL, "--trainer.max_epochs", "1", "--trainer.logger", "false"]
    cli = cli_main([*args, *CPU, *dirs(tmp_path)])
    assert isinstance(cli.model.model, VisionTransformer) and cli.model.model.head.out_features == 10  # linked

    checkpoints = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert len(checkpoints) == 2 and "last.ckpt" in checkpoints and checkpoints[0].startswith("epoch000-acc")
    loaded = ImageClassifier.load_from_checkpoint(tmp_path / "ckpt" / "last.ckpt")
    assert isinstance(loaded.model, VisionTransformer) and len(loaded.model.blocks) == 2
    assert loaded.model.head.out_features == 10
    for key, value in cli.model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value)
    standalone = vit.load(tmp_path / "ckpt" / "last.ckpt")  # the arguments of the class_path model, recorded
    assert standalone.patch_embed.img_size == (16, 16) and standalone.embed_dim == 32 and len(standalone.blocks) == 2
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(standalone(x), loaded.eval_model.eval()(x))


def test_ckpt_path_last_resumes(tmp_path, caplog):
    base = ["fit", *SMALL, *TINY_VIT, "--trainer.logger", "false", *CPU, *dirs(tmp_path)]
    first = cli_main([*base, "--trainer.max_epochs", "1"])
    assert first.trainer.global_step == 4
    second = cli_main([*base, "--trainer.max_epochs", "2", "--ckpt_path", "last"])
    assert Path(second.trainer.ckpt_path) == tmp_path / "ckpt" / "last.ckpt"
    assert second.trainer.global_step == 8 and second.trainer.current_epoch == 2
    assert any("Restoring states from the checkpoint" in r.getMessage() for r in caplog.records)
    loaded = ImageClassifier.load_from_checkpoint(second.trainer.checkpoint_callback.last_model_path)
    assert loaded.hparams.model == "vit_tiny_patch4_32" and loaded.hparams.img_size == 16
    assert loaded.num_classes == 10 and len(loaded.model.blocks) == 2


def test_checkpointing_can_be_switched_off(tmp_path):
    args = ["fit", *SMALL, *TINY_VIT, "--trainer.max_steps", "1", "--trainer.enable_checkpointing", "false"]
    cli = cli_main([*args, "--trainer.logger", "false", *CPU, *dirs(tmp_path)])
    assert cli.trainer.global_step == 1 and cli.trainer.checkpoint_callback is None
    assert not (tmp_path / "ckpt").exists()


def test_wandb_logs_offline_without_credentials(tmp_path, monkeypatch, caplog):
    import wandb

    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    args = ["fit", "--config", "quickstart", *SMALL, *TINY_VIT, "--trainer.max_epochs", "1", *CPU, *dirs(tmp_path)]
    try:
        cli = cli_main([*args, "--trainer.logger.init_args.save_dir", str(tmp_path)])
        assert cli.trainer.logger.experiment.settings.mode == "offline"
    finally:
        wandb.finish()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb"))
    assert any("wandb sync" in r.getMessage() and "offline" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "ckpt" / "last.ckpt").exists()
