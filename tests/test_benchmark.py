"""vit.bench: measurement helpers against hand-computed numbers, and each suite's plumbing at tiny sizes."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vit.bench import main
from vit.bench.cli import parse_args
from vit.bench.flops import count_flops, peak_tflops
from vit.bench.harness import summarize
from vit.bench.memory import TensorMemoryTracker
from vit.bench.model_suite import bench_grad_checkpointing
from vit.kernels import neighborhood as neighborhood_kernel
from vit.layers import WindowAttention
from vit.models import VisionTransformer, model_config

ROOT = Path(__file__).resolve().parents[1]
TINY = {"depth": 2, "embed_dim": 32, "num_heads": 2}


def test_memory_tracker_counts_live_storages_only():
    with TensorMemoryTracker() as tracker:
        a = torch.empty(1000, 1000)  # 4 MB
        b = torch.empty(500, 1000)  # 2 MB
        b.view(-1).add_(1.0)  # a view and an in-place op allocate nothing
        del a
        c = torch.empty(2000, 1000)  # 8 MB: 10 MB live
        assert tracker.current == 10_000_000
        del b, c
        assert tracker.current == 0
    assert tracker.peak == 10_000_000


def test_memory_tracker_sees_backward_temporaries():
    weight = torch.randn(256, 256, requires_grad=True)
    x = torch.randn(64, 256)
    with TensorMemoryTracker() as tracker:
        (x @ weight).relu().sum().backward()
    # The weight gradient (256, 256) is created while the (64, 256) gradient of the matmul output is alive; at most
    # the three (64, 256) tensors of the graph (matmul output, relu output, gradient) exist besides it.
    assert 4 * (64 * 256 + 256 * 256) <= tracker.peak <= 4 * (3 * 64 * 256 + 256 * 256) + 64
    assert tracker.current == 4 * 256 * 256  # only the weight gradient outlives the step
    assert weight.grad is not None


def _expected_flops(model: VisionTransformer) -> tuple[int, int]:
    """Matrix-product FLOPs of one image: forward, and a training step (the image itself needs no gradient)."""
    D, pe = model.embed_dim, model.patch_embed
    patches, N = pe.num_patches, pe.num_patches + model.num_prefix_tokens
    patch_embed = 2 * patches * pe.proj.in_channels * pe.patch_size[0] * pe.patch_size[1] * D
    forward = patch_embed + 2 * D * model.num_classes
    for block in model.blocks:
        forward += 2 * N * D * (4 * D + 2 * block.mlp.fc1.out_features)  # qkv, proj, fc1, fc2
        attn = block.attn
        pairs = int(attn.dense_mask().sum()) if isinstance(attn, WindowAttention) else N * N
        forward += 4 * D * pairs  # q·k and weights·v over the attended pairs only
    return forward, 3 * forward - patch_embed


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("vit_tiny_patch4_32", {}),
        # 8x8 grid in 3x3 windows, the second block shifted by 1: uneven edge windows of several shapes.
        ("vit_tiny_window_patch4_32", {"depth": 3, "window_size": 3, "global_attn_indexes": (2,)}),
    ],
)
def test_flop_count_matches_hand_count(name, overrides):
    config = model_config(name, **{**TINY, **overrides})
    counted = count_flops(config)
    forward, train = _expected_flops(VisionTransformer(**config))
    assert counted["forward_gflops_per_image"] * 1e9 == pytest.approx(forward, rel=1e-9)
    assert counted["train_gflops_per_image"] * 1e9 == pytest.approx(train, rel=1e-9)


def test_peak_table_and_summary():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("Tesla T4") is None
    spread = summarize([4.0, 1.0, 3.0, 2.0, 5.0])
    assert spread == {"median": 3.0, "q1": 2.0, "q3": 4.0, "min": 1.0, "max": 5.0}


def test_model_suite_compares_with_timm_on_the_same_weights(tmp_path):
    path = tmp_path / "model.json"
    report = main(
        ["--suite", "model", "--device", "cpu", "--models", "vit_tiny_patch4_32", "--batch_sizes", "4"]
        + ["--override", json.dumps(TINY), "--rounds", "3", "--steps", "1", "--warmup", "1", "--json", str(path)]
    )
    assert json.loads(path.read_text()) == json.loads(json.dumps(report, default=str))
    for key in ("date", "torch", "timm", "device_name", "threads", "settings"):
        assert report[key] is not None, key
    assert report["settings"]["override"] == TINY and report["settings"]["rounds"] == 3
    (result,) = report["model"]["results"]
    assert result["logit_max_abs_diff"] <= 1e-5
    model = VisionTransformer(**model_config("vit_tiny_patch4_32", **TINY))
    params = sum(p.numel() for p in model.parameters())
    for phase in ("train", "inference"):
        p = result[phase]
        assert len(p["ours_rounds"]) == len(p["timm_rounds"]) == len(p["ratios"]) == 3
        ratios = [a / b for a, b in zip(p["ours_rounds"], p["timm_rounds"], strict=True)]
        assert p["ratios"] == pytest.approx(ratios)
        assert p["median_ratio"] == pytest.approx(statistics.median(ratios))
        assert p["ours_images_per_s"]["median"] == pytest.approx(statistics.median(p["ours_rounds"]))
        assert len(p["cpu_time_ratios"]) == 3 and p["median_cpu_time_ratio"] > 0
        # Peaks include the parameters (and, when training, AdamW's two moments and the gradients).
        floor = 4 * params * (4 if phase == "train" else 1) / 2**20
        assert p["ours_peak_memory_mib"] > floor and p["timm_peak_memory_mib"] > floor
    assert [c["passed"] for c in report["model"]["checks"] if "logits" in c["name"]] == [True]
    # The checkpointing row measures the first model at its batch size when --models is given.
    ckpt = report["model"]["grad_checkpointing"]
    assert (ckpt["model"], ckpt["batch_size"]) == ("vit_tiny_patch4_32", 4)
    assert ckpt["memory_ratio"] == pytest.approx(ckpt["with_peak_mib"] / ckpt["without_peak_mib"])
    (row,) = [c for c in report["model"]["checks"] if "grad checkpointing" in c["name"]]
    assert row["name"] == "vit_tiny_patch4_32 batch 4 grad checkpointing peak activation memory <= 0.5x without"
    assert row["passed"] == (ckpt["memory_ratio"] <= 0.5)


def test_grad_checkpointing_row_counts_the_step_peak_with_and_without():
    """Without checkpointing the peak holds every block's activations; with it, the block inputs and one block's."""
    override = {**TINY, "depth": 6}
    result = bench_grad_checkpointing("vit_tiny_patch4_32", 8, device=torch.device("cpu"), override=override)
    model = VisionTransformer(**model_config("vit_tiny_patch4_32", **override))
    grads = sum(p.numel() for p in model.parameters()) * 4 / 2**20
    tokens = 8 * 65 * 32 * 4 / 2**20  # one (B, N, C) fp32 tensor
    assert result["without_peak_mib"] > grads + 6 * 8 * tokens  # at least eight token-sized tensors per block
    assert result["with_peak_mib"] < result["without_peak_mib"] / 2
    assert result["memory_ratio"] == pytest.approx(result["with_peak_mib"] / result["without_peak_mib"])
    assert result["without_step_s"] > 0 and result["with_step_s"] > 0


def test_model_suite_reports_a_window_preset_without_timm():
    report = main(
        ["--suite", "model", "--device", "cpu", "--models", "vit_tiny_window_patch4_32", "--batch_sizes", "2"]
        + ["--override", json.dumps({**TINY, "global_attn_indexes": [1]}), "--rounds", "2", "--warmup", "0"]
    )
    (result,) = report["model"]["results"]
    assert result["logit_max_abs_diff"] is None and "timm" in result["timm_note"]
    assert "median_ratio" not in result["train"] and len(result["train"]["ours_rounds"]) == 2


def test_attention_suite_rows():
    report = main(
        ["--suite", "attention", "--device", "cpu", "--attn_grids", "6", "9", "--window_sizes", "3", "4"]
        + ["--sliding_sizes", "3", "7", "--attn_dim", "32", "--attn_heads", "2", "--attn_tokens", "200"]
        + ["--attn_reps", "2", "--linear_maps"]
    )
    rows = report["attention"]["results"]
    # grid 6: global, w3, w4, s3 (s7 does not fit); grid 9: global, w3, w4, s3, s7
    assert [(r["grid"], r["layer"], r["divisible"], r["window"], r["kernel"]) for r in rows] == [
        (6, "global", None, None, None),
        (6, "window 3", True, 3, None),
        (6, "window 4", False, 4, None),
        (6, "sliding 3", None, None, 3),
        (9, "global", None, None, None),
        (9, "window 3", True, 3, None),
        (9, "window 4", False, 4, None),
        (9, "sliding 3", None, None, 3),
        (9, "sliding 7", None, None, 7),
    ]
    for r in rows:
        assert r["tokens"] == 1 + r["grid"] ** 2 and r["batch"] == max(1, 200 // r["tokens"])
        assert r["us_per_token"] == pytest.approx(r["ms"] * 1e3 / (r["batch"] * r["tokens"]))
        assert r["us_per_token"] == pytest.approx(statistics.median(r["ms_rounds"]) * 1e3 / (r["batch"] * r["tokens"]))
        assert r["kib_per_token"] > 0 and r["us_per_token_cpu_time"] > 0
    assert all(r["speedup_vs_global"] == 1.0 for r in rows if r["layer"] == "global")
    checks = report["attention"]["checks"]
    # flatness for each local layer on two grids or more (sliding 7 only fits grid 9); no 64x64 grid: no speed-up
    assert [c["name"].split(":")[0] for c in checks] == ["window 3", "window 4", "sliding 3"]
    clock = "CPU time" if torch.get_num_threads() == 1 else "wall clock"
    assert all(c["detail"].endswith(f"({clock})") for c in checks)
    # The report says which CPU path the sliding rows measured.
    path = "the fused kernel" if neighborhood_kernel.available() else "tiles; the kernel is unavailable: "
    assert report["attention"]["notes"][-1].startswith(f"sliding windows on the CPU: {path}")


def test_attention_checks_read_the_per_token_series(monkeypatch):
    """The PASS/FAIL lines against hand-made timings: flat within ±15 %, and 5x faster than global at 64x64."""
    from vit.bench import attention_suite

    per_token = {"global": {16: 1.0, 64: 10.0}, "window 7": {16: 1.0, 64: 1.1}, "sliding 7": {16: 1.0, 64: 2.1}}

    def fake_cases(grid, *, device, windows, kernels=(), **layer):
        names = ["global"] + [f"window {w}" for w in windows] + [f"sliding {k}" for k in kernels]
        return [
            {
                "grid": grid,
                "tokens": 1,
                "batch": 1,
                "layer": n,
                "window": None,
                "kernel": None,
                "divisible": None,
                "run": (lambda n=n: per_token[n][grid]),
            }
            for n in names
        ]

    monkeypatch.setattr(attention_suite, "attention_cases", fake_cases)
    monkeypatch.setattr(attention_suite, "timed", lambda fn, steps, device: (fn() * 1e-6, fn() * 1e-6))
    monkeypatch.setattr(attention_suite, "peak_bytes", lambda fn, device: 1024)
    report = main(
        ["--suite", "attention", "--device", "cpu", "--attn_grids", "16", "64", "--window_sizes", "7"]
        + ["--sliding_sizes", "7", "--attn_reps", "3"]
    )
    clock = "CPU time" if torch.get_num_threads() == 1 else "wall clock"
    checks = {
        c["name"].split(" from")[0].split(" faster")[0]: (c["passed"], c["detail"])
        for c in report["attention"]["checks"]
    }
    assert checks == {
        "window 7: per-token time flat within ±15%": (True, checks["window 7: per-token time flat within ±15%"][1]),
        "window 7: >= 5x": (True, f"9.09x ({clock})"),
        "sliding 7: per-token time flat within ±15%": (False, checks["sliding 7: per-token time flat within ±15%"][1]),
        "sliding 7: >= 5x": (False, f"4.76x ({clock})"),
    }
    assert checks["window 7: per-token time flat within ±15%"][1].startswith("largest deviation 10.0%")
    assert checks["sliding 7: per-token time flat within ±15%"][1].startswith("largest deviation 110.0%")


SHARD_CROP = "shard -> RRC 224 -> flip"


def test_data_suite_rows(tmp_path):
    pytest.importorskip("albumentations")
    report = main(
        ["--suite", "data", "--device", "cpu", "--data_images", "3", "--data_samples", "4", "--data_rounds", "1"]
        + ["--jpeg_size", "96", "128", "--json", str(tmp_path / "data.json")]
    )
    data = report["data"]
    assert data["jpeg"]["files"] == 3 and data["jpeg"]["height_width"] == [96, 128] and data["jpeg"]["mean_kib"] > 1
    pipelines = {(r["pipeline"], r["implementation"], r["decoder"]) for r in data["results"]}
    assert ("CIFAR preset (pad-crop, flip, normalise)", "albumentations (ours)", "–") in pipelines
    assert ("JPEG -> RRC 224 -> flip -> normalise", "torchvision v2", "decode_jpeg") in pipelines
    assert all(r["images_per_s"] > 0 and r["images_per_cpu_s"] > 0 for r in data["results"])
    rates = [c for c in data["checks"] if "the folder loader" not in c["name"]]
    assert all(c["detail"].endswith("/s)") and "per CPU second" in c["detail"] for c in rates)
    normalised_on = {
        (r["implementation"], r["normalise"]) for r in data["results"] if r["pipeline"].startswith("CIFAR")
    }
    assert normalised_on == {
        ("albumentations (ours)", "device"),
        ("albumentations (ours)", "worker"),
        ("torchvision v2", "worker"),
        ("BatchAugment (ours, batch 512)", "device"),
    }
    inputs = {r["input"] for r in data["results"] if r["implementation"].startswith("BatchAugment")}
    assert inputs == {"512x3x32x32 uint8 tensor"}
    # The targets are checked on what the loaders run: the batched augmentation on one core, and ImageDataModule's
    # workers (uint8 out, normalised on the device).
    # workers (uint8 out, normalised on the device), and the shard loader's worker against the folder loader's.
    assert [c["name"].split(" [")[0] for c in rates] == [
        "CIFAR preset (pad-crop, flip, normalise)",
        "CIFAR preset (pad-crop, flip, normalise)",
        "JPEG -> RRC 224 -> flip -> normalise",
        SHARD_CROP,
    ]
    assert data["checks"][0]["name"].endswith(">= 50000 images/s per core")
    assert rates[-1]["name"].endswith(">= 1200 images per CPU second per worker")
    (speedup,) = [c for c in data["checks"] if "the folder loader" in c["name"]]
    assert speedup["name"].startswith(f"{SHARD_CROP} >= 2x the folder loader")
    assert re.fullmatch(r"\d+\.\d\dx \(\d+ vs \d+ per CPU s\)", speedup["detail"])
    assert torch.get_num_threads() == report["threads"]  # the suite restores the thread count


@pytest.mark.slow
def test_model_and_attention_suites_run_without_the_training_stack(tmp_path):
    """The GPU check relies on ``python -m vit.bench`` importing only torch, timm and vit's model code for these suites.

    (timm itself imports wandb when it is installed, and works without it.)
    """
    out = tmp_path / "bench.json"
    args = ["--suite", "model", "--device", "cpu", "--models", "vit_tiny_patch4_32", "--batch_sizes", "2"]
    args += ["--override", json.dumps(TINY), "--rounds", "1", "--warmup", "0", "--json", str(out)]
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['vit.bench', *{args!r}]\n"
        "runpy.run_module('vit.bench', run_name='__main__', alter_sys=True)\n"
        "sys.argv = ['vit.bench', '--suite', 'attention', '--device', 'cpu', '--attn_grids', '4', "
        "'--window_sizes', '2', '--attn_dim', '16', '--attn_heads', '2', '--attn_reps', '1']\n"
        "runpy.run_module('vit.bench', run_name='__main__', alter_sys=True)\n"
        "training_stack = ('albumentations', 'cv2', 'lightning', 'vit.data', 'vit.lit_module')\n"
        "loaded = [m for m in training_stack if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| vit_tiny_patch4_32 | train |" in done.stdout and "| window 2 |" in done.stdout
    assert json.loads(out.read_text())["model"]["results"][0]["model"] == "vit_tiny_patch4_32"


def test_bad_settings_are_one_error_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(
            ["--suite", "model", "--device", "cpu", "--models", "vit_tiny_patch4_32", "vit_tiny_patch4_32"]
            + ["--batch_sizes", "2", "4", "8"]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: --batch_sizes: give one batch size or one per model (2), got [2, 4, 8]"
    assert not any("Traceback" in line for line in err)


def test_benchmark_keeps_freed_memory_unless_told_not_to(monkeypatch):
    calls = []
    monkeypatch.setattr("vit.bench.cli.keep_freed_memory", lambda: calls.append(1) or True)
    assert parse_args(["--suite", "attention"]).freed_memory_kept is True
    assert parse_args(["--suite", "attention", "--keep_freed_memory", "false"]).freed_memory_kept is False
    assert calls == [1]


def test_package_never_reads_a_folder_beside_the_repository():
    """The benchmark takes its folders as arguments; neither the package nor its script looks outside the repository."""
    for path in [*(ROOT / "vit" / "bench").glob("*.py"), ROOT / "scripts" / "benchmark.py"]:
        text = path.read_text()
        assert '"shared"' not in text and "/shared" not in text and "parents[" not in text, path


def test_per_sample_rate_counts_wall_clock_and_cpu_time():
    """Sleeping costs wall-clock time but no CPU time: the two rates part exactly where waiting is involved."""
    import time

    from vit.bench.data_suite import per_sample_rate

    wall, cpu = per_sample_rate(lambda _: time.sleep(0.01), [None], 5)
    assert wall <= 100.0  # 5 calls took at least 50 ms
    assert cpu > 10 * wall


def test_cpu_grids_above_64_leave_global_attention_out():
    from vit.bench import attention_suite

    layer = {"dim": 8, "heads": 2, "tokens_per_call": 16, "linear_maps": ["relu"]}
    cpu = torch.device("cpu")
    at_64 = attention_suite.attention_cases(64, device=cpu, windows=[4], kernels=[3], **layer)
    above = attention_suite.attention_cases(65, device=cpu, windows=[4], kernels=[3], **layer)
    assert [c["layer"] for c in at_64] == ["global", "window 4", "sliding 3", "linear relu"]
    assert [c["layer"] for c in above] == ["window 4", "sliding 3", "linear relu"]


def test_report_header_is_the_run_header_with_the_settings(tmp_path):
    """The report opens with vit.env.run_header (what ran, when, where, versions, threads, load), the flat version
    keys that the result tables read, and every setting."""
    from vit.bench.cli import run

    argv = ["--suite", "attention", "--device", "cpu", "--attn_grids", "4", "--window_sizes", "--sliding_sizes"]
    args = parse_args([*argv, "--linear_maps", "--attn_dim", "8", "--attn_heads", "2", "--attn_reps", "1"])
    report = run(args, command="vit bench --suite attention")
    assert report["command"] == "vit bench --suite attention" and report["device"] == "cpu"
    assert report["versions"]["torch"] == report["torch"] == torch.__version__ and report["timm"]
    assert report["machine"].startswith(report["device_name"]) and report["threads"] == torch.get_num_threads()
    assert report["settings"]["attn_dim"] == 8 and report["settings"]["freed_memory_kept"] in (True, False)


def test_explorer_cases_match_the_command_line():
    from vit.bench.defaults import EXPLORER_CASES
    from vit.bench.explorer_suite import CASES

    assert tuple(CASES) == EXPLORER_CASES
