"""ImageClassifier: loss, Mixup, parameter groups, learning-rate schedule, EMA, pretrained weights, checkpoints."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from timm.loss import SoftTargetCrossEntropy
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import vit.lit_module
from vit import VisionTransformer
from vit.callbacks import CheckpointMetadata, TrainingThroughput, UnmaskedEpochs, training_throughput
from vit.errors import ConfigError
from vit.lit_module import ImageClassifier, fused_adamw, warmup_cosine


def loader(n: int = 16, batch_size: int = 4, num_classes: int = 10, img_size: int = 16) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    images = torch.randn(n, 3, img_size, img_size, generator=g)
    data = TensorDataset(images, torch.randint(0, num_classes, (n,), generator=g))
    return DataLoader(data, batch_size=batch_size)


class FixedLogits(nn.Module):
    """A 'model' that returns the same logits for every image."""

    def __init__(self, logits: list[float]) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(logits))
        self.num_classes = len(logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(x.shape[0], -1)


# ------------------------------------------------------------------------------------------------------- model
def test_preset_receives_num_classes_img_size_and_overrides():
    module = ImageClassifier(
        "vit_tiny_patch4_32", num_classes=7, img_size=16, model_overrides={"depth": 2, "drop_path_rate": 0.1}
    )
    assert isinstance(module.model, VisionTransformer)
    assert module.model.num_classes == module.num_classes == 7
    assert module.model.patch_embed.img_size == (16, 16)
    assert len(module.model.blocks) == 2
    assert module(torch.randn(2, 3, 16, 16)).shape == (2, 7)


def test_module_gets_new_head_when_class_count_differs_and_size_is_checked(tiny_vit):
    net = tiny_vit(num_classes=10, depth=3)
    module = ImageClassifier(net, num_classes=4, img_size=32)
    assert module.model is net and net.head.out_features == 4
    assert "model" not in module.hparams  # an object, not a hyper-parameter
    with pytest.raises(ConfigError, match="img_size"):
        ImageClassifier(tiny_vit(depth=3), img_size=16)
    with pytest.raises(ConfigError, match="model_overrides"):
        ImageClassifier(tiny_vit(depth=3), model_overrides={"depth": 1})
    with pytest.raises(ConfigError, match="vit_nope"):
        ImageClassifier("vit_nope")
    with pytest.raises(ConfigError, match="depthh"):
        ImageClassifier("vit_tiny_patch4_32", model_overrides={"depthh": 1})


def test_top5_only_with_five_or_more_classes(tiny):
    assert set(tiny(num_classes=10).val_metrics.keys(keep_base=False)) == {"val/acc", "val/acc_top5"}
    assert set(tiny(num_classes=3).val_metrics.keys(keep_base=False)) == {"val/acc"}


# -------------------------------------------------------------------------------------------------------- loss
def test_label_smoothing_in_training_loss():
    eps, logits, y = 0.1, [2.0, 0.0, -1.0], 0
    module = ImageClassifier(FixedLogits(logits), label_smoothing=eps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log without a trainer
        loss = module.training_step((torch.zeros(4, 3, 8, 8), torch.full((4,), y)), 0)
    logp = torch.log_softmax(torch.tensor(logits), 0).tolist()
    expected = -((1 - eps) * logp[y] + eps / 3 * sum(logp))
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(0.3365, abs=1e-4)  # the number itself, so the formula above is checked too


def test_mixup_gives_soft_targets_and_finite_loss(tiny):
    module = tiny(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1)
    seen = {}

    class Spy(SoftTargetCrossEntropy):
        def forward(self, logits, target):
            seen["target"] = target
            return super().forward(logits, target)

    module.mixup_criterion = Spy()
    np.random.seed(0)
    x, y = torch.randn(8, 3, 16, 16), torch.arange(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = module.training_step((x, y), 0)
    target = seen["target"]
    assert torch.isfinite(loss) and loss.item() > 0
    assert target.shape == (8, 10)
    torch.testing.assert_close(target.sum(dim=1), torch.ones(8))
    # Each row mixes its own label with the label of the image at the mirrored position (timm's batch mode).
    own, partner = target[torch.arange(8), y], target[torch.arange(8), y.flip(0)]
    assert torch.all(own > 0.01) and torch.all(partner > 0.01)
    assert torch.all(own + partner < 1.0)  # smoothing mass on the other classes
    torch.testing.assert_close(own + partner, torch.full((8,), 0.9 + 2 * 0.1 / 10))

    # An odd batch cannot be paired: smoothed one-hot targets, still the soft-target loss.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module.training_step((torch.randn(3, 3, 16, 16), torch.tensor([1, 2, 3])), 0)
    torch.testing.assert_close(seen["target"][0, 1], torch.tensor(0.9 + 0.1 / 10))


# ----------------------------------------------------------------------------------------------- optimisation
def test_no_weight_decay_on_biases_norms_pos_embed_and_tokens(tiny):
    module = tiny(weight_decay=0.05, model_overrides={"reg_tokens": 2})
    names = {id(p): n for n, p in module.model.named_parameters()}
    decay_of = {names[id(p)]: g["weight_decay"] for g in module.param_groups(1e-3) for p in g["params"]}
    assert set(decay_of) == set(names.values())  # every parameter is optimised, once
    no_decay = {n for n, wd in decay_of.items() if wd == 0.0}
    assert {"pos_embed", "cls_token", "reg_token", "norm.weight", "norm.bias", "head.bias"} <= no_decay
    assert all(n in no_decay for n in decay_of if n.endswith(".bias") or ".norm" in n)
    assert {n for n, wd in decay_of.items() if wd == 0.05} == {
        n for n in decay_of if n.endswith(".weight") and module.model.get_parameter(n).ndim > 1
    }


def test_layer_decay_scales_learning_rate_by_depth(tiny):
    module = tiny(layer_decay=0.5, lr=1.0)  # depth 3
    lr_of = {}
    for group in module.param_groups(1.0):
        for p in group["params"]:
            lr_of[p] = group["lr"]
    model = module.model
    assert lr_of[model.head.weight] == 1.0
    for i in range(3):
        assert lr_of[model.blocks[i].attn.qkv.weight] == 0.5 ** (3 - i)
        assert lr_of[model.blocks[i].norm1.weight] == 0.5 ** (3 - i)
    for p in (model.pos_embed, model.cls_token, model.patch_embed.proj.weight):
        assert lr_of[p] == 0.5**4


def test_warmup_cosine_values():
    f = dict(warmup_steps=10, total_steps=110, min_ratio=0.01)
    assert warmup_cosine(0, **f) == pytest.approx(0.1)
    assert warmup_cosine(4, **f) == pytest.approx(0.5)
    assert warmup_cosine(9, **f) == pytest.approx(1.0)  # end of warm-up: the peak
    assert warmup_cosine(10, **f) == pytest.approx(1.0)
    assert warmup_cosine(60, **f) == pytest.approx(0.505)  # half-way down the cosine
    assert warmup_cosine(110, **f) == pytest.approx(0.01)  # the end: min_lr / lr
    assert warmup_cosine(200, **f) == pytest.approx(0.01)
    assert warmup_cosine(0, 0, 100) == pytest.approx(1.0)  # no warm-up


def test_trainer_applies_schedule_per_step(tiny, cpu_trainer):
    lrs = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    # 4 batches per epoch, 3 epochs = 12 steps; half an epoch of warm-up = 2 steps.
    module = tiny(lr=1e-3, min_lr=1e-5, warmup_epochs=0.5)
    cpu_trainer(max_epochs=3, limit_val_batches=0, callbacks=[Record()]).fit(module, loader(16, 4))
    assert module.schedule_steps() == (2, 12)
    expected = [1e-3 * warmup_cosine(s, 2, 12, 1e-5 / 1e-3) for s in range(12)]
    assert lrs == pytest.approx(expected, rel=1e-9)
    assert lrs[0] == pytest.approx(5e-4) and lrs[1] == pytest.approx(1e-3) and lrs[2] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5 * (1 + math.cos(math.pi * 9 / 10)))
    assert module.lr_schedulers().get_last_lr()[0] == pytest.approx(1e-5)  # after the last step: min_lr


def test_warmup_epochs_with_max_steps_only(tiny, cpu_trainer):
    # max_epochs -1: Lightning estimates the length from max_steps without loading the loader; warm-up still counts
    # the loader's 4 batches per epoch.
    module = tiny(warmup_epochs=0.5)
    cpu_trainer(max_epochs=-1, max_steps=6, limit_val_batches=0).fit(module, loader(16, 4))
    assert module.schedule_steps() == (2, 6)
    with pytest.raises(ConfigError, match="the cosine schedule needs a length"):
        cpu_trainer(max_epochs=-1, limit_val_batches=0).fit(tiny(), loader(16, 4))


def test_lr_scales_linearly_with_global_batch(tiny):
    module = tiny(lr=1e-3, lr_base_batch_size=512)
    fake = SimpleNamespace(datamodule=SimpleNamespace(batch_size=128), world_size=4, accumulate_grad_batches=2)
    module._trainer = fake  # peak_lr only reads these three
    assert module.global_batch_size() == 1024
    assert module.peak_lr() == pytest.approx(2e-3)
    module._trainer = None


def test_fused_adamw_only_on_cuda_and_not_where_mixed_precision_clips():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert fused_adamw(cuda, None)
    assert fused_adamw(cuda, L.Trainer(accelerator="cpu", precision="bf16-mixed", logger=False))  # no clipping
    assert fused_adamw(cuda, L.Trainer(accelerator="cpu", precision="32-true", gradient_clip_val=1.0, logger=False))
    clipped = L.Trainer(accelerator="cpu", precision="bf16-mixed", gradient_clip_val=1.0, logger=False)
    assert not fused_adamw(cuda, clipped)
    assert not fused_adamw(cpu, None)


@pytest.mark.parametrize("decide", ["ours", "always fused"])
def test_mixed_precision_with_clipping_trains_with_the_optimiser_chosen_for_cuda(
    decide, monkeypatch, tiny, cpu_trainer
):
    # The GPU configs train in bf16-mixed with gradient_clip_val 1.0. Lightning refuses to clip for a fused AdamW there
    # and stops the first step; the fused kernel also exists on the CPU, so the CUDA choice is replayed here.
    chosen = []

    def as_on_cuda(device, trainer_):
        chosen.append(fused_adamw(torch.device("cuda"), trainer_) if decide == "ours" else True)
        return chosen[-1]

    monkeypatch.setattr(vit.lit_module, "fused_adamw", as_on_cuda)
    module = tiny()
    fit = cpu_trainer(max_epochs=1, limit_val_batches=0, precision="bf16-mixed", gradient_clip_val=1.0)
    if decide == "always fused":
        with pytest.raises(RuntimeError, match="does not allow for gradient clipping"):
            fit.fit(module, loader(8, 4))
        return
    fit.fit(module, loader(8, 4))
    assert chosen == [False] and fit.global_step == 2
    assert not module.optimizers().optimizer.defaults["fused"]


# --------------------------------------------------------------------------------------------- unmasked epochs
class CountTokens(L.Callback):
    """Token counts entering the first block, per epoch."""

    def __init__(self) -> None:
        self.tokens: dict[int, set[int]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.handle = pl_module.model.blocks[0].register_forward_pre_hook(
            lambda module, args: self.tokens.setdefault(trainer.current_epoch, set()).add(args[0].shape[1])
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.handle.remove()


def test_unmasked_epochs_train_the_last_epochs_on_every_patch(recwarn, tiny, cpu_trainer):
    count = CountTokens()
    module = tiny(model_overrides={"patch_drop_rate": 0.5}, unmasked_epochs=1)
    cpu_trainer(max_epochs=3, limit_val_batches=0, callbacks=[count]).fit(module, loader(8, 4))
    assert count.tokens == {0: {1 + 8}, 1: {1 + 8}, 2: {1 + 16}}  # class token + half, then all, of the 4x4 patches
    assert module.model.patch_drop.prob == 0.0
    assert not [w for w in recwarn if "unmasked_epochs" in str(w.message)]

    with pytest.raises(ConfigError, match="unmasked_epochs 1 .*patch_drop_rate"):
        tiny(unmasked_epochs=1)
    with pytest.raises(ConfigError, match="unmasked_epochs must be >= 0"):
        tiny(model_overrides={"patch_drop_rate": 0.5}, unmasked_epochs=-1)
    with pytest.warns(UserWarning, match="unmasked_epochs 3 is not less than trainer.max_epochs 3"):
        fit = cpu_trainer(max_epochs=3, max_steps=1, limit_val_batches=0)
        fit.fit(tiny(model_overrides={"patch_drop_rate": 0.5}, unmasked_epochs=3), loader(8, 4))


def test_unmasked_epochs_hold_after_a_resume_inside_the_epoch_and_warn_when_cut_short(tmp_path, tiny, cpu_trainer):
    def module():
        return tiny(model_overrides={"patch_drop_rate": 0.5}, unmasked_epochs=1)

    # 4 batches per epoch: step 6 is inside epoch 1, the unmasked one.
    save = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=6, save_top_k=-1)
    cpu_trainer(max_epochs=2, max_steps=6, limit_val_batches=0, callbacks=[save], enable_checkpointing=True).fit(
        module(), loader(16, 4)
    )
    (path,) = (tmp_path / "ckpt").glob("*step=6.ckpt")
    count = CountTokens()
    cpu_trainer(max_epochs=2, limit_val_batches=0, callbacks=[count]).fit(module(), loader(16, 4), ckpt_path=path)
    assert count.tokens == {1: {1 + 16}}  # the two batches left of epoch 1, on every patch

    with pytest.warns(UserWarning, match="stopped at step 2, .*max_epochs 3 .*unmasked_epochs 1 did not run"):
        cpu_trainer(max_epochs=3, max_steps=2, limit_val_batches=0).fit(module(), loader(16, 4))


def test_the_module_brings_its_callbacks_to_every_trainer(tiny, cpu_trainer):
    """Throughput, the checkpoint's description and (with unmasked_epochs) the PatchDropout schedule are callbacks the
    module adds itself: a plain Trainer gets them, the CLI's configs need no entry for them."""
    plain = cpu_trainer(max_steps=1, limit_val_batches=0)
    plain.fit(tiny(), loader(8, 4))
    kinds = [type(cb) for cb in plain.callbacks]
    assert TrainingThroughput in kinds and CheckpointMetadata in kinds and UnmaskedEpochs not in kinds
    unmasked = cpu_trainer(max_epochs=2, max_steps=1, limit_val_batches=0)
    with pytest.warns(UserWarning, match="did not run in full"):
        unmasked.fit(tiny(model_overrides={"patch_drop_rate": 0.25}, unmasked_epochs=1), loader(8, 4))
    (schedule,) = [cb for cb in unmasked.callbacks if isinstance(cb, UnmaskedEpochs)]
    assert (schedule.unmasked_epochs, schedule.drop_rate) == (1, 0.25)


