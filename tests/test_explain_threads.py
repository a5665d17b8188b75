"""vit explain on a shared machine: threads from the cores not busy, the --threads options, plain progress lines and a
log of long phases, the pixel limit read from the header, and the registry the light command names."""

from __future__ import annotations

import re
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from explain_inputs import one_error_line
from PIL import Image

from vit import env
from vit.bench import cli as bench_cli
from vit.bench.harness import default_threads
from vit.explain import command, pipeline, progress
from vit.explain.progress import Progress

pytestmark = pytest.mark.usefixtures("keep_threads")  # the command sets torch's threads


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
