"""Temperature scaling: the fitted temperature against a brute-force 1-D minimisation by scipy, and ``vit calibrate``'s
copy as vit.load, vit.Predictor, vit export and vit test read it."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

from vit.evaluation import fit_temperature


def _nll(logits: np.ndarray, labels: np.ndarray, temperature: float) -> float:
    return -log_softmax(logits / temperature, axis=1)[np.arange(len(labels)), labels].mean()


def _scipy_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The NLL's minimiser by bounded Brent search over T in [0.05, 20], independently of torch's L-BFGS."""
    found = minimize_scalar(lambda t: _nll(logits, labels, t), bounds=(0.05, 20.0), method="bounded",
                            options={"xatol": 1e-8})  # fmt: skip
    return float(found.x)


@pytest.mark.parametrize("scale", [0.3, 1.0, 4.0])  # under-confident, about right, over-confident logits
def test_temperature_equals_scipy_minimiser(scale):
    g = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 10, (800,), generator=g)
    logits = torch.randn(800, 10, generator=g)
    logits[torch.arange(800), labels] += 2.0
    logits *= scale
    noisy = torch.rand(800, generator=g) < 0.25  # a quarter of the labels wrong: confidence must be paid for
    labels[noisy] = torch.randint(0, 10, (int(noisy.sum()),), generator=g)
    temperature = fit_temperature(logits, labels)
    reference = _scipy_temperature(logits.double().numpy(), labels.numpy())
    assert temperature == pytest.approx(reference, rel=1e-4)
    assert (temperature > 1) == (scale > 1.5)  # over-confident logits are softened, under-confident ones sharpened


def test_fit_temperature_refuses_mismatched_inputs():
    with pytest.raises(ValueError, match="fit_temperature needs"):
        fit_temperature(torch.zeros(3, 4), torch.zeros(2, dtype=torch.long))


