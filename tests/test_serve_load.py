"""The load-test suite (vit.bench.serve_suite) against a real `vit serve` subprocess on 127.0.0.1: short, bounded
locust runs whose answers are counted by status. Counts only: no timing is asserted."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import threading
import types

import pytest


@pytest.fixture(scope="module")
def load_tools():
    """locust drives, LitServe serves: skip without them, fail under CI."""
    missing = [name for name in ("locust", "litserve") if importlib.util.find_spec(name) is None]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the load tests: {', '.join(missing)} missing (pip install -e '.[dev]')")
        pytest.skip(f"{', '.join(missing)} not installed")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("serve_load")


@pytest.fixture(scope="module")
def image(load_tools, workdir):
    from vit.bench.serve_suite import noise_image

    return noise_image(workdir, 32)


@pytest.fixture(scope="module")
def small_server(load_tools, trained_checkpoint, workdir):
    """`vit serve` of the trained checkpoint with batches of 2 and room for 4 requests in flight."""
    from vit.bench.serve_suite import server_options, serving

    with serving(
        trained_checkpoint, workdir, options=server_options(backend="torch", threads=1, max_batch_size=2, max_queue=4)
    ) as server:
        yield server


def _answered(run: dict) -> int:
    return sum(count for status, count in run["status"].items() if status != "0")


@pytest.mark.slow
def test_overload_is_shed_with_503_and_nothing_is_lost(small_server, image, workdir):
    """16 clients without pause against a queue of 4: the excess is answered 503 at once, the rest 200."""
    from vit.bench.serve_suite import drive

    run = drive(small_server, image, workdir, users=16, rate=0, seconds=3, max_requests=400)
    assert run["sent"] > 0 and run["sent"] <= 400
    assert set(run["status"]) <= {"200", "503"}, run["status"]
    assert run["status"].get("503", 0) > 0 and run["status"].get("200", 0) > 0
    assert run["lost"] == 0 and _answered(run) == run["sent"] and not run["errors"]


@pytest.mark.slow
def test_bad_images_fail_alone(small_server, image, workdir):
    """Every third request of each of 2 paced clients sends bytes that are no image: exactly those get 400."""
    from vit.bench.serve_suite import drive

    run = drive(small_server, image, workdir, users=2, rate=10, seconds=3, bad_every=3)
    assert run["lost"] == 0 and set(run["status"]) <= {"200", "400"}, run["status"]
    assert run["status"]["400"] == run["bad"] > 0
    assert run["status"]["200"] == run["sent"] - run["bad"]


@pytest.mark.slow
def test_a_killed_server_is_counted_as_lost(trained_checkpoint, image, workdir):
    """The fault the overload test must catch: the server killed under load leaves requests unanswered (status 0 or
    never answered), and the run still stops by itself."""  # (when locust starts late, all its requests are refused)
    from vit.bench.serve_suite import drive, server_options, serving

    options = server_options(backend="torch", threads=1, max_batch_size=2, max_queue=8)
    with serving(trained_checkpoint, workdir, options=options) as server:
        killer = threading.Timer(1.5, os.killpg, (server.process.pid, signal.SIGKILL))
        killer.start()
        run = drive(server, image, workdir, users=4, rate=0, seconds=4, timeout=5)
        killer.join()
    assert run["sent"] > 0 and run["status"].get("0", 0) + run["lost"] > 0, run
    assert set(run["status"]) <= {"0", "200", "503"}


@pytest.mark.slow
def test_short_suite_writes_report_and_figure(load_tools, trained_checkpoint, tmp_path):
    """`vit bench --suite serve --serve_short`: the JSON holds every stage, the overload check passes and the goals
    are those the numbers in the JSON give (their verdicts depend on the machine: not asserted)."""
    from PIL import Image

    from vit.bench.cli import main
    from vit.bench.serve_goals import serve_checks

    out = tmp_path / "serve.json"
    argv = ["--suite", "serve", "--serve_model", str(trained_checkpoint), "--serve_short", "--threads", "1",
            "--serve_batch_size", "2", "--serve_queue", "4", "--serve_batch_timeout", "0.005",
            "--json", str(out)]  # fmt: skip
    main(argv)
    entry = json.loads(out.read_text())["serve"]
    assert (entry["max_batch_size"], entry["max_queue"], entry["batch_timeout"]) == (2, 4, 0.005)
    assert entry["offline"]["images_per_s"] > 0 and entry["saturation"]["status"]["200"] > 0
    assert [s["fraction"] for s in entry["loads"]] == [0.5, 2.0]
    assert all(s["lost"] == 0 for s in entry["loads"])
    assert entry["checks"][0]["passed"], entry["checks"][0]  # over saturation: 200 or 503 only, none lost (counts)
    assert [c["passed"] for c in entry["checks"]] == [c["passed"] for c in serve_checks(entry)]  # from the JSON
    assert [b["backend"] for b in entry["backends"]] == ["torch"] and "served_p50_ms" in entry["backends"][0]
    torch_row = entry["backends"][0]  # the server's own time, from the Server-Timing of its answers
    assert 0 < torch_row["own_p50_ms"] < torch_row["own_client_p50_ms"] < torch_row["served_p50_ms"]
    with Image.open(tmp_path / "serve.png") as figure:
        assert figure.format == "PNG" and figure.size[0] > figure.size[1]


def test_suite_needs_a_model(capsys):
    """No --serve_model: one error line naming it, exit 2, before anything starts."""
    from vit.bench.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--suite", "serve"])
    assert exit_info.value.code == 2
    assert "--serve_model" in capsys.readouterr().err


def _entry(**changes) -> dict:
    """A report entry of the suite with every goal met by a margin; ``changes`` replace its numbers."""
    entry = {
        "offline": {"images_per_s": 100.0},
        "saturation": {"served_ips": 90.0},
        "unloaded_p50_ms": 10.0,
        "loads": [
            {"fraction": 0.5, "offered_rps": 45.0, "served_ips": 45.0, "p50_ms": 12.0, "p99_ms": 25.0,
             "status": {"200": 90}, "lost": 0, "seconds": 2.0},
            {"fraction": 2.0, "offered_rps": 180.0, "served_ips": 80.0, "p50_ms": 80.0, "p99_ms": 90.0,
             "status": {"200": 300, "503": 60}, "lost": 0, "seconds": 2.0},
        ],
        "soak": {"seconds": 300.0, "rss_start": 1000 * 2**20, "rss_end": 1040 * 2**20, "lost": 0},
        "backends": [
            {"backend": "torch", "batch_ms": 30.0, "served_p50_ms": 31.5},
            {"backend": "onnx", "batch_ms": 15.0, "served_p50_ms": 16.0},
        ],
    }  # fmt: skip
    for path, value in changes.items():
        *keys, last = path.split(".")
        target = entry
        for key in keys:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[last] = value
    return entry


SOAK = {"soak.status": {"200": 2000}, "soak.offered_rps": 45.0, "soak.p50_ms": 12.0}
ROUNDS = {"backends.0.round_ms": [30.0, 40.0, 20.0]}  # torch's rounds, run side by side with onnx's
TIMED = {"backends.0.own_p50_ms": 1.99, "backends.0.served_model_p50_ms": 29.0, "backends.0.own_client_p50_ms": 2.4}


@pytest.mark.parametrize(
    ("change", "fails"),
    [
        ({}, None),
        ({"saturation.served_ips": 84.9}, "saturation"),  # 0.849x the offline 100 img/s
        ({"saturation.served_ips": 84.9, "loads.1.served_ips": 85.0}, None),  # the peak: 0.85x, served at 2x offered
        ({"saturation.served_ips": 84.9, "loads.0.served_ips": 95.0}, "saturation"),  # under 1x: the clients' pace
        ({"loads.0.p99_ms": 30.1}, "p99"),  # just over 3x the unloaded 10 ms
        ({"loads.0.p99_ms": None}, "p99"),  # no 200 answer at half load
        ({"loads.1.status": {"200": 300, "503": 59, "0": 1}}, "over"),  # one not answered
        ({"loads.1.lost": 1}, "over"),
        ({"soak.rss_end": 1050 * 2**20}, "soak"),  # +5.0 %
        ({"soak.lost": 1}, "soak"),
        ({"backends.1.batch_ms": 20.01, "backends.1.served_p50_ms": 21.0}, "onnx"),  # 1.499x
        ({"backends.0.served_p50_ms": 32.01}, "server's"),  # torch: 2.01 ms beside its forward
        ({"backends.0.served_p50_ms": 29.9}, "server's"),  # served faster than the forward: a busy offline run
        ({"backends.1.skipped": "onnxruntime missing"}, "onnx"),  # asked for, not measured
        # rounds side by side: the median of their ratios is read, not the 2.0x of the two backends' batch_ms nor the
        # ratio of the two backends' median rounds (30 / 20 = 1.5x, then 30 / 26.6 = 1.13x)
        (ROUNDS | {"backends.1.round_ms": [20.01, 20.0, 16.0]}, "onnx"),  # 1.499, 2.0, 1.25: 1.499x
        (ROUNDS | {"backends.1.round_ms": [15.0, 26.6, 40.0]}, None),  # 2.0, 1.504, 0.5: 1.504x
        (SOAK | {"soak.p99_ms": 30.1}, "p99"),  # a soak ran: its p99 is read, not the short run's 25 ms
        (SOAK | {"soak.p99_ms": 29.9, "loads.0.p99_ms": 40.0}, None),  # nor the short run's slowest few answers
        (TIMED | {"backends.0.own_p50_ms": 2.01}, "server's"),  # the server's Server-Timing: total less model
        (TIMED | {"backends.0.served_p50_ms": 40.0}, None),  # ... not the served p50 less the offline forward
    ],
)
def test_serve_checks_flip_at_the_goals(change, fails):
    """Each goal is computed from the report's numbers: met just inside its threshold, missed just past it, and only
    the goal whose number moved is missed."""
    from vit.bench.serve_goals import serve_checks

    checks = serve_checks(_entry(**change))
    assert len(checks) == 7 - ("backends.1.skipped" in change)  # the onnx row's own-time line goes with it
    missed = [c["name"] for c in checks if not c["passed"]]
    if fails is None:
        assert missed == [], missed
    else:
        assert len(missed) == 1 and fails in missed[0], missed


def test_the_own_time_line_gives_its_parts():
    """Where the server's timings split its own time, the goal's line gives the parts as the report has them."""
    from vit.bench.serve_goals import serve_checks

    parts = {f"backends.0.own_{part}_p50_ms": ms for part, ms in (("handover", 1.1), ("worker", 0.3), ("http", 0.55))}
    (line,) = [c for c in serve_checks(_entry(**TIMED, **parts)) if "own time per request (torch" in c["name"]]
    assert line["detail"].endswith(
        "its parts at p50: hand-over to the worker and back 1.10 ms, the worker beside the forward 0.30 ms, "
        "the HTTP process 0.55 ms"
    )
    (older,) = [c for c in serve_checks(_entry(**TIMED)) if "own time per request (torch" in c["name"]]
    assert "its parts" not in older["detail"]  # an older report, without them


def test_the_onnx_line_gives_the_rounds_side_by_side():
    from vit.bench.serve_goals import serve_checks

    entry = _entry(**ROUNDS, **{"backends.1.round_ms": [20.0, 19.0, 25.0]})
    (line,) = [c for c in serve_checks(entry) if "onnx >=" in c["name"]]
    assert "offline forward 1.50x" in line["detail"] and "3 rounds side by side: 0.80-2.11x" in line["detail"]


class _Recorded:
    """A stand-in for a ServeModel that records which backend each forward pass ran on."""

    def __init__(self, name: str, calls: list[str]):
        self.name, self.calls = name, calls

    def decode(self, data: bytes) -> bytes:
        return data

    def predict(self, images: list) -> list:
        assert len(images) == 1  # batch 1
        self.calls.append(self.name)
        return []


def test_backends_are_timed_in_alternating_rounds(tmp_path):
    """After one warm-up call each, the rounds alternate (torch onnx, onnx torch, ...), each round a run of the same
    number of calls, and every round's time is kept in order so that the two backends' rounds pair up."""
    from vit.bench.serve_offline import backend_rates

    image, calls = tmp_path / "image.png", []
    image.write_bytes(b"png")
    served = {name: _Recorded(name, calls) for name in ("torch", "onnx")}
    rows = backend_rates(served, image, seconds=0.0, rounds=4)  # rounds of one call each
    assert calls == ["torch", "onnx", "torch", "onnx"] + ["torch", "onnx", "onnx", "torch"] * 2
    assert [rows[name]["backend"] for name in ("torch", "onnx")] == ["torch", "onnx"]
    for row in rows.values():
        assert row["rounds"] == len(row["round_ms"]) == 4 and row["batch"] == 1
        assert row["batch_ms"] == pytest.approx(1000 / row["images_per_s"])
        assert sorted(row["round_ms"])[1] <= row["batch_ms"] <= sorted(row["round_ms"])[2]  # the median round


@pytest.mark.parametrize("fails", ["export", "load"])
def test_a_backend_that_cannot_be_had_is_skipped_and_the_other_measured(fails, monkeypatch, tmp_path):
    """onnx's export fails, or its model cannot be loaded (an export folder without ONNX Runtime): its row says why
    in one line, torch alone is timed and served, and the rows keep the order the backends were asked in (the server
    and its requests stand in: their numbers are given)."""
    from vit.bench import serve_offline, serve_suite
    from vit.bench.harness import BenchError
    from vit.errors import UsageError

    def failed_export(model, folder):
        if fails == "load":
            return folder
        raise BenchError("vit export --onnx of m.ckpt failed:\nTraceback ...")

    def load(source, backend, threads):
        if backend == "onnx":
            raise UsageError("--backend onnx needs ONNX Runtime: pip install 'vit[export]'")
        return _Recorded(backend, calls)

    @contextlib.contextmanager
    def serving(source, folder, options):
        assert "--backend" in options and options[options.index("--backend") + 1] == "torch"
        yield types.SimpleNamespace(url="http://127.0.0.1:9")

    calls = []
    monkeypatch.setattr(serve_suite, "onnx_folder", failed_export)
    monkeypatch.setattr(serve_suite, "load_model", load)
    monkeypatch.setattr(serve_suite, "backend_rates", lambda served, image, seconds: serve_offline.backend_rates(
        served, image, seconds=0.0))  # fmt: skip
    monkeypatch.setattr(serve_suite, "serving", serving)
    timings = [{"model": 2.0, "total": 3.0}] * 3
    monkeypatch.setattr(serve_suite, "unloaded_requests", lambda url, image, requests: ([5.0, 7.0, 6.0], timings))
    image = tmp_path / "image.png"
    image.write_bytes(b"png")
    rows = serve_suite.compare_backends("m.ckpt", image, tmp_path, backends=["onnx", "torch"], threads=1, requests=3)
    why = {"export": "vit export --onnx of m.ckpt failed:", "load": "--backend onnx needs ONNX Runtime: pip install"}
    assert rows[0]["backend"] == "onnx" and rows[0]["skipped"].startswith(why[fails]) and len(rows[0]) == 2
    assert rows[1]["backend"] == "torch" and set(calls) == {"torch"} and len(rows[1]["round_ms"]) == 10
    assert (rows[1]["served_p50_ms"], rows[1]["own_p50_ms"], rows[1]["own_client_p50_ms"]) == (6.0, 1.0, 4.0)


def test_the_suites_server_gets_the_batch_wait_and_the_titles_name_it():
    from vit.bench.serve_report import batch_wait
    from vit.bench.serve_suite import server_options
    from vit.serve.command import build_parser

    options = server_options(backend="torch", threads=1, max_batch_size=2, max_queue=4, batch_timeout=0.005)
    served = build_parser().parse_args(["model.ckpt", *options])  # what vit serve makes of them
    assert (served.max_batch_size, served.max_queue, served.batch_timeout, served.threads) == (2, 4, 0.005, 1)
    assert build_parser().parse_args(["model.ckpt"]).batch_timeout == 0  # the suite's default is the server's
    assert "--batch_timeout" not in server_options(backend="torch", threads=None, max_batch_size=1, max_queue=8)
    assert [batch_wait({"batch_timeout": t}) for t in (0.0, 0.01)] == [" (no wait)", " (waiting 10 ms to fill)"]
    assert batch_wait({}) == ""  # a report from before the option: nothing claimed


def test_serve_checks_report_the_numbers_and_leave_out_what_did_not_run():
    """The soak is checked only when one ran, ONNX only when both backends were asked for; the lines carry the
    ratios (0.90x the offline rate, 2.00x offline forward and 1.97x served for ONNX, 1.50 ms of the server's own)."""
    from vit.bench.serve_goals import serve_checks

    details = " | ".join(c["detail"] for c in serve_checks(_entry()))
    assert "0.90x" in details and "offline forward 2.00x" in details and "served unloaded p50 1.97x" in details
    assert "1.50 ms" in details and "+4.0%" in details
    entry = _entry()
    del entry["soak"]
    entry["backends"] = entry["backends"][:1]
    names = [c["name"] for c in serve_checks(entry)]
    assert not any("soak" in n or "onnx" in n for n in names) and len(names) == 4


def test_server_timings_are_read_as_the_w3c_header_writes_them():
    """`Server-Timing` as the W3C Server Timing spec writes it (its examples: a metric without a duration, a
    description before the duration) and as vit serve does; the server's own time is total less model per request,
    then the median."""
    from vit.bench.serve_suite import own_time, server_timings
    from vit.serve.server import model_timing

    assert server_timings("miss, db;dur=53, app;dur=47.2") == {"db": 53.0, "app": 47.2}
    assert server_timings('cache;desc="Cache Read";dur=23.2') == {"cache": 23.2}
    assert server_timings('model;dur=2.500;desc="forward pass", total;dur=4.25') == {"model": 2.5, "total": 4.25}
    assert server_timings(None) == {}
    timings = [{"model": 2.0, "total": 4.0}, {"model": 3.0, "total": 4.5}, {"model": 2.5, "total": 4.0}]
    # total - model: 2.0, 1.5, 1.5; latency - model: 3.0, 3.0, 6.5; model: 2.0, 3.0, 2.5
    assert own_time([5.0, 6.0, 9.0], timings) == pytest.approx(
        {"served_model_p50_ms": 2.5, "own_p50_ms": 1.5, "own_client_p50_ms": 3.0}
    )
    assert own_time([5.0], [{"total": 4.0}]) == {}  # no forward pass reported: nothing to subtract
    split = [
        {"model": 2.0, "worker": 2.5, "handover": 1.0, "total": 4.0},
        {"model": 3.0, "worker": 3.2, "handover": 0.6, "total": 4.5},
        {"model": 2.5, "worker": 3.0, "handover": 0.8, "total": 4.0},
    ]
    written = model_timing({"model_ms": 2.0, "worker_ms": 2.5, "handover_ms": 1.0})["Server-Timing"]
    assert server_timings(written + ", total;dur=4.0") == split[0]  # as vit serve writes them (and the gate its total)
    assert "own_worker_p50_ms" not in own_time([5.0, 6.0], [split[0], {"model": 3.0, "total": 4.5}])  # not all split
    # worker - model: 0.5, 0.2, 0.5; handover: 1.0, 0.6, 0.8; total - worker - handover: 0.5, 0.7, 0.2
    assert own_time([5.0, 6.0, 9.0], split) == pytest.approx(
        {
            "served_model_p50_ms": 2.5,
            "own_p50_ms": 1.5,
            "own_client_p50_ms": 3.0,
            "own_worker_p50_ms": 0.5,
            "own_handover_p50_ms": 0.8,
            "own_http_p50_ms": 0.5,
        }  # fmt: skip
    )


def test_a_preset_is_served_with_random_weights(tmp_path):
    """`preset:NAME` writes a checkpoint that vit serve's model loads as that preset: its input size, ImageNet's
    1000 classes or CIFAR's 10, and the logits of the same preset built with the same seed."""
    import torch

    from vit import create_model
    from vit.bench.serve_suite import check_model, preset_checkpoint
    from vit.serve.model import ServeModel

    assert check_model("preset:vit_tiny_patch4_32") == "vit_tiny_patch4_32"
    served = ServeModel(preset_checkpoint("vit_tiny_patch4_32", tmp_path, seed=3))
    assert served.input_size == (3, 32, 32) and len(served.class_names) == 10
    torch.manual_seed(3)
    reference = create_model("vit_tiny_patch4_32").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(served.model(x), reference(x))


@pytest.mark.parametrize(
    ("model", "named"), [("preset:vit_nope", "vit_small_patch16_224"), ("missing.ckpt", "missing.ckpt")]
)
def test_an_unknown_model_is_one_error_line(model, named, capsys):
    """An unknown preset lists the known ones, a missing file names itself: exit 2 before anything starts."""
    from vit.bench.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--suite", "serve", "--serve_model", model])
    err = capsys.readouterr().err
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert exit_info.value.code == 2 and len(error) == 1 and "--serve_model" in error[0] and named in error[0], err
