"""vit explain's HTML report: every method side by side, opening on the explorer and rendered in a browser; a
checkpoint alone explained from an empty folder; the faithfulness tables of the docs generated from the results; the
progress lines on stderr and only the results on stdout."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import fields

import numpy as np
import pytest
import torch
from explain_inputs import ROOT, image_files, model_inputs
from PIL import Image

from vit import ImageDataModule
from vit.bench.explorer_suite import find_chromium

pytestmark = pytest.mark.usefixtures("keep_threads")  # the command sets torch's threads


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