@pytest.fixture(scope="module")
def learned_checkpoint(tmp_path_factory, one_thread_per_module):
    """A tiny model trained 12 epochs on the digits (about 0.7 accuracy, 7 s of CPU), with label smoothing: a model
    with something to calibrate (the session's three-step checkpoint is at chance, where the NLL falls without end
    as the temperature grows)."""
    import lightning.pytorch as pl

    from vit import ImageClassifier, ImageDataModule

    torch.manual_seed(0)
    overrides = {"embed_dim": 32, "depth": 2, "num_heads": 2}
    module = ImageClassifier("vit_tiny_patch4_32", model_overrides=overrides, num_classes=10, img_size=16, lr=2e-3,
                             warmup_steps=10, label_smoothing=0.1)  # fmt: skip
    quiet = {
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    trainer = pl.Trainer(accelerator="cpu", max_epochs=12, limit_val_batches=0, **quiet)
    trainer.fit(module, ImageDataModule(dataset="digits", img_size=16, batch_size=32, num_workers=0))
    path = tmp_path_factory.mktemp("learned") / "learned.ckpt"
    trainer.save_checkpoint(path)
    return path


def _val_logits(checkpoint) -> tuple[torch.Tensor, torch.Tensor]:
    """The raw model's logits on the checkpoint's val split, through vit.load and the data module (not calibrate's
    own loop)."""
    import vit
    from vit.checkpoints import data_settings, read_checkpoint, rebuild_datamodule

    model = vit.load(checkpoint, calibrated=False)
    datamodule = rebuild_datamodule(data_settings(read_checkpoint(checkpoint)), num_workers=0)
    datamodule.setup("validate")
    batches = list(datamodule.val_dataloader())
    images = torch.cat([b[0] for b in batches])
    with torch.no_grad():
        return model(datamodule.normalize(images)), torch.cat([b[1] for b in batches])


@pytest.mark.slow
def test_vit_calibrate_writes_a_calibrated_copy(tmp_path, learned_checkpoint, capsys):
    import vit
    from vit.checkpoints import read_checkpoint
    from vit.export import export
    from vit.main import main

    before = hashlib.sha256(learned_checkpoint.read_bytes()).hexdigest()
    out = tmp_path / "calibrated.ckpt"
    argv = ["calibrate", str(learned_checkpoint), "--out", str(out), "--report_dir", str(tmp_path / "report")]
    assert main([*argv, "--progress", "false"]) == 0
    assert hashlib.sha256(learned_checkpoint.read_bytes()).hexdigest() == before  # never rewritten
    temperature = read_checkpoint(out)["vit_inference"]["temperature"]

    logits, labels = _val_logits(learned_checkpoint)
    even = slice(0, None, 2)
    assert temperature == pytest.approx(_scipy_temperature(logits[even].double().numpy(), labels[even].numpy()), 1e-4)
    report = json.loads((tmp_path / "report" / "evaluation.json").read_text())
    odd = slice(1, None, 2)
    assert report["calibration"]["reported_on"]["count"] == len(labels[odd])
    after = _nll(logits[odd].double().numpy(), labels[odd].numpy(), temperature)
    assert report["calibration"]["after"]["nll"] == pytest.approx(after, abs=1e-5)
    assert f"temperature {temperature:.4f}" in capsys.readouterr().out

    probs = torch.softmax(logits[:8].double() / temperature, -1)
    model = vit.load(out)
    assert model.pretrained_cfg["temperature"] == temperature
    images = _val_images(learned_checkpoint, 8)
    with torch.no_grad():
        assert torch.allclose(model(images).double().softmax(-1), probs, atol=1e-5)
    folder = tmp_path / "export"
    export(out, folder)
    assert json.loads((folder / "config.json").read_text())["vit"]["temperature"] == temperature
    with torch.no_grad():
        assert torch.allclose(vit.load(folder)(images).double().softmax(-1), probs, atol=1e-5)
    assert vit.Predictor(folder).temperature == temperature

    with pytest.raises(SystemExit) as exit_info:  # a second run would overwrite the copy: refused, named
        main(argv)
    assert exit_info.value.code == 2 and "exists" in capsys.readouterr().err


def _val_images(checkpoint, count: int) -> torch.Tensor:
    from vit.checkpoints import data_settings, read_checkpoint, rebuild_datamodule

    datamodule = rebuild_datamodule(data_settings(read_checkpoint(checkpoint)), num_workers=0)
    datamodule.setup("validate")
    return datamodule.normalize(next(iter(datamodule.val_dataloader()))[0][:count])


@pytest.mark.slow
def test_vit_test_scores_the_calibrated_probabilities(tmp_path, learned_checkpoint, digits_test_args):
    from vit.cli import cli_main
    from vit.main import main

    out = tmp_path / "calibrated.ckpt"
    argv = ["calibrate", "--ckpt_path", str(learned_checkpoint), "--out", str(out), "--report_dir", str(tmp_path / "r")]
    assert main(argv) == 0  # --ckpt_path, as every subcommand names a checkpoint
    cli_main(digits_test_args(out, tmp_path / "test"))
    result = json.loads((tmp_path / "test" / "evaluation.json").read_text())
    logits, labels = _val_logits(learned_checkpoint)
    temperature = result["temperature"]
    assert temperature == json.loads((tmp_path / "r" / "evaluation.json").read_text())["calibration"]["temperature"]
    assert result["nll"] == pytest.approx(_nll(logits.double().numpy(), labels.numpy(), temperature), abs=1e-5)
    assert result["accuracy"] == pytest.approx(float((logits.argmax(1) == labels).double().mean()), abs=1e-6)


def test_vit_calibrate_names_a_missing_checkpoint_as_every_subcommand_does(tmp_path, capsys):
    """No checkpoint, and ``last`` without runs: one ``error:`` line each, exit 2, the words of ``vit export``."""
    from vit.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate"])
    assert exit_info.value.code == 2 and "name the checkpoint: --ckpt_path CKPT" in capsys.readouterr().err
    words = []
    for command in ("calibrate", "export"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--ckpt_path", "last", "--runs_dir", str(tmp_path), "--out", str(tmp_path / command)])
        assert exit_info.value.code == 2
        words.append(capsys.readouterr().err)
    assert words[0] == words[1] and words[0].startswith("error:")
