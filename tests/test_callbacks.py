"""AttentionRolloutLogger on short CPU fits of a tiny ViT on the digits, with and without an offline W&B logger;
forward_flops."""

from __future__ import annotations

import csv
import math
import sys
import warnings
from functools import partial

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from PIL import Image

import vit.loggers
from vit.callbacks import AttentionRolloutLogger, explained_model, forward_flops, select_indices
from vit.explain import attention_statistics, capture_attention, explain_map, rollout_map
from vit.explain import methods as method_registry
from vit.explain.attribution import attention_attribution
from vit.explain.faithfulness import faithfulness
from vit.explain.selection import fixed_images
from vit.normalize import normalize


@pytest.fixture
def tiny_module(tiny_classifier):
    """``tiny_module(**kwargs)``: the tiny classifier at lr 3e-3, seeded, so that two fits can be compared."""
    return partial(tiny_classifier, lr=3e-3, seed=0)


@pytest.fixture
def trainer(cpu_trainer):
    """``trainer(root, callbacks, logger=False, max_epochs=1, max_steps=-1)``: three training batches and one
    validation batch per epoch, every step logged."""

    def build(root, callbacks, logger=False, max_epochs=1, max_steps=-1) -> pl.Trainer:
        return cpu_trainer(
            default_root_dir=root,
            max_epochs=max_epochs,
            max_steps=max_steps,
            limit_train_batches=3,
            limit_val_batches=1,
            callbacks=callbacks,
            logger=logger,
            log_every_n_steps=1,
        )

    return build


def read_metrics(path) -> dict[str, list[float]]:
    with open(path) as f:
        rows = list(csv.DictReader(f))
    metrics: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            if value not in ("", None):
                metrics.setdefault(key, []).append(float(value))
    return metrics


def test_select_indices_first_image_of_each_class_then_evenly_spaced():
    # Classes in order of appearance 3, 1, 0 -> first images 0, 2, 3, sorted by label (0, 1, 3).
    assert select_indices([3, 3, 1, 0, 1, 2], length=6, num_images=3) == [3, 2, 0]
    # Two classes for four images: their first images, then evenly spaced ones (linspace 0, 2, 3, 5).
    assert select_indices([0, 0, 0, 1, 1, 1], length=6, num_images=4) == [0, 3, 2, 5]
    assert select_indices(None, length=10, num_images=3) == [0, 4, 9]
    assert select_indices(None, length=2, num_images=8) == [0, 1]
    assert select_indices([5, 5, 5], length=3, num_images=3) == [0, 1, 2]


def test_fixed_images_keep_the_data_as_given_and_skip_unreadable_items():
    class Dataset(list):
        labels = [1, 0, 1, 2]

    items = Dataset((torch.full((3, 4, 4), i, dtype=torch.uint8), label) for i, label in enumerate(Dataset.labels))
    items[3] = None  # an unreadable file the dataset skips
    images, labels, indices = fixed_images(items, num_images=3)
    # First image of classes 0, 1, 2 (items 1, 0, 3); item 3 cannot be read.
    assert images.dtype == torch.uint8 and labels.tolist() == [0, 1] and indices == [1, 0]
    assert images[:, 0, 0, 0].tolist() == [1, 0]
    # Without labels: evenly spaced items 0, 2, 3.
    assert fixed_images(list(items), num_images=3)[2] == [0, 2]
    with pytest.raises(ValueError, match="empty"):
        fixed_images([], num_images=2)
    with pytest.raises(ValueError, match=r"item 0 of the dataset is not a \(C, H, W\) tensor but ndarray"):
        fixed_images([(np.zeros((4, 4, 3)), 0)], num_images=1)


