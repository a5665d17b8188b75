"""scripts/explain.py (vit.explain.command): overlays per method, predictions, the method benchmark's JSON and curves,
HTML report, bad input."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
import time
import zlib
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit import ImageClassifier, ImageDataModule, env
from vit.bench import cli as bench_cli
from vit.bench.explorer_suite import find_chromium
from vit.bench.harness import default_threads
from vit.data import build_transforms, load_rgb
from vit.explain import METHODS, benchmark_methods, command, pipeline, progress
from vit.explain.command import main
from vit.explain.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
CIFAR_MINI = ROOT.parent / "shared" / "data" / "cifar10-mini" / "test"


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def explain(capsys):
    """``explain(*args)``: the command's ``main(args)`` in this process, with its exit status and output."""

    def run(*args) -> Result:
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as stop:  # bad input: one error line through vit.errors.fail
            code = stop.code
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return run


@pytest.fixture
def checkpoint(trained_checkpoint) -> Path:
    """The session's tiny digits checkpoint (conftest's ``trained_checkpoint``)."""
    return trained_checkpoint


def image_files(folder: Path) -> list[Path]:
    """Three real CIFAR-10 photographs when ../shared has them, else three PNGs drawn here."""
    if CIFAR_MINI.is_dir():
        return [sorted((CIFAR_MINI / name).glob("*.jpg"))[0] for name in ("cat", "ship", "truck")]
    rng = np.random.default_rng(0)
    files = []
    for i in range(3):
        files.append(folder / f"drawn_{i}.png")
        Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(files[-1])
    return files


def model_inputs(checkpoint: Path, files: list[Path]):
    """The model and its normalised inputs, built here the way a user would."""
    module = ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu")
    data = ImageDataModule(dataset="digits", img_size=32)
    transform = build_transforms(data.preset, 32, False, data.mean, data.std, "none")
    return module.eval_model.eval(), torch.stack([transform(image=load_rgb(f))["image"] for f in files]), data


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


