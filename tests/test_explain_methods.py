"""The registry of explanation methods: each against an independent computation, the model left as it was, the
errors for unknown and inapplicable methods and for a missing ``explain`` extra; and the method benchmark."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest
import torch
from torch import nn

from vit.explain import (
    METHODS,
    applicable_methods,
    attention_attribution,
    benchmark_methods,
    capture_attention,
    explain_map,
    faithfulness,
    method_benchmark,
    rollout_map,
)
from vit.explain.method_benchmark import bootstrap_interval
from vit.explain.methods import Method, MethodMap
from vit.layers import PatchEmbed

SMALL = dict(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=2, num_classes=4)


@pytest.fixture
def model(random_vit):
    return random_vit(**SMALL, reg_tokens=1).eval()


def images(batch: int = 3) -> torch.Tensor:
    return torch.randn(batch, 3, 16, 16)


@pytest.mark.slow
def test_every_method_gives_patch_maps_and_leaves_the_model_alone(model):
    x = images()
    model.train()
    model.head.weight.grad = torch.ones_like(model.head.weight)  # a gradient the caller had: kept
    model.blocks[0].attn.qkv.weight.requires_grad_(False)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    for name in METHODS:
        result = explain_map(model, x, name, target=[0, 1, 2])
        assert result.patches.shape == (3, 4, 4), name
        assert torch.isfinite(result.patches).all() and result.patches.abs().sum() > 0, name
        if result.pixels is not None:
            assert result.pixels.shape == (3, 16, 16), name
        if METHODS[name].class_specific:
            assert result.target.tolist() == [0, 1, 2], name
    assert all(m.training for m in model.modules())
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert torch.equal(model.head.weight.grad, torch.ones_like(model.head.weight))
    assert all(p.grad is None for n, p in model.named_parameters() if n != "head.weight")
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules())


def test_project_methods_are_the_project_functions(model):
    x = images()
    torch.testing.assert_close(explain_map(model, x, "rollout").patches, rollout_map(model, x))
    torch.testing.assert_close(explain_map(model, x, "chefer", target=1).patches, attention_attribution(model, x, 1))
    attn, cp = explain_map(model, x, "attnlrp"), explain_map(model, x, "cp")
    assert not torch.allclose(attn.patches, cp.patches)


def test_gradient_x_input_by_autograd(model):
    x = images().requires_grad_(True)
    logits = model(x)
    (grad,) = torch.autograd.grad(logits[:, 2].sum(), x)
    expected = (x * grad).sum(1).detach()
    result = explain_map(model, x.detach(), "gradxinput", target=2)
    torch.testing.assert_close(result.pixels, expected)
    torch.testing.assert_close(result.patches, expected.reshape(3, 4, 4, 4, 4).sum((2, 4)))


def test_integrated_gradients_is_complete(model):
    """The completeness axiom: the attributions sum to f(x) - f(baseline), the zero image."""
    model = model.double()
    x = images().double()
    result = explain_map(model, x, "ig", target=3, n_steps=64)
    with torch.no_grad():
        expected = model(x)[:, 3] - model(torch.zeros_like(x))[:, 3]
    torch.testing.assert_close(result.pixels.sum((1, 2)), expected, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(result.patches.sum((1, 2)), result.pixels.sum((1, 2)))


def test_grad_cam_matches_its_formula_on_the_token_grid(model):
    """Grad-CAM on the last block's norm1 tokens: ReLU(Σ_c mean_patches(∂y/∂A_c) · A_c) on the grid, then grad-cam's
    own post-processing: min-max per image, bilinear upsampling to the image, ReLU and min-max again."""
    cv2 = pytest.importorskip("cv2")
    x = images()
    captured = {}
    handle = model.blocks[-1].norm1.register_forward_hook(lambda m, a, o: captured.update(a=o))
    logits = model(x.requires_grad_(True))
    handle.remove()
    (grad,) = torch.autograd.grad(logits[:, 1].sum(), captured["a"])
    tokens, grad = captured["a"][:, model.num_prefix_tokens :], grad[:, model.num_prefix_tokens :]  # (B, 16, C)
    cam = (grad.mean(1, keepdim=True) * tokens).sum(-1).clamp(min=0).detach().reshape(3, 4, 4).numpy()

    def min_max(a: np.ndarray) -> np.ndarray:
        a = a - a.min()
        return a / (1e-7 + a.max())

    expected = np.stack([min_max(np.maximum(cv2.resize(min_max(c), (16, 16)), 0)) for c in cam])
    result = explain_map(model, x.detach(), "gradcam", target=1)
    np.testing.assert_allclose(result.pixels.numpy(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result.patches, torch.from_numpy(expected).reshape(3, 4, 4, 4, 4).mean((2, 4)))


@pytest.mark.parametrize("pool", ["token", "avg", "map"])
def test_last_block_attention_reads_the_rows_the_head_reads(random_vit, pool):
    kwargs = {"token": {}, "avg": dict(class_token=False, global_pool="avg"), "map": dict(global_pool="map")}[pool]
    model = random_vit(**SMALL, **kwargs).eval()
    x = images()
    record = capture_attention(model, x)
    last, P = record[-1], model.num_prefix_tokens
    expected = {
        "token": lambda: last[:, :, 0, P:].mean(1),
        "avg": lambda: last[:, :, P:, P:].mean((1, 2)),
        "map": lambda: record.pool.mean((1, 2)),
    }[pool]()
    torch.testing.assert_close(explain_map(model, x, "attention").patches, expected.reshape(3, 4, 4))


class PatchOnly(nn.Module):
    """A classifier with a patch grid but no transformer blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = PatchEmbed(16, 4, 3, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.patch_embed(x).mean(1))