def test_rollout_pngs_and_attention_metrics_without_wandb(tmp_path, tiny_module, trainer, digits):
    rollout = AttentionRolloutLogger(num_images=6, every_n_epochs=1, attribution=True, faithfulness_every_n=2)
    module = tiny_module()
    fit = trainer(tmp_path, [rollout], CSVLogger(tmp_path), max_epochs=2)
    fit.fit(module, digits())

    # Fixed images: the first validation image of each of the first six classes to appear, sorted by class.
    first: dict[int, int] = {}
    for index, label in enumerate(digits_val_labels(digits()).tolist()):
        first.setdefault(label, index)
    classes = sorted(sorted(first, key=first.get)[:6])
    assert rollout.labels.tolist() == classes
    assert rollout.indices == [first[c] for c in classes]

    # Kept as the data gives them: uint8 pixels, normalised only for the model.
    assert rollout.images.dtype == torch.uint8 and rollout.images.shape == (6, 3, 32, 32)

    folder = tmp_path / "rollout"  # the run's folder (trainer.default_root_dir), whatever the loggers
    for epoch in (0, 1):
        with Image.open(folder / f"epoch_{epoch:03d}.png") as grid:
            # 4 panels of two 160-px images per row, 2 rows
            assert grid.mode == "RGB" and grid.width >= 4 * 2 * 160 and 2 * 160 <= grid.height < 3 * 160
        with Image.open(folder / f"distance_epoch_{epoch:03d}.png") as plot:
            assert plot.size == (500, 350)
        with (
            Image.open(folder / f"attribution_epoch_{epoch:03d}.png") as attribution,
            Image.open(folder / f"attnlrp_epoch_{epoch:03d}.png") as main_grid,  # the default map: the main grid
            Image.open(folder / f"epoch_{epoch:03d}.png") as grid,
        ):
            assert attribution.size == grid.size == main_grid.size

    # The last logged statistics are those of the final weights on the fixed images.
    metrics = read_metrics(tmp_path / "lightning_logs" / "version_0" / "metrics.csv")
    model = module.model
    inputs = normalize(rollout.images, rollout.mean, rollout.std)
    stats = attention_statistics(
        capture_attention(model, inputs), model.patch_embed.grid_size, model.patch_embed.patch_size, 1
    )
    for i in range(len(model.blocks)):  # two
        assert len(metrics[f"attn/entropy/block_{i}"]) == 2  # once per epoch
        assert metrics[f"attn/entropy/block_{i}"][-1] == pytest.approx(stats["mean_entropy"][i].item(), rel=1e-5)
        assert metrics[f"attn/distance/block_{i}"][-1] == pytest.approx(stats["mean_distance"][i].item(), rel=1e-5)
        assert 0 < metrics[f"attn/entropy/block_{i}"][-1] <= math.log(65)
    # Faithfulness every second logged epoch: once, for the final weights, as faithfulness() scores them.
    maps = {
        "attnlrp": explain_map(model, inputs, "attnlrp").patches,
        "rollout": rollout_map(model, inputs),
        "attribution": attention_attribution(model, inputs),
    }
    scores = faithfulness(model, inputs, maps)
    for curve in ("deletion_auc", "insertion_auc"):
        for name in ("attnlrp", "rollout", "attribution", "random"):
            assert metrics[f"explain/{curve}/{name}"] == [pytest.approx(scores[curve][name], abs=1e-6)]
    assert model.training  # Lightning's train mode is back

    # Explaining never touched training: the same fit without the callbacks ends with the same weights.
    plain = tiny_module()
    trainer(tmp_path / "plain", [], max_epochs=2).fit(plain, digits())
    for (name, a), (_, b) in zip(module.state_dict().items(), plain.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def digits_val_labels(data) -> np.ndarray:
    data.setup("validate")
    return np.asarray(data.val_dataset.labels)


def test_every_n_epochs_and_the_final_model(tmp_path, tiny_module, trainer, digits):
    fit = trainer(
        tmp_path, [AttentionRolloutLogger(num_images=2, every_n_epochs=2, statistics=False, mistakes=0)], max_epochs=3
    )
    fit.fit(tiny_module(), digits())
    pngs = sorted(p.name for p in (tmp_path / "rollout").glob("*.png"))  # epoch 1 (every 2nd) and epoch 2, the last
    assert pngs == [
        "attnlrp_epoch_001.png", "attnlrp_epoch_002.png", "attribution_epoch_001.png", "attribution_epoch_002.png",
        "epoch_001.png", "epoch_002.png",
    ]  # fmt: skip
    # A run that only validates explains the model it validates, whatever every_n_epochs says; validating a
    # checkpoint, the pictures carry the epoch it was saved in (a finished fit's: max_epochs).
    check = trainer(
        tmp_path / "v", [AttentionRolloutLogger(num_images=2, every_n_epochs=5, statistics=False, mistakes=0)]
    )
    check.validate(tiny_module(), digits())
    fit.save_checkpoint(tmp_path / "fit.ckpt")
    check.validate(tiny_module(), digits(), ckpt_path=tmp_path / "fit.ckpt")
    pngs = sorted(p.name for p in (tmp_path / "v" / "rollout").glob("*.png"))
    assert pngs == [
        "attnlrp_epoch_000.png", "attnlrp_epoch_003.png", "attribution_epoch_000.png", "attribution_epoch_003.png",
        "epoch_000.png", "epoch_003.png",
    ]  # fmt: skip
    # A fit that max_steps stops in epoch 1 of 5 (3 steps per epoch): its last model is explained, without the
    # faithfulness scores, which follow the every-n-th epochs only.
    logger = AttentionRolloutLogger(
        num_images=2, every_n_epochs=5, statistics=False, faithfulness_every_n=1, mistakes=0
    )
    stopped = trainer(tmp_path / "s", [logger], max_epochs=5, max_steps=6)
    stopped.fit(tiny_module(), digits())
    pngs = sorted(p.name for p in (tmp_path / "s" / "rollout").glob("*.png"))
    assert pngs == ["attnlrp_epoch_001.png", "attribution_epoch_001.png", "epoch_001.png"]
    assert not any(key.startswith("explain/") for key in stopped.callback_metrics)


def collapse_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "attention collapse" in str(w.message)]