def one_error_line(result: Result, start: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(start), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr and result.stdout == ""


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


# ------------------------------------------------------------------------------------------------ HTML report
def test_report_shows_every_method_side_by_side_and_opens_on_the_explorer(checkpoint, tmp_path, explain):
    files = image_files(tmp_path)[:2]
    report = tmp_path / "report.html"
    methods = ["attnlrp", "rollout", "gradxinput"]
    result = explain(checkpoint, *files, "--out", tmp_path / "o", "--overlays", "false", "--html", report, "--methods",
                     ",".join(methods), "--faithfulness", "--steps", "2", "--explorer_bits", "4")  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = report.read_text()
    panels = re.findall(r'<div class="panel">(.*?)</figure></div>', text.split('<section id="report">', 1)[1], re.S)
    assert len(panels) == 2
    for panel, file in zip(panels, files, strict=True):  # the image, then one overlay per method, in order
        assert re.findall(r'alt="([^"]+)"', panel) == [f"image {file.name}"] + [f"{m} of {file.name}" for m in methods]
    data = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', text, re.S)
    payload = json.loads(data.group(1))
    assert set(payload["map_names"]) == set(methods) and len(payload["images"]) == 2 and payload["bits"] == 4
    assert set(payload["faithfulness"]["deletion_auc"]) == {*methods, "random"}
    table = text.split('<table id="faithfulness">', 1)[1].split("</table>", 1)[0]
    assert [re.sub("<.*?>", "", row) for row in re.findall(r"<tr><td>(.*?)</td>", table)] == [*methods, "random"]
    assert table.count("<tr>") == 1 + len(methods) + 1 and "ms / image" in table


@pytest.mark.slow
def test_html_report_renders_in_a_browser(checkpoint, tmp_path, explain):
    files = image_files(tmp_path)
    report = tmp_path / "report.html"
    result = explain(checkpoint, *files, "--out", tmp_path / "o", "--html", report, "--faithfulness", "--steps", "2",
                     "--methods", "rollout,attribution")  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = report.read_text()
    assert text.count('<div class="panel">') == 3 and 'id="faithfulness"' in text
    assert "http://" not in text and "https://" not in text  # self-contained: nothing fetched
    summary = text.split('<section id="report">', 1)[1].split("</section>", 1)[0]  # the summary below the explorer
    images = summary.count("<img ")
    assert images == summary.count('<img src="data:image/png;base64,') and images >= 3 * 3 + 2 + 3 * 2 + 1

    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no chromium on this machine (.ci/run installs Debian's chromium)")
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run([*flags, "--dump-dom", report.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.stdout.count('<div class="panel">') == 3  # the browser parsed one panel per image
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, "--window-size=1200,1600", f"--screenshot={shot}", report.as_uri()], timeout=120,
                   capture_output=True)  # fmt: skip
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float64)
    assert pixels.std() > 20  # not a blank page
    assert (pixels.sum(axis=2) < 600).mean() > 0.1  # a tenth of the page is drawn (not white)


def test_a_checkpoint_alone_explains_from_an_empty_folder(checkpoint, tmp_path, explain, monkeypatch):
    """The training data moved away (its settings name a folder that is not there): class names, statistics and image
    size come from the checkpoint's own description, with no note and no fallback to ImageNet statistics."""
    from vit.checkpoints import METADATA_KEY

    raw = torch.load(checkpoint, weights_only=True)
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    raw[METADATA_KEY]["class_names"] = names
    raw["datamodule_hyper_parameters"] = {"dataset": "imagefolder", "data_dir": "moved-away", "img_size": 32}
    mean, std = raw[METADATA_KEY]["mean"], raw[METADATA_KEY]["std"]
    assert (mean, std) == (list(ImageDataModule(dataset="digits").mean), list(ImageDataModule(dataset="digits").std))
    files = image_files(tmp_path)
    alone = tmp_path / "alone"
    alone.mkdir()
    torch.save(raw, alone / "model.ckpt")
    monkeypatch.chdir(alone)
    result = explain("model.ckpt", *files, "--method", "rollout", "--overlays", "false")
    assert result.returncode == 0 and "note" not in result.stderr, result.stderr
    model, batch, _ = model_inputs(checkpoint, files)  # built by hand with the digits' statistics
    probs = model(batch).softmax(-1)
    for line, file, p in zip(result.stdout.strip().splitlines(), files, probs, strict=True):
        path, name, prob = line.split()
        assert path == str(file) and name == names[int(p.argmax())]
        assert float(prob) == pytest.approx(p.max().item(), abs=1e-3)
    assert sorted(p.name for p in alone.iterdir()) == ["explanations", "model.ckpt"]


def test_faithfulness_tables_in_the_docs_are_generated_from_the_results():
    """docs/explanations.md's faithfulness tables are what scripts/results_tables.py makes of
    docs/results/faithfulness.json (each model as `vit explain --faithfulness` wrote it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_tables", ROOT / "scripts" / "results_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    page = tables.EXPLANATIONS.read_text()
    assert tables.BEGIN in page and tables.render_explanations(page) == page, "run python scripts/results_tables.py"
    models = json.loads(tables.FAITHFULNESS.read_text())["models"]
    for name, report in models.items():
        assert report["command"].startswith("vit explain ") and "--faithfulness" in report["command"]
        for method, score in report["scores"].items():  # each row: deletion AUC, then its ratio to random
            row = f"| {method} | {score['deletion_auc']:.3f} [{score['deletion_ci'][0]:.3f}, "
            assert row in page.split(f"**{name}**", 1)[1], (name, method)
            assert score["deletion_ratio"] == pytest.approx(
                score["deletion_auc"] / report["scores"]["random"]["deletion_auc"]
            )


def test_progress_on_stderr_one_line_per_method_and_phase_stdout_only_the_results(checkpoint, tmp_path, explain):
    """Not a terminal: one plain line per method and phase on stderr (maps, curves, overlays), no carriage return;
    stdout holds the predictions and the table only, exactly as the JSON's numbers print."""
    from vit.explain.method_benchmark import MethodBenchmark, MethodScore
    from vit.explain.outputs import faithfulness_table

    out = tmp_path / "o"
    result = explain(checkpoint, "--split", "val", "--limit", "5", "--methods", "rollout,attnlrp", "--faithfulness",
                     "--steps", "2", "--batch_size", "2", "--out", out)  # fmt: skip
    assert result.returncode == 0, result.stderr
    time = r"in \d+\.\d s"
    expected = [
        rf"load: checkpoint and 5 images {time}; \d+ threads? of \d+ cores, \d+\.\d busy now \(the cores not busy .*\)",
        rf"predictions: classes and attention statistics of 5 images {time}",  # the benchmark computes every map
        rf"rollout: maps of 5 images {time} \(\d+\.\d ms/img\)",
        rf"attnlrp: maps of 5 images {time} \(\d+\.\d ms/img\)",
        rf"rollout: deletion/insertion curves of 5 images \(2 steps\) {time}",
        rf"attnlrp: deletion/insertion curves of 5 images \(2 steps\) {time}",
        rf"random: deletion/insertion curves of 5 images x 5 seeds \(2 steps\) {time}",
        rf"rollout: overlays of 5 images {time}",
        rf"attnlrp: overlays of 5 images {time}",
        rf"explained 5 images {time}: overlays of rollout, attnlrp in {re.escape(str(out))}/, JSON .*",
    ]
    lines = result.stderr.splitlines()
    assert len(lines) == len(expected) and "\r" not in result.stderr, result.stderr
    for line, pattern in zip(lines, expected, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)
    report = json.loads((out / "faithfulness.json").read_text())
    names = {f.name for f in fields(MethodBenchmark)} - {"scores", "maps"}
    bench = MethodBenchmark(scores={name: MethodScore(**score) for name, score in report["scores"].items()},
                            **{name: report[name] for name in names})  # fmt: skip
    predictions = result.stdout.splitlines()[:6]  # a line per image, then the accuracy
    assert [line.split()[0] for line in predictions[:5]] == [f"val/{i:05d}" for i in (0, 90, 180, 269, 359)]
    assert predictions[5].startswith("accuracy ")
    assert result.stdout == "\n".join([*predictions, faithfulness_table(bench)]) + "\n"

    # Without --faithfulness: the maps of the methods rollout does not already give, then the overlays.
    result = explain(checkpoint, "--split", "val", "--limit", "5", "--methods", "rollout,attnlrp", "--out", out / "b")
    lines = result.stderr.splitlines()
    assert result.returncode == 0 and len(lines) == 6 and len(result.stdout.splitlines()) == 6, result.stderr
    assert lines[0].startswith("load: ") and lines[1].startswith("predictions: classes, rollout and attention stat")
    assert re.fullmatch(rf"attnlrp: maps of 5 images {time} \(\d+\.\d ms/img\)", lines[2])
    for line, method in zip(lines[3:5], ("rollout", "attnlrp"), strict=True):
        assert re.fullmatch(rf"{method}: overlays of 5 images {time}", line)


# ------------------------------------------------------------------ a shared machine: threads, logs, pixel limit
@pytest.fixture(autouse=True)
def keep_threads():
    """Each test may set torch's thread count; the next one starts from the one before."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("cores", "load", "expected"),
    [(2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.0, 1), (2, 2.9, 1), (16, 0.0, 16), (16, 3.4, 13), (8, 20.0, 1)],
)
def test_default_threads_are_the_cores_not_busy(cores, load, expected):
    assert default_threads(cores, load) == expected


def test_busy_cores_are_the_busy_ticks_of_this_process_cores_over_the_window(tmp_path, monkeypatch):
    # user nice system idle iowait irq softirq steal guest guest_nice, per core; cpu2 is not this process's
    readings = iter(
        [
            "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 100 0 50 1000 10 0 0 0 0 0\ncpu1 10 0 10 2000 0 0 0 0 0 0\n"
            "cpu2 0 0 0 0 0 0 0 0 0 0\nintr 5 6\n",
            "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 160 5 75 1010 10 0 0 0 0 0\ncpu1 15 0 15 2090 0 0 0 0 0 0\n"
            "cpu2 900 0 0 0 0 0 0 0 0 0\nintr 7 8\n",
        ]
    )
    stat = tmp_path / "stat"
    stat.write_text(next(readings))
    monkeypatch.setattr(env.time, "sleep", lambda seconds: stat.write_text(next(readings)))
    monkeypatch.setattr(env.os, "sched_getaffinity", lambda pid: {0, 1})
    # cpu0: 90 of 100 ticks busy, cpu1: 10 of 100 -> 2 cores x 100 / 200
    assert env.busy_cores(stat=stat) == pytest.approx(1.0)
    monkeypatch.setattr(env, "busy_load", lambda: 0.7)  # without /proc/stat: the load average
    assert env.busy_cores(stat=tmp_path / "missing") == 0.7


def threads_seen(monkeypatch) -> list[int]:
    """Record torch's thread count when the command explains the images."""
    seen: list[int] = []
    explain = pipeline.explain

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return explain(*args, **kwargs)

    monkeypatch.setattr(pipeline, "explain", spy)
    return seen


def test_threads_option_sets_torchs_threads_and_the_first_line_says_so(checkpoint, tmp_path, explain, monkeypatch):
    seen = threads_seen(monkeypatch)
    torch.set_num_threads(2)
    result = explain(
        checkpoint, "--split", "val", "--limit", "3", "--overlays", "false", "--threads", "1", "--out", tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert seen == [1]
    first = result.stderr.splitlines()[0]
    assert re.fullmatch(r"load: checkpoint and 3 images in \d+\.\d s; 1 thread of \d+ cores, \d+\.\d busy now "
                        r"\(--threads\)", first), first  # fmt: skip

    # The default: the cores this process may use minus the busy ones.
    monkeypatch.setattr(env, "available_cores", lambda: 4)
    monkeypatch.setattr(env, "busy_cores", lambda: 1.2)
    result = explain(checkpoint, "--split", "val", "--limit", "3", "--overlays", "false", "--out", tmp_path / "b")
    assert result.returncode == 0, result.stderr
    assert seen == [1, 3]
    assert "; 3 threads of 4 cores, 1.2 busy now (the cores not busy with other processes" in result.stderr

    result = explain(checkpoint, "--split", "val", "--threads", "0", "--out", tmp_path / "c")
    one_error_line(result, "error: vit explain: --threads must be positive, got 0")


def test_bench_threads_option_and_default(monkeypatch):
    bench_cli.parse_args(["--suite", "model", "--threads", "1", "--keep_freed_memory", "false"])
    assert torch.get_num_threads() == 1
    monkeypatch.setattr(bench_cli, "available_cores", lambda: 2)
    monkeypatch.setattr(bench_cli, "busy_cores", lambda: 0.1)
    args = bench_cli.parse_args(["--suite", "model", "--keep_freed_memory", "false"])
    assert args.threads == 2 and torch.get_num_threads() == 2
    monkeypatch.setattr(bench_cli, "busy_cores", lambda: 1.0)
    args = bench_cli.parse_args(["--suite", "model", "--keep_freed_memory", "false"])
    assert args.threads == 1 and torch.get_num_threads() == 1


def test_plain_lines_every_interval_when_stderr_is_not_a_terminal(capsys, monkeypatch):
    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.05)
    quiet = Progress("quiet", 4)
    time.sleep(0.2)
    quiet.close("done")
    assert capsys.readouterr() == ("", "")
    phase = Progress("maps", 4, enabled=True)
    phase.update(1)
    time.sleep(0.3)
    phase.update(2)
    time.sleep(0.3)
    phase.close("done")
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err and lines[-1] == "maps: done"
    assert set(lines[:-1]) <= {"maps: 1/4 images, 0 s", "maps: 3/4 images, 0 s", "maps: 3/4 images, 1 s"}, lines
    assert "maps: 1/4 images, 0 s" in lines and "maps: 3/4 images, 0 s" in lines
    time.sleep(0.2)
    assert capsys.readouterr().err == ""  # nothing after the phase ended


def test_command_reports_long_phases_in_a_log(checkpoint, tmp_path, explain, monkeypatch):
    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.01)
    result = explain(checkpoint, "--split", "val", "--limit", "5", "--methods", "rollout,attnlrp", "--faithfulness",
                     "--steps", "2", "--batch_size", "2", "--overlays", "false", "--out", tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr
    periodic = [line for line in result.stderr.splitlines() if re.fullmatch(r"\w+: \d+/\d+ images, \d+ s", line)]
    assert {line.split(":")[0] for line in periodic} & {"load", "predictions", "rollout", "attnlrp", "random"}
    assert result.stderr.splitlines()[-1].startswith("explained 5 images in ")


def png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` in its header and holds 16 bytes of pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(16))) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def test_max_image_pixels_refuses_from_the_header_in_one_line(checkpoint, tmp_path, explain):
    huge = tmp_path / "huge.png"
    huge.write_bytes(png_header(10_000, 6_000))  # 60 megapixels claimed, never decoded
    result = explain(checkpoint, huge, "--out", tmp_path / "o")
    one_error_line(result, f"error: cannot read image {huge}: 10000x6000 pixels (60 megapixels) is above the limit of "
                           "50,000,000 pixels (50 megapixels): raise the limit with --max_image_pixels")  # fmt: skip

    small = tmp_path / "small.png"
    Image.fromarray(np.zeros((64, 64, 3), dtype=np.uint8)).save(small)
    result = explain(checkpoint, small, "--max_image_pixels", "1000", "--out", tmp_path / "o")
    one_error_line(result, f"error: cannot read image {small}: 64x64 pixels (0.004096 megapixels) is above the limit "
                           "of 1,000 pixels")  # fmt: skip
    assert "--max_image_pixels none for no limit" in result.stderr
    assert not (tmp_path / "o").exists()
    for limit in ("4096", "none"):
        result = explain(checkpoint, small, "--max_image_pixels", limit, "--out", tmp_path / limit)
        assert result.returncode == 0, result.stderr
    result = explain(checkpoint, small, "--max_image_pixels", "0")
    one_error_line(result, "error: vit explain: argument --max_image_pixels: '0' is neither a positive number")


def test_explain_uses_the_default_pixel_limit_of_predict():
    from vit.data.datasets import MAX_IMAGE_PIXELS

    assert command.MAX_IMAGE_PIXELS == MAX_IMAGE_PIXELS
    assert command.build_parser().parse_args(["x.ckpt", "y.png"]).max_image_pixels == MAX_IMAGE_PIXELS
    assert Path(command.__file__).name == "command.py"


def test_the_light_command_names_the_registry_exactly():
    """The parser answers --help without importing the registry, from constants that must stay the registry's."""
    from typing import get_args

    from vit.explain.methods import ALIASES, DEFAULT_METHOD, METHODS
    from vit.explain.rollout import HeadFusion

    assert tuple(METHODS) == command.METHOD_NAMES
    assert command.METHOD_ALIASES == ALIASES
    assert command.DEFAULT_METHOD == DEFAULT_METHOD
    assert get_args(HeadFusion) == command.HEAD_FUSIONS


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