def test_unknown_and_inapplicable_methods_name_what_applies(model):
    with pytest.raises(ValueError, match=r"unknown explanation method 'shap': choose from rollout, attribution"):
        explain_map(model, images(), "shap")
    other = PatchOnly()
    assert applicable_methods(other) == ["attnlrp", "cp_lrp", "ig", "gradxinput"]
    for name in ("rollout", "gradcam", "attention", "attribution"):
        with pytest.raises(ValueError, match=rf"'{name}' does not apply.*use one of attnlrp, cp_lrp, ig, gradxinput"):
            explain_map(other, images(), name)
    result = explain_map(other, images(), "attnlrp", target=0)
    assert result.patches.shape == (3, 4, 4)


@pytest.mark.parametrize(("method", "modules"), [("ig", ["captum", "captum.attr"]), ("gradcam", ["pytorch_grad_cam"])])
def test_missing_extra_names_the_install(model, monkeypatch, method, modules):
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ImportError
    with pytest.raises(ImportError, match=r'pip install "vit\[explain\]"'):
        explain_map(model, images(), method)


def test_bootstrap_interval_by_hand():
    values, reference = np.array([1.0, 2.0, 3.0, 6.0]), np.array([2.0, 2.0, 4.0, 4.0])
    resamples = np.array([[0, 0, 0, 0], [3, 3, 3, 3], [0, 1, 2, 3]] * 10)
    interval, ratio = bootstrap_interval(values, reference, resamples)
    means, ratios = np.array([1.0, 6.0, 3.0] * 10), np.array([0.5, 1.5, 1.0] * 10)
    assert interval == pytest.approx(tuple(np.percentile(means, [2.5, 97.5])))
    assert ratio == pytest.approx(tuple(np.percentile(ratios, [2.5, 97.5])))


