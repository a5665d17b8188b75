"""timm's own model contract: timm's tests on our presets, torch.fx tracing and torch.export of every preset.

The reference for the first test is timm's ``tests/test_models.py`` of the installed timm's source release, run
unchanged on our presets registered in timm's registry (``vit.models.register_timm_models``). The file is not part of
this repository: ``.ci/fetch_timm_tests`` puts it under ``build/timm-tests/`` (CI runs it before the tests; no network
at test time). Without it the test skips, under CI (``CI`` set) it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import timm
import torch

from vit.models import create_model, list_models, model_config

ROOT = Path(__file__).resolve().parents[1]
TIMM_TESTS = ROOT / "build" / "timm-tests" / f"timm-{timm.__version__}" / "tests" / "test_models.py"

# timm's tests the contract asks for, with the batch size each is parametrised with (part of the test's id).
TIMM_TESTS_RUN = {
    "test_model_forward": 1,
    "test_model_backward": 2,
    "test_model_default_cfgs_non_std": 1,
    "test_model_forward_intermediates": 1,
    "test_model_forward_intermediates_features": 1,  # features_only=True: timm's FeatureGetterNet
    "test_model_forward_fx": 1,
    "test_model_backward_fx": 2,
}
# Every preset, in two runs that pytest-xdist can give to two workers: the tiny ones (every attention kind and head at
# CIFAR size, and the ImageNet-sized input; about 90 s of CPU) and the wider and deeper ones (about 200 s).
TIMM_PRESETS = {
    "tiny": [name for name in list_models() if name.startswith("vit_tiny_")],
    "small_and_base": [name for name in list_models() if not name.startswith("vit_tiny_")],
}


@pytest.mark.slow
@pytest.mark.parametrize("group", list(TIMM_PRESETS))
def test_timms_model_tests_pass_on_our_presets(tmp_path, group):
    if not TIMM_TESTS.exists():
        why = f"timm's tests/test_models.py of timm {timm.__version__} is not at {TIMM_TESTS}: run .ci/fetch_timm_tests"
        if os.environ.get("CI"):
            pytest.fail(f"CI needs timm's model tests: {why}")
        pytest.skip(why)
    ids = [
        f"{TIMM_TESTS}::{test}[{batch}-vit_pkg_{name.removeprefix('vit_')}]"
        for test, batch in TIMM_TESTS_RUN.items()
        for name in TIMM_PRESETS[group]
    ]
    report = tmp_path / "timm.xml"
    # Registered before timm's file is collected: its parametrisations read timm's registry at import.
    run = "import sys, pytest, vit.models; vit.models.register_timm_models(); sys.exit(pytest.main(sys.argv[1:]))"
    options = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", f"--junitxml={report}", f"--rootdir={tmp_path}"]
    result = subprocess.run(
        [sys.executable, "-c", run, *options, *ids], capture_output=True, text=True, cwd=tmp_path, timeout=1800
    )
    assert result.returncode == 0, result.stdout[-6000:]
    cases = ET.parse(report).getroot().iter("testcase")
    outcomes = {case.get("name"): [child.tag for child in case] for case in cases}
    assert len(outcomes) == len(ids)
    assert all(not tags for tags in outcomes.values()), outcomes  # no failure, error or skip


def _small(name: str):
    """Preset ``name`` with three blocks of width 32 on its own input, its local blocks kept (the last one global)."""
    local = {"global_attn_indexes": (2,)} if model_config(name).get("global_attn_indexes") else {}
    return create_model(name, depth=3, embed_dim=32, num_heads=2, **local)


@pytest.mark.slow
@pytest.mark.parametrize("name", list_models())
def test_every_preset_traces_with_torch_fx_forward_and_backward(name):
    """torch.fx.symbolic_trace as it is: the graph's logits and every parameter's gradient equal the model's."""
    model = _small(name).train()  # dropout and drop-path are 0: training mode is deterministic
    x = torch.randn(2, 3, *model.patch_embed.img_size)
    graph = torch.fx.symbolic_trace(model)  # it holds the model's own parameters
    grads = []
    for module in (model, graph):
        model.zero_grad()
        module(x).square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert len(grads[0]) == len(list(model.parameters()))
    for n, grad in grads[0].items():
        torch.testing.assert_close(grads[1][n], grad, atol=1e-6, rtol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(graph.eval()(x), model.eval()(x), atol=1e-5, rtol=1e-5)


def test_a_traced_graph_still_checks_its_input(tiny_vit):
    for name in ("vit_tiny_patch4_32", "vit_tiny_window_patch4_32"):
        overrides = {"global_attn_indexes": (1,)} if "window" in name else {}
        graph = torch.fx.symbolic_trace(tiny_vit(name, **overrides).eval())
        with pytest.raises(ValueError, match=r"input image size \(36, 32\) does not match the model's img_size"):
            graph(torch.randn(1, 3, 36, 32))


@pytest.mark.slow
@pytest.mark.parametrize("name", list_models())
def test_every_preset_exports_with_torch_export(name):
    model = _small(name).eval()
    x = torch.randn(2, 3, *model.patch_embed.img_size)
    program = torch.export.export(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model(x), atol=1e-5, rtol=1e-5)