# --------------------------------------------------------------------------------------------------------- EMA
def test_ema_tracks_weights_and_is_used_for_validation(tiny, cpu_trainer):
    weights = []

    class Snapshot(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            weights.append({k: v.clone() for k, v in pl_module.model.state_dict().items()})

    module = tiny(ema_decay=0.5, lr=1e-2)
    data = loader(8, 4)
    fit = cpu_trainer(max_epochs=1, limit_val_batches=0, callbacks=[Snapshot()])
    fit.fit(module, data)
    # timm's ModelEmaV3: the first update copies the weights, the next ones interpolate with `decay`.
    ema = module.model_ema.module.state_dict()
    for k in ("blocks.0.attn.qkv.weight", "head.bias", "pos_embed"):
        torch.testing.assert_close(ema[k], 0.5 * weights[0][k] + 0.5 * weights[1][k])

    assert module.eval_model is module.model_ema.module
    # DDP refuses a module with parameters that need a gradient the loss never gives: the average needs none
    trainable = {id(p) for p in module.parameters() if p.requires_grad}
    assert trainable == {id(p) for p in module.model.parameters()}
    metrics = cpu_trainer().validate(module, data, verbose=False)[0]
    x, y = next(iter(loader(8, 8)))
    with torch.no_grad():
        ema_loss = F.cross_entropy(module.model_ema.module(x), y).item()
        raw_loss = F.cross_entropy(module.model.eval()(x), y).item()
    assert metrics["val/loss"] == pytest.approx(ema_loss, rel=1e-5)
    assert abs(ema_loss - raw_loss) > 1e-6


# -------------------------------------------------------------------------------------- test-time augmentation
def test_test_time_augment_averages_the_probabilities_of_flipped_and_shifted_views(tiny, cpu_trainer):
    x = torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    module = tiny(img_size=32, test_time_augment="flip_translate").eval()
    for param in module.parameters():  # larger weights than at initialisation: predictions that differ per image
        torch.nn.init.normal_(param, std=0.5)

    def view(flip: bool, shift: int) -> torch.Tensor:  # numpy's reflect padding by 2 px (32 px / 16), then the crop
        images = x.flip(-1) if flip else x
        padded = torch.from_numpy(np.pad(images.numpy(), ((0, 0), (0, 0), (2, 2), (2, 2)), mode="reflect"))
        return padded[..., 2 + shift : 34 + shift, 2 + shift : 34 + shift]

    with torch.no_grad():
        single = module.model(x).softmax(-1)
        expected = torch.stack([module.model(view(f, s)).softmax(-1) for f in (0, 1) for s in (0, -2, 2)]).mean(0)
    y = expected.argmax(-1)  # labels the six views get right: test/acc is 1, the image alone is not
    assert (single.argmax(-1) != y).any()

    data = DataLoader(TensorDataset(x, y), batch_size=16)
    predicted = torch.cat(cpu_trainer().predict(module, data))
    torch.testing.assert_close(predicted, expected)
    metrics = cpu_trainer().test(module, data, verbose=False)[0]
    assert metrics["test/acc"] == 1.0
    assert metrics["test/acc_single_view"] == pytest.approx((single.argmax(-1) == y).float().mean().item())
    assert metrics["test/loss"] == pytest.approx(F.nll_loss(expected.log(), y).item(), rel=1e-5)
    # Validation sees the image alone.
    assert cpu_trainer().validate(module, data, verbose=False)[0]["val/loss"] == pytest.approx(
        F.nll_loss(single.log(), y).item(), rel=1e-5
    )

    module.hparams.test_time_augment = "flip"
    with torch.no_grad():
        flip = (single + module.model(x.flip(-1)).softmax(-1)) / 2
    torch.testing.assert_close(torch.cat(cpu_trainer().predict(module, data)), flip)


def test_no_test_time_augment_predicts_the_image_alone(tiny, cpu_trainer):
    x, y = next(iter(loader(16, 16)))
    module = tiny().eval()
    data = DataLoader(TensorDataset(x, y), batch_size=8)
    with torch.no_grad():
        expected = module.model(x).softmax(-1)
    torch.testing.assert_close(torch.cat(cpu_trainer().predict(module, data)), expected)
    assert "test/acc_single_view" not in cpu_trainer().test(module, data, verbose=False)[0]


# ------------------------------------------------------------------------------------------- weights and files
def test_pretrained_weights_load_when_fitting_starts(tmp_path, tiny, tiny_vit):
    source = tiny_vit(num_classes=100, img_size=32, depth=3)
    path = tmp_path / "pretrained.pth"
    torch.save(source.state_dict(), path)
    module = tiny(pretrained=str(path), ema_decay=0.9)  # 16 px and 10 classes: pos grid resampled, head dropped
    assert not torch.equal(module.model.blocks[0].attn.qkv.weight, source.blocks[0].attn.qkv.weight)
    module.setup("fit")
    for net in (module.model, module.model_ema.module):
        torch.testing.assert_close(net.blocks[0].attn.qkv.weight, source.blocks[0].attn.qkv.weight)
        assert net.pos_embed.shape == (1, 1 + 16, 32) and net.head.out_features == 10


def test_load_from_checkpoint_needs_no_arguments(tmp_path, tiny, cpu_trainer):
    module = tiny(lr=3e-4, label_smoothing=0.2, model_overrides={"window_size": 2, "global_attn_indexes": [2]})
    fit = cpu_trainer(max_steps=2, limit_val_batches=0)
    fit.fit(module, loader(8, 4))
    path = tmp_path / "module.ckpt"
    fit.save_checkpoint(path)

    loaded = ImageClassifier.load_from_checkpoint(path)
    assert loaded.hparams.lr == 3e-4 and loaded.hparams.model_overrides["window_size"] == 2
    assert loaded.model.window_size == 2
    for k, v in module.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v)
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(loaded.eval()(x), module.eval()(x))