def test_benchmark_numbers_equal_faithfulness_and_serialise(model, tmp_path):
    x, labels = images(6), torch.tensor([0, 1, 2, 3, 0, 1])
    bench = benchmark_methods(model, x, labels, ["rollout", "attnlrp", "gradxinput"], steps=4, bootstrap=200)
    maps = {name: explain_map(model, x, name).patches for name in ("rollout", "attnlrp", "gradxinput")}
    direct = faithfulness(model, x, maps, steps=4, num_random=5)
    for name in [*maps, "random"]:
        score = bench.scores[name]
        assert score.deletion_auc == pytest.approx(direct["deletion_auc"][name], abs=1e-6)
        assert score.insertion_auc == pytest.approx(direct["insertion_auc"][name], abs=1e-6)
        assert score.deletion_ratio == pytest.approx(score.deletion_auc / direct["deletion_auc"]["random"])
        assert score.deletion_ci[0] <= score.deletion_auc <= score.deletion_ci[1]
        assert score.insertion_ratio_ci[0] <= score.insertion_ratio <= score.insertion_ratio_ci[1]
        assert len(score.deletion_curve) == 5
    assert bench.scores["random"].deletion_ratio == 1 and bench.scores["random"].seconds_per_image is None
    assert bench.scores["attnlrp"].seconds_per_image > 0
    assert bench.accuracy == pytest.approx(float((model(x).argmax(1) == labels).float().mean()))
    again = benchmark_methods(model, x, labels, ["rollout", "attnlrp", "gradxinput"], steps=4, bootstrap=200)
    assert again.scores["attnlrp"].deletion_ci == bench.scores["attnlrp"].deletion_ci  # seeded
    data = json.loads(json.dumps(bench.to_dict()))
    assert set(data["scores"]) == {"rollout", "attnlrp", "gradxinput", "random"} and data["steps"] == 4
    assert "attnlrp" in bench.table()
    png = bench.plot(tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_benchmark_rejects_bad_requests(model):
    with pytest.raises(ValueError, match="unknown explanation method 'nope'"):
        benchmark_methods(model, images(), methods=["rollout", "nope"])
    with pytest.raises(ValueError, match="needs labels"):
        benchmark_methods(model, images(), methods=["rollout"], target="label")


def test_benchmark_checks_the_extra_of_every_method_before_running_any(model, monkeypatch):
    ran = []
    monkeypatch.setattr(method_benchmark, "explain_map", lambda *args, **kwargs: ran.append(args[2]))
    monkeypatch.setitem(sys.modules, "captum", None)
    monkeypatch.setitem(sys.modules, "captum.attr", None)
    with pytest.raises(ImportError, match=r"'ig' needs the captum package: pip install \"vit\[explain\]\""):
        benchmark_methods(model, images(), methods=["rollout", "attnlrp", "ig"])
    assert ran == []


def test_benchmark_draws_the_curves_in_the_callers_batches(model, monkeypatch):
    sizes = []
    real = method_benchmark.faithfulness
    monkeypatch.setattr(
        method_benchmark, "faithfulness", lambda *a, **kw: sizes.append(kw["batch_size"]) or real(*a, **kw)
    )
    benchmark_methods(model, images(5), methods=["rollout"], steps=2, bootstrap=10, num_random=1, batch_size=3)
    assert sizes == [3]


def test_benchmark_times_each_method_after_an_untimed_warm_up(model, monkeypatch):
    """A fake clock: the method's first call costs 100 s, then 1 s per image; the timing must read exactly 1."""
    now, calls = [0.0], []

    def fake(model, images, target=None):
        calls.append(len(images))
        now[0] += 100.0 if len(calls) == 1 else len(images)
        return MethodMap(torch.rand(len(images), 4, 4))

    monkeypatch.setattr(method_benchmark, "perf_counter", lambda: now[0])
    monkeypatch.setitem(METHODS, "fake", Method("fake", fake, "a clock", True))
    bench = benchmark_methods(model, images(6), methods=["fake"], steps=2, bootstrap=10, num_random=1, batch_size=4)
    assert calls == [1, 4, 2]
    assert bench.scores["fake"].seconds_per_image == 1.0


def test_methods_on_the_fixed_grid_refuse_other_sizes_and_the_rest_take_them(random_vit):
    model = random_vit(**SMALL, dynamic_img_size=True).eval()
    x = torch.randn(2, 3, 24, 24)
    for name in ("rollout", "attribution", "attention", "gradcam"):
        message = rf"^method '{name}' needs images of the model's own size 16x16 \(got 24x24\); attnlrp, cp_lrp, ig, "
        with pytest.raises(ValueError, match=message + "gradxinput take any size$"):
            explain_map(model, x, name)
    with pytest.raises(ValueError, match=r"'rollout' needs images of the model's own size 16x16 \(got 24x24\)"):
        benchmark_methods(model, x, methods=["attnlrp", "rollout"])
    for name in ("attnlrp", "gradxinput"):
        result = explain_map(model, x, name, target=0)
        assert result.patches.shape == (2, 6, 6) and result.pixels.shape == (2, 24, 24)


def test_benchmark_is_silent_by_default_and_reports_every_phase_when_asked(model, monkeypatch, capsys):
    """``show_progress``: each method's maps (timed by the benchmark's own clock, here a fake one: 1 s per image),
    then the curves of each method and of the random order, one line each on stderr; the default prints nothing."""
    now = [0.0]

    def fake(model, images, target=None):
        now[0] += len(images)
        return MethodMap(torch.rand(len(images), 4, 4))

    monkeypatch.setattr(method_benchmark, "perf_counter", lambda: now[0])
    monkeypatch.setitem(METHODS, "fake", Method("fake", fake, "a clock", True))
    x, run = images(6), dict(methods=["fake", "rollout"], steps=2, bootstrap=10, num_random=2, batch_size=4)
    quiet = benchmark_methods(model, x, **run)
    assert capsys.readouterr() == ("", "")
    loud = benchmark_methods(model, x, **run, show_progress=True)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 5
    assert lines[0] == "fake: maps of 6 images in 6.0 s (1000.0 ms/img)"
    assert re.fullmatch(r"rollout: maps of 6 images in \d+\.\d s \(\d+\.\d ms/img\)", lines[1])
    for line, name in zip(lines[2:4], ("fake", "rollout"), strict=True):
        assert re.fullmatch(rf"{name}: deletion/insertion curves of 6 images \(2 steps\) in \d+\.\d s", line)
    assert re.fullmatch(r"random: deletion/insertion curves of 6 images x 2 seeds \(2 steps\) in \d+\.\d s", lines[4])
    assert loud.scores["rollout"].deletion_auc == quiet.scores["rollout"].deletion_auc