def test_collapse_warning_on_uniform_attention_only(tmp_path, tiny_module, trainer, digits):
    collapsed = tiny_module()
    for block in collapsed.model.blocks:  # q = k = 0: every row of every head is exactly uniform
        torch.nn.init.zeros_(block.attn.qkv.weight)
        torch.nn.init.zeros_(block.attn.qkv.bias)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer(tmp_path, [AttentionRolloutLogger(num_images=4)]).validate(collapsed, digits())
    messages = collapse_warnings(record)
    assert len(messages) == 1
    assert messages[0].startswith("attention collapse at epoch 0 in block(s) 0, 1:")
    assert "h0=uniform(H/Hmax=1.000" in messages[0]

    healthy = tiny_module()
    for block in healthy.model.blocks:  # peaked but not one-hot attention (normalised entropy about 0.7)
        torch.nn.init.normal_(block.attn.qkv.weight, std=0.3)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer(tmp_path, [AttentionRolloutLogger(num_images=4)]).validate(healthy, digits())
    assert collapse_warnings(record) == []


class FailingWandb(Logger):
    """Stands in for a WandbLogger whose media upload fails."""

    name, version = "failing", 0

    def log_metrics(self, metrics, step=None):
        pass

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_image(self, key, images, step=None, **kwargs):
        raise OSError(28, "No space left on device")


def test_wandb_media_failure_is_a_warning_and_the_png_is_still_written(
    tmp_path, monkeypatch, tiny_module, trainer, digits
):
    logger = FailingWandb()
    monkeypatch.setattr(vit.loggers, "wandb_loggers", lambda trainer: [logger])
    fit = trainer(tmp_path, [AttentionRolloutLogger(num_images=2)], logger)
    with pytest.warns(UserWarning, match=r"could not log 'val/explanation_grid' to W&B .*OSError: .*No space"):
        fit.fit(tiny_module(), digits())
    assert fit.state.finished and fit.current_epoch == 1
    assert (tmp_path / "rollout" / "epoch_000.png").is_file() and (
        tmp_path / "rollout" / "attnlrp_epoch_000.png"
    ).is_file()


def test_png_failure_is_a_warning(tmp_path, tiny_module, trainer, digits):
    (tmp_path / "rollout").write_text("a file where the rollout folder should be")
    fit = trainer(tmp_path, [AttentionRolloutLogger(num_images=2)])
    with pytest.warns(UserWarning, match=r"could not log the explanation PNGs at epoch 0: FileExistsError"):
        fit.fit(tiny_module(), digits())
    assert fit.state.finished and fit.current_epoch == 1


@pytest.mark.slow
def test_grid_png_and_wandb_media_with_an_offline_wandb_logger(tmp_path, monkeypatch, tiny_module, trainer, digits):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(project="test", save_dir=str(tmp_path), offline=True)
    fit = trainer(tmp_path, [AttentionRolloutLogger(num_images=3)], logger)
    fit.fit(tiny_module(), digits())
    logger.experiment.finish()

    with Image.open(tmp_path / "rollout" / "epoch_000.png") as grid:
        assert grid.width >= 3 * 2 * 160
        png = np.asarray(grid.convert("RGB"))
    assert (tmp_path / "rollout" / "distance_epoch_000.png").is_file()
    media = tmp_path / "wandb" / "latest-run" / "files" / "media" / "images"
    grids = sorted((media / "val").glob("attention_rollout_grid_*.png"))
    panels = sorted((media / "val").glob("attention_rollout_[0-9]*.png"))  # W&B names them <key>_<n>_<hash>
    plots = sorted((media / "val").glob("attention_distance_*.png"))
    attribution = sorted((media / "val").glob("attention_attribution_[0-9]*.png"))
    attribution_grids = sorted((media / "val").glob("attention_attribution_grid_*.png"))
    main_grids = sorted((media / "val").glob("explanation_grid_*.png"))
    main_panels = sorted((media / "val").glob("explanation_[0-9]*.png"))
    assert len(main_grids) == 1 and len(main_panels) == 3
    assert len(grids) == 1 and len(panels) == 3 and len(plots) == 1
    assert len(attribution_grids) == 1 and len(attribution) == 3
    with Image.open(grids[0]) as logged:  # W&B holds the very picture written to the run folder
        np.testing.assert_array_equal(np.asarray(logged.convert("RGB")), png)


