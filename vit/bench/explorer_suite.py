"""The explorer suite: size and speed of the attention explorer (:mod:`vit.explain.render.explorer`).

For each case (the ``cifar10_cpu`` model with 16 images, ``vit_small_patch16_224`` with 8), the file's size in
bytes, the Python time to write it, and, where Playwright and a Chromium are found, the browser's time to open the
page (navigation start to the frame after the first drawn query; median and slowest of five tabs) and to answer a
click on a patch (click to the next frame) and a switch to another image. Weights are the model's initialisation
unless ``--explorer_weights`` gives a state dict for the ``cifar10_cpu`` model: trained attention is peaked and
compresses differently from the near-uniform attention of a new model, so the report says which was measured.
``--explorer_bits`` sets the bits per attention code; by default (``auto``) the explorer picks the finest of 6 to 3
bits at which the case's images fit its budget, as ``vit explain`` and the training callback do.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vit.bench.defaults import EXPLORER_CASES
from vit.bench.harness import BenchError, check, log, print_table, write_report
from vit.bench.photos import photo_like

CASES = {  # name: (preset, overrides, images, size budget in bytes)
    "cifar10_cpu": (
        "vit_tiny_patch4_32",
        dict(embed_dim=96, depth=6, num_heads=3, mlp_ratio=2.0, class_token=False, global_pool="avg", conv_stem=True),
        16,
        1_000_000,
    ),
    "vit_small_patch16_224": ("vit_small_patch16_224", {}, 8, 4_000_000),
}
"""The models of the size budget (``cifar10_cpu`` is configs/cifar10_cpu.yaml's model)."""
BROWSER_TARGET_MS = 200.0
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]  # fmt: skip
MEAN, STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


def find_chromium() -> str | None:
    """The Chromium on ``PATH`` (Debian's ``chromium``, or ``chromium-browser``), or ``None``."""
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)


