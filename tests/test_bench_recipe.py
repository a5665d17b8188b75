"""The recipe suite: tiny sweeps on scikit-learn's digits, the attention-logit probe against a hand-built reference,
the stable-range verdict and the command line."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from vit.bench.cli import ALL_SUITES, main, parse_args
from vit.bench.harness import BenchError
from vit.bench.recipe_proxy import attention_probe, load_images
from vit.bench.recipe_suite import parse_variant, stable_range, train_run
from vit.models import create_model

TINY = dict(steps=12, batch_size=16, width=16, depth=2, heads=2, device=torch.device("cpu"), probe_every=4)


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    images, labels, source = load_images(None, 300)
    assert images.shape == (300, 3, 32, 32) and images.dtype == torch.uint8 and "digits" in source
    return images, labels


@pytest.mark.parametrize("variant", ["baseline", "qk_norm+layer_scale+z_loss+beta2_095+warmup_3x"])
def test_small_lr_runs_finite(digits, variant):
    result = train_run(*digits, 1e-3, variant, **TINY)
    assert result["steps_run"] == TINY["steps"] and result["nonfinite_step"] is None
    assert math.isfinite(result["final_loss"]) and math.isfinite(result["start_loss"])
    assert math.isfinite(result["max_attn_logit_end"]) and result["max_attn_logit_end"] > 0
    assert len(result["probes"]) == 4  # steps 0, 4, 8 and the last
    for block in result["probes"][-1]["blocks"]:
        assert math.isfinite(block["grad_norm"]) and block["grad_norm"] > 0
        assert 0 < block["update_ratio"] < 1  # a small lr moves the weights a little
        assert 0 < block["entropy"] <= math.log(64) + 1e-4  # 64 patch tokens, no class token
    assert result["warmup_steps"] == (4 if "warmup_3x" in variant else 1)


def test_huge_lr_is_flagged_diverged(digits):
    result = train_run(*digits, 10.0, "baseline", **TINY)
    assert result["diverged"]
    assert result["nonfinite_step"] is not None or result["final_loss"] > math.log(10)  # worse than uniform


def reference_max_logits(model, images: torch.Tensor) -> list[float]:
    """Largest ``q·k/√d`` of every block, from the ``qkv`` weights, head by head with loops."""
    out = []
    with torch.no_grad():
        x, _ = model.embed(images)  # (B, N, C)
        for block in model.blocks:
            attn = block.attn
            h = block.norm1(x)
            qkv = h @ attn.qkv.weight.T + attn.qkv.bias  # (B, N, 3C)
            C, d = x.shape[-1], attn.head_dim
            best = -math.inf
            for head in range(attn.num_heads):
                q = qkv[..., head * d : (head + 1) * d]
                k = qkv[..., C + head * d : C + (head + 1) * d]
                if not isinstance(attn.q_norm, torch.nn.Identity):
                    q = F.layer_norm(q, (d,), attn.q_norm.weight, attn.q_norm.bias, attn.q_norm.eps)
                    k = F.layer_norm(k, (d,), attn.k_norm.weight, attn.k_norm.bias, attn.k_norm.eps)
                for b in range(x.shape[0]):
                    best = max(best, (q[b] @ k[b].T / math.sqrt(d)).max().item())
            out.append(best)
            x = block(x)
    return out


@pytest.mark.parametrize("qk_norm", [False, True])
def test_probe_matches_hand_reference(qk_norm):
    torch.manual_seed(0)
    model = create_model(
        "vit_small_patch4_32", embed_dim=24, depth=3, num_heads=3, class_token=False, global_pool="avg", qk_norm=qk_norm
    )
    for block in model.blocks:  # larger weights than the initialisation: logits far from zero
        block.attn.qkv.weight.data.mul_(8)
        if qk_norm:
            block.attn.q_norm.weight.data.uniform_(0.5, 3)
            block.attn.k_norm.weight.data.uniform_(0.5, 3)
    images = torch.randn(3, 3, 32, 32)
    probe = attention_probe(model, images)
    reference = reference_max_logits(model.eval(), images)
    assert [b["max_logit"] for b in probe["blocks"]] == pytest.approx(reference, rel=1e-4, abs=1e-4)
    assert min(reference) > 1.0
    logits = model(images)
    assert probe["max_output_logit"] == pytest.approx(logits.abs().max().item(), rel=1e-5)
    assert probe["mean_lse"] == pytest.approx(torch.logsumexp(logits, -1).mean().item(), rel=1e-5)


def test_variants_and_stable_range():
    assert parse_variant("qk_norm+beta2_095") == {
        "model": {"qk_norm": True},
        "z_loss": 0.0,
        "betas": (0.9, 0.95),
        "warmup_factor": 1.0,
    }
    with pytest.raises(BenchError, match="unknown recipe change 'qk'"):
        parse_variant("qk+z_loss")
    runs = [
        {"lr": 1e-3, "final_loss": 1.00, "diverged": False},
        {"lr": 3e-3, "final_loss": 1.05, "diverged": False},
        {"lr": 1e-2, "final_loss": 1.20, "diverged": False},
        {"lr": 3e-2, "final_loss": float("nan"), "diverged": True},
    ]
    assert stable_range(runs) == {
        "best_loss": 1.0,
        "best_lr": 1e-3,
        "min_lr": 1e-3,
        "max_lr": 3e-3,
        "lrs": [1e-3, 3e-3],
    }
    assert stable_range(runs, best=0.95)["max_lr"] == 1e-3  # against a better variant's best
    assert stable_range(runs[3:])["max_lr"] is None


def test_cli_parses_and_runs_recipe(tmp_path):
    args = parse_args(["--suite", "recipe", "--recipe_lrs", "1e-3", "1e-2", "--recipe_variants", "qk_norm+z_loss"])
    assert args.precision == "bf16" and args.recipe_lrs == [1e-3, 1e-2] and args.recipe_variants == ["qk_norm+z_loss"]
    assert args.data_dir is None and args.recipe_steps == 300
    assert parse_args(["--suite", "model"]).precision == "fp32"
    assert "recipe" not in ALL_SUITES  # --suite all does not train the sweep
    report_path = tmp_path / "recipe.json"
    report = main(
        [
            "--suite=recipe",
            "--device=cpu",
            "--recipe_lrs=1e-3",
            "--recipe_variants",
            "baseline",
            "z_loss",
            "--recipe_steps=4",
            "--recipe_batch_size=8",
            "--recipe_width=16",
            "--recipe_depth=1",
            "--recipe_train_images=64",
            "--recipe_eval_images=16",
            f"--json={report_path}",
        ]
    )
    written = json.loads(report_path.read_text())
    assert written["settings"]["precision"] == "bf16" and "digits" in written["recipe"]["data"]
    assert [r["variant"] for r in written["recipe"]["runs"]] == ["baseline", "z_loss"]
    assert set(written["recipe"]["stable"]) == {"baseline", "z_loss"}
    assert report["recipe"]["proxy"] == {
        "width": 16,
        "depth": 1,
        "heads": 2,
        "batch_size": 8,
        "steps": 4,
        "precision": "bf16",
        "train_images": 48,
        "eval_images": 16,
    }
    with pytest.raises(SystemExit):
        main(["--suite=recipe", "--device=cpu", "--recipe_variants", "nope"])
