"""Choosing the explanation method by measurement (:func:`vit.explain.tune_method`), storing the choice beside the
checkpoint (:mod:`vit.explain.choice`) and using it wherever no method is named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from vit.explain import explain_map, faithfulness, tune_method
from vit.explain.choice import MethodChoice, StaleChoice, choice_path, read_choice, stored_methods, write_choice
from vit.explain.command import main
from vit.explain.tuning import CANDIDATES


@pytest.fixture(scope="module")
def trained(trained_batch):
    """The session's tiny digits model (global attention: every removal applies) and 10 validation images."""
    model, images, labels = trained_batch
    return model, images[:10], labels[:10]


def test_the_choice_is_the_argmax_of_the_mean_srg_measured_independently(random_vit, one_thread):
    """Each method's SRG per removal, recomputed here with ``faithfulness`` on the method's own maps (the same batch
    size, so that ROAD draws the same noise), averaged over the removals: ``tune_method`` reports the same numbers
    and chooses the largest."""
    model = random_vit(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=5).eval()
    images = torch.randn(10, 3, 16, 16)
    methods, removals = ["rollout", "attnlrp", "attribution", "gradxinput"], ("mean", "drop", "road")
    tuning = tune_method(model, images, methods=methods, removals=removals, steps=4, tune_gammas=False, batch_size=8)
    preds = model(images).argmax(-1)
    expected = {}
    for name in methods:
        maps = {name: explain_map(model, images, name, preds).patches}
        srg = [faithfulness(model, images, maps, preds, steps=4, baseline=r, num_random=0, batch_size=8)["srg"][name]
               for r in removals]  # fmt: skip
        expected[name] = sum(srg) / len(srg)
    measured = {c.method: c.mean_srg for c in tuning.candidates}
    assert list(measured) == methods
    for name in methods:
        assert measured[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-7)
    ranked = sorted(expected.values())
    assert ranked[-1] - ranked[-2] > 1e-3  # no near-tie decides the test
    assert tuning.method == max(expected, key=expected.get)
    assert tuning.chosen.mean_srg == max(measured.values())
    assert "<- chosen" in tuning.table().splitlines()[1 + methods.index(tuning.method)]


def test_lrp_methods_are_measured_with_their_tuned_gamma(trained, one_thread):
    """With ``tune_gammas``, AttnLRP's candidate is its gamma tuning's choice (same SRGs, same options)."""
    model, images, _ = trained
    tuning = tune_method(model, images[:6], methods=["attnlrp", "rollout"], removals=("mean",), steps=2)
    gamma = tuning.gamma["attnlrp"]
    candidate = tuning.candidates[0]
    assert candidate.options == gamma.options() and candidate.srg == gamma.chosen.srg
    assert tuning.options == {"attnlrp": gamma.options()}
    assert set(tuning.gamma) == {"attnlrp"}


def test_default_candidates_and_refusals(trained, random_vit):
    model, images, _ = trained
    assert "ig" not in CANDIDATES and "gradcam" not in CANDIDATES  # 16 passes per image; an optional extra
    window = random_vit(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=3, window_size=2)
    with pytest.raises(ValueError, match="token drop does not apply to this model"):
        tune_method(window, torch.randn(2, 3, 16, 16), removals=("drop",))
    with pytest.raises(ValueError, match="unknown explanation method 'nope'"):
        tune_method(model, images, methods=["nope"])
    with pytest.raises(ValueError, match="target='label' needs labels"):
        tune_method(model, images, methods=["rollout"], target="label")


def choice_for(checkpoint: Path, method: str = "rollout") -> MethodChoice:
    from vit.explain.choice import file_sha256

    return MethodChoice(method, {"attnlrp": {"gamma": 0.1, "embed_gamma": 0.0}}, 0.2, ["mean"], 8,
                        file_sha256(checkpoint), [], {"date": "2026-12-05T09:00:00+00:00"})  # fmt: skip