def images_for(img_size: int, count: int, seed: int, cifar_dir: str | None) -> torch.Tensor:
    """``count`` uint8 images: CIFAR pictures from ``cifar_dir`` (upscaled) when given, else photograph-like ones."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    files = sorted(Path(cifar_dir).rglob("*.jpg")) if cifar_dir else []
    bases = files[:: max(1, len(files) // count)][:count]  # evenly spaced: every class of a class-sorted folder
    pictures = []
    for i in range(count):
        if i < len(bases):
            with Image.open(bases[i]) as image:
                base = np.asarray(image.convert("RGB").resize((img_size, img_size), Image.BICUBIC))
            pictures.append(base if img_size <= 32 else photo_like(rng, img_size, img_size, base))
        else:
            pictures.append(photo_like(rng, img_size, img_size))
    return torch.from_numpy(np.stack(pictures)).permute(0, 3, 1, 2).contiguous()


def browser_times(path: Path, executable: str, grid: tuple[int, int], opens: int = 5) -> dict[str, float]:
    """Open ``path`` in headless Chromium ``opens`` times (a new tab each); milliseconds to open (median and
    slowest), to answer patch clicks and an image switch (on the last tab)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=LAUNCH_ARGS)
        open_ms = []
        for tab in range(opens):  # each in a new tab, the previous one closed
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(path.as_uri())
            page.wait_for_function("window.explorer && window.explorer.timings.open !== null")
            open_ms.append(page.evaluate("window.explorer.timings.open"))
            if tab < opens - 1:
                page.close()
        box = page.locator("#view").bounding_box()
        for r, c in ((1, 1), (grid[0] // 2, grid[1] // 2), (grid[0] - 1, 0), (0, grid[1] - 1), (2, 3)):
            page.mouse.click(
                box["x"] + (c + 0.5) * box["width"] / grid[1], box["y"] + (r + 0.5) * box["height"] / grid[0]
            )
            page.evaluate("() => window.explorer.select({})")
        clicks = page.evaluate("window.explorer.timings.click")
        page.locator("#thumbs button").nth(1).click()
        page.evaluate("() => window.explorer.select({})")
        switch = page.evaluate("window.explorer.timings.click")[-1]
        browser.close()
    return {"open_ms": float(np.median(open_ms)), "open_max_ms": max(open_ms), "click_ms": float(np.median(clicks)),
            "click_max_ms": max(clicks), "switch_ms": switch}  # fmt: skip


def measure_case(
    name: str,
    *,
    device: torch.device,
    weights: str | None,
    bits: str | int,
    cifar_mini: str | None,
    seed: int,
    executable: str | None,
) -> dict[str, Any]:
    """One case of :data:`CASES`: the explorer's file written for its model and images (its size, bits and seconds),
    and, with a browser ``executable``, the times to open it and to answer clicks."""
    from vit.explain.render.explorer import AUTO_BITS, ExplorerTooLarge, explorer_payload, render_explorer
    from vit.models import create_model

    preset, overrides, count, budget = CASES[name]
    torch.manual_seed(seed)
    model = create_model(preset, **overrides).eval().to(device)
    kind = "initialised"
    if name == "cifar10_cpu" and weights:
        state = torch.load(weights, map_location=device, weights_only=True)
        model.load_state_dict(state.get("state_dict", state))
        kind = f"trained ({Path(weights).name})"
    images = images_for(model.patch_embed.img_size[0], count, seed, cifar_mini)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{name}.html"
        start = time.perf_counter()
        limit = budget if bits == "auto" else None  # auto: the bits that fit the budget
        try:
            payload = explorer_payload(model, images, mean=MEAN, std=STD, max_bytes=limit, bits=bits)
        except ExplorerTooLarge:  # not even auto's coarsest fits: measured at it, and the budget check fails
            start = time.perf_counter()
            payload = explorer_payload(model, images, mean=MEAN, std=STD, max_bytes=None, bits=AUTO_BITS[-1])
        path.write_text(render_explorer(payload), encoding="utf-8")
        row = {"case": name, "images": count, "weights": kind, "bits": payload["bits"],
               "bytes": path.stat().st_size, "write_s": time.perf_counter() - start, "budget": budget}  # fmt: skip
        if executable is not None:
            row.update(browser_times(path, executable, tuple(model.patch_embed.grid_size)))
    return row


def case_checks(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A case's size budget and, where the browser was measured, its 200 ms to open and to answer a click."""
    name, count, budget = row["case"], row["images"], row["budget"]
    checks = [check(f"{name}: {count} images <= {budget / 1e6:.0f} MB", row["bytes"] <= budget,
                    f"{row['bytes']:,} bytes ({row['weights']} weights)")]  # fmt: skip
    if "open_ms" in row:
        slowest = max(row["open_ms"], row["click_max_ms"])
        checks.append(check(f"{name}: opens (median) and answers a click in < {BROWSER_TARGET_MS:.0f} ms",
                            slowest < BROWSER_TARGET_MS,
                            f"open {row['open_ms']:.0f} ms (max {row['open_max_ms']:.0f}), click "
                            f"{row['click_ms']:.0f} ms (max {row['click_max_ms']:.0f})"))  # fmt: skip
    return checks


def run_explorer_suite(
    *,
    device: torch.device,
    report: dict[str, Any],
    cases: Sequence[str] = EXPLORER_CASES,
    weights: str | None = None,
    browser: str | None = None,
    bits: str | int = "auto",
    cifar_mini: str | None = None,
    seed: int = 0,
    json_path: str | None = None,
) -> None:
    """Measure every case of :data:`CASES`; the checks are the size budgets and the browser's 200 ms.

    Args:
        device: Where the models run.
        report: The report to fill (written to ``json_path`` after every case).
        cases: Keys of :data:`CASES`.
        weights: State dict of a trained ``cifar10_cpu`` model (default: initialised weights).
        browser: Chromium executable (default: ``chromium`` on ``PATH``).
        bits: Bits per attention code, or ``"auto"``: the finest of 6 to 3 that fits the case's budget.
        cifar_mini: Folder of CIFAR pictures to draw the images from (default: photograph-like ones).
        seed: Seed of the weights and the images.
        json_path: Where the report is written.

    Raises:
        BenchError: No case measured.
    """
    executable = browser or find_chromium()
    try:
        import playwright  # noqa: F401
    except ImportError:
        executable = None
    if executable is None:
        log("explorer: no Chromium or no playwright: browser times are not measured")
    rows, checks = [], []
    suite = report.setdefault("explorer", {"rows": rows, "checks": checks})
    for name in cases:
        row = measure_case(name, device=device, weights=weights, bits=bits, cifar_mini=cifar_mini, seed=seed,
                           executable=executable)  # fmt: skip
        rows.append(row)
        log(f"explorer {name}: {row['bytes']:,} bytes in {row['write_s']:.1f} s")
        checks.extend(case_checks(row))
        write_report(json_path, report)
    if not rows:
        raise BenchError("explorer suite: no case measured")
    print_table(
        "Attention explorer",
        rows,
        [
            ("case", "model", ""),
            ("images", "images", "d"),
            ("weights", "weights", ""),
            ("bits", "bits", "d"),
            ("bytes", "bytes", ",d"),
            ("write_s", "write s", ".2f"),
            ("open_ms", "open ms (median)", ".0f"),
            ("open_max_ms", "open ms (max)", ".0f"),
            ("click_ms", "click ms (median)", ".0f"),
            ("click_max_ms", "click ms (max)", ".0f"),
            ("switch_ms", "switch image ms", ".0f"),
        ],
    )
    suite["checks"] = checks