def test_compile_keeps_parameter_names(tiny):
    module = tiny(compile=True)
    assert module.model._compiled_call_impl is not None  # nn.Module.compile: compiled in place
    assert set(module.state_dict()) == set(tiny().state_dict())  # no "_orig_mod." prefix in checkpoints


def test_uint8_images_that_bypassed_the_data_module_hook_are_refused(tiny, cpu_trainer):
    # ImageDataModule's loaders yield uint8; only trainer.fit(..., datamodule=dm) normalises them on the device.
    data = TensorDataset(torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8), torch.zeros(8, dtype=torch.long))
    with pytest.raises(TypeError, match=r"got torch.uint8 images.*datamodule=dm.*dm\.normalize\(images\)"):
        cpu_trainer(max_steps=1, limit_val_batches=0).fit(tiny(), DataLoader(data, batch_size=4))


def test_throughput_is_images_over_time_between_batch_starts(monkeypatch, tiny, cpu_trainer):
    # A fake clock: each training batch start is 0.5 s after the previous one; 12 images in batches of 5, 5, 2.
    clock = iter(float(t) * 0.5 for t in range(100))
    monkeypatch.setattr("vit.callbacks.throughput.time.perf_counter", lambda: next(clock))
    module = tiny()
    logged = []
    monkeypatch.setattr(module, "log", lambda name, value, **kw: logged.append((name, value)))
    fit = cpu_trainer(max_epochs=1)
    assert math.isnan(training_throughput(fit))  # no callback before the module adds its own
    fit.fit(module, loader(n=12, batch_size=5))
    # Steps 1 and 2 are timed (the third batch's step has no next start): 5 images each in 0.5 s.
    assert [v for n, v in logged if n == "train/img_per_sec"] == [10.0, 10.0]
    assert training_throughput(fit) == 10.0
    assert module.example_input_array.shape == (1, 3, 16, 16)  # the model summary's real FLOPs


def test_a_trainer_keeps_its_own_throughput_and_metadata_callbacks(tiny, cpu_trainer):
    """The module reads the trainer's callbacks through Lightning's public ``trainer`` property (which raises outside
    a Trainer: then both callbacks are offered); one the trainer already has is not added twice, over two fits."""
    module = tiny()
    with pytest.raises(RuntimeError, match="not attached to a `Trainer`"):
        module.trainer  # noqa: B018 (what the module relies on outside a Trainer)
    assert [type(cb) for cb in module.configure_callbacks()] == [TrainingThroughput, CheckpointMetadata]
    own = CheckpointMetadata()
    fit = cpu_trainer(max_steps=1, limit_val_batches=0, callbacks=[own])
    fit.fit(module, loader(8, 4))
    fit.fit(module, loader(8, 4))
    metadata = [cb for cb in fit.callbacks if isinstance(cb, CheckpointMetadata)]
    assert len(metadata) == 1 and metadata[0] is own
    assert sum(isinstance(cb, TrainingThroughput) for cb in fit.callbacks) == 1
