"""``model.optimizer: muon``: Muon on the blocks' weight matrices and AdamW on the rest, as one optimiser, checked
step for step against ``torch.optim.Muon`` and ``torch.optim.AdamW`` run side by side."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from vit.errors import ConfigError, IncompatibleCheckpointError
from vit.lit_module import warmup_cosine
from vit.optim import MuonWithAdamW, make_optimizer, param_groups

MATRICES = ("attn.qkv.weight", "attn.proj.weight", "mlp.fc1.weight", "mlp.fc2.weight")


def muon(model, lr=1e-2, weight_decay=0.05, layer_decay=None):
    return make_optimizer(
        model, "muon", lr, weight_decay=weight_decay, layer_decay=layer_decay, betas=(0.9, 0.95), eps=1e-8, fused=False
    )


def train(model, optimizers, steps=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)
        for opt in optimizers:
            opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        for opt in optimizers:
            opt.step()


def test_muon_takes_the_blocks_matrices_and_adamw_everything_else(tiny):
    model = tiny(model_overrides={"conv_stem": True}).model
    opt = muon(model)
    names = {id(p): n for n, p in model.named_parameters()}
    on_muon = {names[id(p)] for g in opt.param_groups if g["muon"] for p in g["params"]}
    expected = {f"blocks.{i}.{m}" for i in range(3) for m in MATRICES}
    assert on_muon == expected
    on_adamw = {names[id(p)] for g in opt.param_groups if not g["muon"] for p in g["params"]}
    assert on_adamw == set(names.values()) - expected  # the stem, the head, position embedding, norms, biases
    assert {g["weight_decay"] for g in opt.param_groups if g["muon"]} == {0.05}


@pytest.mark.parametrize("layer_decay", [None, 0.5])  # 0.5: matrices of one shape at three learning rates
def test_one_optimiser_steps_as_torchs_muon_and_adamw_side_by_side(tiny, layer_decay):
    model = tiny().model
    ref, initial = copy.deepcopy(model), copy.deepcopy(model)
    opt = muon(model, layer_decay=layer_decay)
    blocks = {id(p) for n, p in ref.named_parameters() if n.startswith("blocks.") and n.endswith(MATRICES)}
    groups = param_groups(ref, 1e-2, weight_decay=0.05, layer_decay=layer_decay)

    def part(on_muon):  # each group's block matrices, or the rest, as groups of their own
        split = ({**g, "params": [p for p in g["params"] if (id(p) in blocks) == on_muon]} for g in groups)
        return [g for g in split if g["params"]]

    matrices, rest = part(True), part(False)
    reference = [
        torch.optim.Muon(matrices, lr=1e-2, adjust_lr_fn="match_rms_adamw"),  # each group's lr and weight decay
        torch.optim.AdamW(rest, lr=1e-2, betas=(0.9, 0.95), eps=1e-8),
    ]
    train(model, [opt])
    train(ref, reference)
    for (name, got), want in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)
    assert all(not torch.equal(a, b) for a, b in zip(model.parameters(), initial.parameters(), strict=True))


def test_a_loaded_state_continues_as_the_uninterrupted_run(tiny):
    model = tiny().model
    opt = muon(model)
    train(model, [opt], steps=2)
    resumed_model = copy.deepcopy(model)
    resumed = muon(resumed_model)
    resumed.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert resumed._adamw.state is resumed.state
    train(model, [opt], seed=1)
    train(resumed_model, [resumed], seed=1)
    for got, want in zip(resumed_model.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_schedule_scales_both_halves_in_a_fit(tiny, cpu_trainer):
    seen = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            opt = trainer.optimizers[0]
            seen.append(({g["lr"] for g in opt.param_groups if g["muon"]}, {g["lr"] for g in opt._adamw.param_groups}))

    module = tiny(optimizer="muon", lr=1e-3, min_lr=1e-5, warmup_steps=2)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g))
    cpu_trainer(max_steps=4, limit_val_batches=0, callbacks=[Record()]).fit(module, DataLoader(data, batch_size=4))
    assert isinstance(module.trainer.optimizers[0], MuonWithAdamW)
    assert [muon_lrs == adamw_lrs and len(muon_lrs) == 1 for muon_lrs, adamw_lrs in seen] == [True] * 4
    expected = [1e-3 * warmup_cosine(step, 2, 4, 1e-5 / 1e-3) for step in range(4)]
    assert [next(iter(muon_lrs)) for muon_lrs, _ in seen] == pytest.approx(expected, rel=1e-9)


def test_a_copy_and_a_group_added_later_step_as_their_original(tiny):
    model = tiny().model
    opt = muon(model)
    train(model, [opt], steps=1)
    twin_model, twin = copy.deepcopy((model, opt))  # as pickle: __getstate__ keeps only the groups and the state
    train(model, [opt], seed=1)
    train(twin_model, [twin], seed=1)
    for got, want in zip(twin_model.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    extra = torch.nn.Parameter(torch.ones(3))  # as Lightning's BaseFinetuning unfreezes a layer: an AdamW group
    opt.add_param_group({"params": [extra], "lr": 0.1})
    extra.grad = torch.ones(3)
    opt.step()
    assert torch.all(extra < 1) and any(p is extra for p in opt._adamw.param_groups[-1]["params"])


def test_layer_decay_keeps_each_groups_scaled_rate_on_both_halves(tiny):
    opt = muon(tiny().model, lr=1e-2, layer_decay=0.5)
    muon_groups = [g for g in opt.param_groups if g["muon"]]
    assert len(muon_groups) == 3  # one a block
    assert sorted(g["lr"] for g in muon_groups) == pytest.approx([1e-2 * 0.5**3, 1e-2 * 0.5**2, 1e-2 * 0.5])
    assert all(g["lr"] == pytest.approx(1e-2 * g["lr_scale"]) for g in opt.param_groups)


def test_a_fit_is_not_resumed_with_another_optimiser(tmp_path, tiny, cpu_trainer):
    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,))), batch_size=4)
    fit = cpu_trainer(max_steps=2, limit_val_batches=0)
    fit.fit(tiny(), data)  # AdamW
    fit.save_checkpoint(tmp_path / "adamw.ckpt")
    with pytest.raises(
        IncompatibleCheckpointError, match="trained with model.optimizer adamw.*--model.optimizer adamw"
    ):
        cpu_trainer(max_steps=4, limit_val_batches=0).fit(
            tiny(optimizer="muon"), data, ckpt_path=tmp_path / "adamw.ckpt"
        )
    cpu_trainer(limit_test_batches=1).test(tiny(optimizer="muon"), data, ckpt_path=tmp_path / "adamw.ckpt")  # weights


def test_a_network_without_blocks_is_refused_in_one_line():
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    with pytest.raises(ConfigError, match="optimizer muon needs a network with linear layers in transformer blocks"):
        muon(net)
