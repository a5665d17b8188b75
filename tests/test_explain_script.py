"""scripts/explain.py (vit.explain.command): overlays per method, predictions, the method benchmark's JSON and curves,
bad input (its HTML report: test_explain_report.py; on a shared machine: test_explain_threads.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from explain_inputs import CIFAR_MINI, ROOT, image_files, model_inputs, one_error_line
from PIL import Image

from vit import ImageClassifier, ImageDataModule
from vit.explain import METHODS, benchmark_methods, command

pytestmark = pytest.mark.usefixtures("keep_threads")  # the command sets torch's threads


def stem(file: Path) -> str:
    return f"{file.parent.name}_{file.stem}" if CIFAR_MINI.is_dir() else file.stem  # cat/0970.jpg, ship/0970.jpg


def test_overlays_predictions_and_method_benchmark(checkpoint, tmp_path, explain):
    files = image_files(tmp_path)
    out, areas = tmp_path / "out", tmp_path / "areas.json"
    methods = ["rollout", "attribution", "attnlrp", "gradxinput"]
    result = explain(checkpoint, *files, "--out", out, "--methods", ",".join(methods), "--faithfulness", "--steps", "4",
                     "--json", areas)  # fmt: skip
    assert result.returncode == 0, result.stderr

    model, batch, data = model_inputs(checkpoint, files)
    probs = model(batch).softmax(-1)
    lines = result.stdout.strip().splitlines()
    for line, file, p in zip(lines[:3], files, probs, strict=True):
        path, name, prob = line.split()
        assert path == str(file) and name == data.class_names[int(p.argmax())]
        assert float(prob) == pytest.approx(p.max().item(), abs=1e-3)
        for method in methods:
            with Image.open(out / f"{stem(file)}_{method}.png") as panel:
                assert panel.mode == "RGB" and panel.width > 2 * 224  # image | overlay | colour bar
    assert sorted(p.name for p in out.iterdir() if "grid" in p.name) == sorted(f"{m}_grid.png" for m in methods)
    assert not list(tmp_path.rglob("*.tmp"))

    # The JSON holds what benchmark_methods() gives on the same images, called here independently of the command.
    written = json.loads(areas.read_text())
    direct = benchmark_methods(model, batch, None, methods, steps=4, batch_size=64).to_dict()
    assert written["num_images"] == 3 and written["steps"] == 4 and written["baseline"] == "mean"
    assert list(written["scores"]) == [*methods, "random"] and written["methods"] == methods
    assert written["model"] == "vit_tiny_patch4_32" and written["command"].startswith("vit explain ")
    assert {"date", "machine", "versions"} <= set(written) and written["versions"]["torch"] == torch.__version__
    for method in [*methods, "random"]:
        got, expected = written["scores"][method], direct["scores"][method]
        for key in ("deletion_auc", "insertion_auc", "deletion_ratio", "insertion_ratio"):
            assert got[key] == pytest.approx(expected[key], abs=1e-5), (method, key)
        for key in ("deletion_ci", "insertion_ci", "deletion_ratio_ci", "insertion_ratio_ci"):
            assert got[key] == pytest.approx(expected[key], abs=1e-5), (method, key)
        assert got["deletion_curve"] == pytest.approx(expected["deletion_curve"], abs=1e-5)
        assert (got["seconds_per_image"] is None) == (method == "random")
    assert lines[3].startswith("faithfulness on 3 images (4 steps, mean baseline)")
    table = {line.split()[0]: line.split() for line in lines[5:]}
    assert list(table) == [*methods, "random"]
    for method in methods:  # deletion AUC, then its ratio to random, as printed
        assert float(table[method][1]) == pytest.approx(direct["scores"][method]["deletion_auc"], abs=1e-3)
        assert float(table[method][4]) == pytest.approx(direct["scores"][method]["deletion_ratio"], abs=1e-2)
    curves = out / "faithfulness_curves.png"
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(curves) as picture:
        assert picture.format == "PNG" and picture.width > 600


def test_default_method_and_the_json_beside_the_overlays(checkpoint, tmp_path, explain):
    """Without --methods the default map is drawn (AttnLRP); without --json the benchmark goes into the folder."""
    files = image_files(tmp_path)[:2]
    result = explain(checkpoint, *files, "--out", tmp_path / "o", "--faithfulness", "--steps", "2")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == sorted(
        [f"{stem(f)}_attnlrp.png" for f in files] + ["attnlrp_grid.png", "faithfulness.json", "faithfulness_curves.png"]
    )
    assert list(json.loads((tmp_path / "o" / "faithfulness.json").read_text())["scores"]) == ["attnlrp", "random"]


def test_method_and_target(checkpoint, tmp_path, explain):
    """``--method`` is the older name of ``--methods`` (kept as an alias); ``--target`` is the class explained."""
    files = image_files(tmp_path)[:2]
    result = explain(checkpoint, *files, "--out", tmp_path / "a", "--method", "attribution", "--target", "3")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(
        [f"{stem(f)}_attribution.png" for f in files] + ["attribution_grid.png"]
    )
    result = explain(checkpoint, *files, "--out", tmp_path / "b", "--method", "both")
    assert sorted(p.name for p in (tmp_path / "b").iterdir() if "grid" in p.name) == [
        "attribution_grid.png", "rollout_grid.png"
    ]  # fmt: skip
    result = explain(checkpoint, *files, "--out", tmp_path / "c", "--methods", "cp,gradxinput", "--target", "3")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "c").iterdir() if "grid" in p.name) == [
        "cp_lrp_grid.png", "gradxinput_grid.png"
    ]  # fmt: skip


def test_default_folder_is_new_for_every_run(checkpoint, tmp_path, explain, monkeypatch):
    image = image_files(tmp_path)[0]
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert explain(checkpoint, image, "--method", "rollout").returncode == 0
    folders = sorted((tmp_path / "explanations").iterdir())
    assert len(folders) == 2 and folders[0].name.startswith("tiny-")
    assert all((folder / "rollout_grid.png").is_file() for folder in folders)


def test_validation_split(checkpoint, tmp_path, explain):
    result = explain(checkpoint, "--split", "val", "--limit", "5", "--overlays", "false", "--out", tmp_path / "o")
    assert result.returncode == 0, result.stderr
    data = ImageDataModule(dataset="digits", img_size=32, num_workers=0)
    data.setup("validate")
    index = [0, 90, 180, 269, 359]  # 5 evenly spaced over the 360 validation digits (sorted splits: not one class)
    images = torch.stack([data.val_dataset[i][0] for i in index])
    model = ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu").eval_model.eval()
    preds = model(data.normalize(images)).argmax(-1).tolist()
    labels = torch.tensor([data.val_dataset[i][1] for i in index])
    *rows, accuracy = result.stdout.strip().splitlines()
    assert [line.split()[:2] + line.split()[3:] for line in rows] == [
        [f"val/{i:05d}", str(p), "true", str(int(y)), *(["<-", "wrong"] if p != y else [])]
        for i, p, y in zip(index, preds, labels, strict=True)
    ]  # the image, its prediction, its probability, its true class and a mark on a mistake
    wrong = int((torch.tensor(preds) != labels).sum())
    assert accuracy == f"accuracy {(5 - wrong) / 5:.1%}: {wrong} of 5 images wrong"
    mistakes = ["mistakes.json", "mistakes.png"] if bool((torch.tensor(preds) != labels).any()) else []
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["attnlrp_grid.png", *mistakes]
    result = explain(checkpoint, tmp_path, "--split", "val")  # images and --split together
    assert result.returncode == 2 and result.stderr.startswith("error: vit explain: give image files"), result.stderr


def test_plain_weights_need_a_fitting_model(checkpoint, tmp_path, explain):
    image = image_files(tmp_path)[0]
    weights = tmp_path / "weights.pth"
    torch.save(ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu").model.state_dict(), weights)
    result = explain(weights, image, "--out", tmp_path / "o")
    assert result.returncode == 2 and "--model PRESET" in result.stderr
    result = explain(checkpoint, image, "--out", tmp_path / "o", "--model", "vit_tiny_patch4_32")
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: --model vit_tiny_patch4_32 does not fit {checkpoint}: ")
    assert not (tmp_path / "o").exists()


def test_bad_input_one_line_exit_2_nothing_written(checkpoint, tmp_path, explain):
    image = image_files(tmp_path)[0]
    out, report, areas = tmp_path / "out", tmp_path / "report.html", tmp_path / "areas.json"
    outputs = ("--out", out, "--html", report, "--faithfulness", "--json", areas)
    one_error_line(explain(tmp_path / "missing.ckpt", image, *outputs), "error: checkpoint ")
    (tmp_path / "notes.ckpt").write_text("hello\n")
    one_error_line(explain(tmp_path / "notes.ckpt", image, *outputs), "error: ")
    assert "not a PyTorch checkpoint" in explain(tmp_path / "notes.ckpt", image).stderr
    (tmp_path / "broken.png").write_text("not an image")
    result = explain(checkpoint, image, tmp_path / "broken.png", *outputs)
    one_error_line(result, "error: ")
    assert str(tmp_path / "broken.png") in result.stderr and "BytesIO" not in result.stderr
    (tmp_path / "empty").mkdir()
    one_error_line(explain(checkpoint, tmp_path / "empty", *outputs), "error: no image files (.jpg")
    missing = f"error: {tmp_path / 'nowhere'}: no such image file or folder; pass image files or folders after"
    one_error_line(explain(checkpoint, tmp_path / "nowhere", *outputs), missing)
    one_error_line(
        explain(checkpoint, image, *outputs, "--target", "10"),
        "error: --target 10 out of range: the model has 10 classes (0..9)",
    )
    one_error_line(explain(checkpoint, image, *outputs, "--target", "cat"), "error: --target 'cat' is neither")
    one_error_line(explain(checkpoint, image, *outputs, "--report_block", "5"), "error: --report_block 5 out of")
    one_error_line(explain(checkpoint, image, *outputs, "--methods", "rollout,shap"),
                   "error: --methods: unknown method 'shap': choose from rollout, attribution, attnlrp")  # fmt: skip
    one_error_line(explain(checkpoint, image, *outputs, "--methods", "rollout", "--method", "both"),
                   "error: give --methods or --method, not both")  # fmt: skip
    assert not out.exists() and not report.exists() and not areas.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["broken.png", "empty", "notes.ckpt"]
        + ([] if CIFAR_MINI.is_dir() else ["drawn_0.png", "drawn_1.png", "drawn_2.png"])
    )


def test_inapplicable_method_or_missing_extra_one_line_nothing_written(checkpoint, tmp_path, explain, monkeypatch):
    image = image_files(tmp_path)[0]
    out, report = tmp_path / "out", tmp_path / "report.html"
    outputs = ("--out", out, "--html", report, "--faithfulness")
    # A method that cannot read this model (as rollout cannot read a model without attention weights).
    monkeypatch.setitem(
        METHODS, "attention", replace(METHODS["attention"], reason_not_applicable=lambda model: "no attention here")
    )
    one_error_line(
        explain(checkpoint, image, *outputs, "--methods", "attnlrp,attention"),
        "error: --methods: method 'attention' does not apply to this model (no attention here): use one of rollout,",
    )
    for name, modules in (("ig", ["captum", "captum.attr"]), ("gradcam", ["pytorch_grad_cam"])):
        with monkeypatch.context() as missing:
            for module in modules:
                missing.setitem(sys.modules, module, None)  # `import module` now raises ImportError
            result = explain(checkpoint, image, *outputs, "--methods", f"rollout,{name}")
        one_error_line(result, f"error: --methods {name}: method '{name}' needs the ")
        assert 'pip install "vit[explain]"' in result.stderr
    assert not out.exists() and not report.exists()


@pytest.mark.slow
def test_script_file_is_wired(tmp_path):
    """The script itself (a fresh interpreter): bad input gives one line and exit status 2."""
    image = tmp_path / "x.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(image)
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "explain.py"), str(tmp_path / "none.ckpt"), str(image)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stderr.startswith(f"error: checkpoint {tmp_path / 'none.ckpt'} not found")
    assert done.stderr.count("\n") == 1


def test_removals_sanity_and_heads_from_the_command_line(checkpoint, tmp_path, explain):
    """--removal mean,road,drop: one table per removal (SRG in each), the JSON's removals, the curves; --sanity and
    --heads: their tables and JSON files, with the run header; the report shows all of them."""
    out, page = tmp_path / "o", tmp_path / "r.html"
    result = explain(checkpoint, "--split", "val", "--limit", "4", "--methods", "rollout,attnlrp", "--faithfulness",
                     "--removal", "mean,road,drop", "--steps", "2", "--sanity", "--heads", "--overlays", "false",
                     "--out", out, "--html", page)  # fmt: skip
    assert result.returncode == 0, result.stderr
    tables = [line for line in result.stdout.splitlines() if line.startswith("faithfulness on 4 images")]
    assert [t.split("(")[1].split(")")[0] for t in tables] == ["2 steps, mean baseline", "2 steps, road baseline",
                                                               "2 steps, drop baseline"]  # fmt: skip
    report = json.loads((out / "faithfulness.json").read_text())
    assert list(report["removals"]) == ["mean", "road", "drop"] and report["baseline"] == "mean"
    for removal, bench in report["removals"].items():
        for name in ("rollout", "attnlrp", "random"):
            score = bench["scores"][name]
            assert score["srg"] == pytest.approx(score["lerf_auc"] - score["deletion_auc"]), (removal, name)
            assert score["srg_ci"][0] <= score["srg"] <= score["srg_ci"][1]
    assert report["removals"]["mean"]["scores"] == report["scores"]
    sanity, heads = json.loads((out / "sanity.json").read_text()), json.loads((out / "heads.json").read_text())
    assert sanity["command"] == heads["command"] == report["command"]
    assert [s["stage"] for s in sanity["stages"]["attnlrp"]] == ["head", "block 1", "block 0", "patch embedding"]
    assert len(heads["logit_drop"]) == 2 and len(heads["logit_drop"][0]) == 2
    assert "sanity check, cascading randomisation of 4 images:" in result.stdout
    assert "which heads matter, mean ablation of 4 images:" in result.stdout
    text = page.read_text()
    assert all(f'id="{table}"' in text for table in ("faithfulness", "faithfulness-road", "faithfulness-drop",
                                                     "sanity", "heads"))  # fmt: skip
    # --removal belongs to --faithfulness.
    without = explain(checkpoint, "--split", "val", "--removal", "mean", "--out", tmp_path / "x")
    message = "error: vit explain: --removal chooses how --faithfulness or --tune removes a patch: add one of them"
    one_error_line(without, message)


def test_a_window_model_skips_token_drop_in_one_line(random_vit, capsys):
    from vit.errors import InputError

    window = random_vit(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=5, window_size=2)
    assert command.removals_for(window, ["mean", "drop", "road"]) == ["mean", "road"]
    assert capsys.readouterr().err == (
        "drop: skipped, this model cannot drop tokens (blocks 0, 1 use window attention, which needs the whole patch "
        "grid); mean, road measured\n"
    )
    with pytest.raises(InputError, match=r"^--removal drop does not apply to this model \(blocks 0, 1"):
        command.removals_for(window, ["drop"])


def test_tune_from_the_command_line(checkpoint, tmp_path, explain):
    """--tune: the gamma rule chosen on held-out validation images, printed, in tuning.json with the run header, and
    used for the maps (the faithfulness JSON says with which options). A copy of the checkpoint: --tune stores its
    choice beside it, which later runs would use."""
    checkpoint = Path(shutil.copy(checkpoint, tmp_path / "tiny.ckpt"))
    out = tmp_path / "o"
    result = explain(checkpoint, "--split", "val", "--limit", "4", "--methods", "attnlrp,rollout", "--tune",
                     "--tune_images", "6", "--faithfulness", "--removal", "mean,drop", "--steps", "2",
                     "--overlays", "false", "--out", out)  # fmt: skip
    assert result.returncode == 0, result.stderr
    tuning = json.loads((out / "tuning.json").read_text())["attnlrp"]
    assert tuning["num_images"] == 6 and tuning["removals"] == ["mean", "drop"] and tuning["steps"] == 2
    pairs = [(c["gamma"], c["embed_gamma"]) for c in tuning["candidates"]]
    assert pairs[:6] == [(g, 0.0) for g in (0.0, 0.01, 0.05, 0.1, 0.25, 1.0)]
    assert pairs[6:] == [(pairs[6][0], e) for e in (0.1, 0.25, 1.0, 100.0)]
    assert (tuning["gamma"], tuning["embed_gamma"]) in pairs
    chosen = f"chosen: gamma {tuning['gamma']:g}, embed_gamma {tuning['embed_gamma']:g}"
    assert chosen in result.stdout and "by SRG on 6 held-out validation images (mean, drop)" in result.stdout
    report = json.loads((out / "faithfulness.json").read_text())
    assert report["options"] == {"attnlrp": {"gamma": tuning["gamma"], "embed_gamma": tuning["embed_gamma"]}}


def test_one_image_is_one_image_everywhere_it_is_counted(checkpoint, tmp_path, explain):
    """On one image every count reads "1 image" (the progress lines, the faithfulness line, the report's title)."""
    files = image_files(tmp_path)[:1]
    result = explain(checkpoint, *files, "--out", tmp_path / "o", "--faithfulness", "--steps", "2")
    assert result.returncode == 0, result.stderr
    text = (
        result.stdout
        + result.stderr
        + "".join(
            p.read_text(errors="replace") for p in (tmp_path / "o").rglob("*") if p.suffix in (".html", ".json", ".txt")
        )
    )
    assert "1 image" in text and "1 images" not in text