def test_explains_the_validated_weights_with_ema(tiny_module):
    module = tiny_module(ema_decay=0.9)
    assert explained_model(module) is module.model_ema.module
    assert explained_model(tiny_module()) is not None


def test_forward_flops_match_the_matmul_count(tiny_module):
    module = tiny_module()
    model = module.model
    D, L, N, P, C = 32, 2, 65, 64, 10  # dim, depth, tokens (class + 8x8 patches), patches, classes
    macs = P * D * 3 * 4 * 4  # patch embedding: a 4x4x3 -> D projection per patch
    macs += L * (N * D * 3 * D + 2 * N * N * D + N * D * D + 2 * N * D * 4 * D)  # qkv, QK^T and AV, proj, MLP
    macs += D * C  # head on the class token
    assert forward_flops(model, (3, 32, 32)) == 2 * macs
    assert model.training and all(block.attn.fused_attn for block in model.blocks)  # left as it was


def test_attribution_failure_warns_once_and_rollout_goes_on(tmp_path, monkeypatch, tiny_module, trainer, digits):
    def unreadable(model, images, target=None):
        raise RuntimeError("blocks[0].attn: its dense attention_weights do not reproduce its output")

    monkeypatch.setattr(method_registry, "attention_attribution", unreadable)
    fit = trainer(tmp_path, [AttentionRolloutLogger(num_images=2, statistics=False, mistakes=0)], max_epochs=2)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fit.fit(tiny_module(), digits())
    messages = [str(w.message) for w in record if "attribution" in str(w.message)]
    assert len(messages) == 1 and messages[0].startswith("could not log the attention attribution at epoch 0")
    assert sorted(p.name for p in (tmp_path / "rollout").glob("*.png")) == [
        "attnlrp_epoch_000.png", "attnlrp_epoch_001.png", "epoch_000.png", "epoch_001.png"
    ]  # fmt: skip


def test_main_map_is_any_method_checked_before_training(tmp_path, monkeypatch, tiny_module, trainer, digits):
    """``method`` picks the main grid; rollout draws no further one; an unknown name or a missing extra fails at
    construction, before any training."""
    fit = trainer(tmp_path, [AttentionRolloutLogger(num_images=2, statistics=False, method="gradxinput", mistakes=0)])
    fit.validate(tiny_module(), digits())
    assert sorted(p.name for p in (tmp_path / "rollout").glob("*.png")) == [
        "attribution_epoch_000.png", "epoch_000.png", "gradxinput_epoch_000.png"
    ]  # fmt: skip
    plain = trainer(
        tmp_path / "r", [AttentionRolloutLogger(num_images=2, statistics=False, method="rollout", mistakes=0)]
    )
    plain.validate(tiny_module(), digits())
    assert sorted(p.name for p in (tmp_path / "r" / "rollout").glob("*.png")) == [
        "attribution_epoch_000.png", "epoch_000.png"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown explanation method 'shap'"):
        AttentionRolloutLogger(method="shap")
    monkeypatch.setitem(sys.modules, "captum", None)
    monkeypatch.setitem(sys.modules, "captum.attr", None)
    with pytest.raises(ImportError, match=r'pip install "vit\[explain\]"'):
        AttentionRolloutLogger(method="ig")


def test_a_distilled_model_gets_the_maps_that_explain_it_and_no_explorer(tmp_path, tiny_module, trainer, digits):
    """Rollout and attention attribution refuse a distilled model (two heads): the grids hold AttnLRP's maps, the
    explorer (built on the rollout) is not written, and nothing is warned about; rollout named as the main map is
    refused before anything runs."""
    logger = AttentionRolloutLogger(num_images=2, statistics=False, attribution=True, mistakes=0)
    module = tiny_module(model_overrides={"distilled": True})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer(tmp_path, [logger]).validate(module, digits())
    assert not [w for w in record if "could not log" in str(w.message)]
    assert sorted(p.name for p in (tmp_path / "rollout").iterdir()) == ["attnlrp_epoch_000.png"]
    rollout = AttentionRolloutLogger(num_images=2, statistics=False, mistakes=0, method="rollout")
    with pytest.raises(ValueError, match="method 'rollout' does not apply to this model"):  # named: refused at once
        trainer(tmp_path / "r", [rollout]).validate(module, digits())