def test_the_stored_choice_is_read_back_and_a_changed_checkpoint_is_not_trusted(trained_checkpoint, tmp_path):
    checkpoint = tmp_path / "last.ckpt"
    shutil.copy(trained_checkpoint, checkpoint)
    assert read_choice(checkpoint) is None and stored_methods(checkpoint) == (["attnlrp"], {})
    before = checkpoint.read_bytes()
    path = write_choice(checkpoint, choice_for(checkpoint, "attnlrp"))
    assert path == tmp_path / "last.ckpt.explain.json" == choice_path(checkpoint)
    assert checkpoint.read_bytes() == before  # the checkpoint is only read
    assert read_choice(checkpoint) == choice_for(checkpoint, "attnlrp")
    assert stored_methods(checkpoint) == (["attnlrp"], {"attnlrp": {"gamma": 0.1, "embed_gamma": 0.0}})
    checkpoint.write_bytes(before + b"more training")  # last.ckpt rewritten by more training
    with pytest.raises(StaleChoice, match="was measured on another version of last.ckpt"):
        read_choice(checkpoint)
    assert stored_methods(checkpoint) == (["attnlrp"], {})
    path.write_text("{not json")
    with pytest.raises(StaleChoice, match="is not a stored method choice"):
        read_choice(checkpoint)


def run(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as stop:
        code = stop.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_tune_stores_the_choice_that_explain_then_uses_unless_methods_are_named(trained_checkpoint, tmp_path, capsys):
    """``--tune`` writes ``<checkpoint>.explain.json`` (the checkpoint unchanged) and ``method.json``; later runs
    without ``--methods`` draw the stored method, and an explicit ``--methods`` wins over it."""
    checkpoint = tmp_path / "run" / "last.ckpt"
    checkpoint.parent.mkdir()
    shutil.copy(trained_checkpoint, checkpoint)
    before = checkpoint.read_bytes()
    common = ["--split", "val", "--limit", "4", "--overlays", "false", "--mistakes", "0"]
    code, out, err = run(capsys, checkpoint, *common, "--methods", "rollout,attribution", "--tune", "--tune_images",
                         "6", "--removal", "mean,drop", "--steps", "2", "--out", tmp_path / "tuned")  # fmt: skip
    assert code == 0, err
    assert checkpoint.read_bytes() == before
    method = json.loads((tmp_path / "tuned" / "method.json").read_text())
    scores = {c["method"]: c["mean_srg"] for c in method["candidates"]}
    assert method["method"] == max(scores, key=scores.get) and set(scores) == {"rollout", "attribution"}
    stored = read_choice(checkpoint)
    assert stored.method == method["method"] and stored.mean_srg == scores[stored.method]
    assert stored.removals == ["mean", "drop"] and stored.num_images == 6
    assert stored.header["command"].startswith("vit explain ") and "--tune" in stored.header["command"]
    assert f"chosen: {stored.method}, stored in {choice_path(checkpoint)}" in out
    assert sorted(p.name for p in (tmp_path / "tuned").glob("*_grid.png")) == ["attribution_grid.png",
                                                                             "rollout_grid.png"]  # fmt: skip
    code, _, err = run(capsys, checkpoint, *common, "--out", tmp_path / "stored")
    assert code == 0, err
    assert f"method: {stored.method}, mean SRG" in err and "stored by --tune" in err
    assert [p.name for p in (tmp_path / "stored").glob("*_grid.png")] == [f"{stored.method}_grid.png"]
    other = "attribution" if stored.method == "rollout" else "rollout"
    code, _, err = run(capsys, checkpoint, *common, "--methods", other, "--out", tmp_path / "named")
    assert code == 0, err
    assert [p.name for p in (tmp_path / "named").glob("*_grid.png")] == [f"{other}_grid.png"]


def test_explain_without_methods_takes_the_checkpoints_stored_choice(trained_checkpoint, trained, tmp_path):
    from vit.explain import explain

    model, images, _ = trained
    checkpoint = tmp_path / "last.ckpt"
    shutil.copy(trained_checkpoint, checkpoint)
    assert list(explain(model, images[:2], checkpoint=checkpoint, statistics=False).maps) == ["attnlrp"]
    write_choice(checkpoint, choice_for(checkpoint, "cp_lrp"))
    assert list(explain(model, images[:2], checkpoint=checkpoint, statistics=False).maps) == ["cp_lrp"]
    assert list(explain(model, images[:2], ["rollout"], checkpoint=checkpoint, statistics=False).maps) == ["rollout"]
