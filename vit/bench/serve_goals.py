"""The goals of ``vit bench --suite serve`` (the numbers a served model should reach on the machine that measures
it), each checked from the suite's report entry: a ``PASS`` / ``FAIL`` line with the numbers, reported and never
asserted (a busy machine misses them without a bug).
"""

from __future__ import annotations

import statistics
from typing import Any

from vit.bench.harness import check

SATURATION_GOAL = 0.85
"""Served images/s at saturation against the offline batched rate (set for ViT-S/16 at 224 px, where the model
dominates)."""
P99_GOAL = 3.0
"""p99 at half of saturation against one unloaded request (p50)."""
SOAK_RSS_GOAL = 0.05
"""Largest growth of the server's resident memory over the soak."""
ONNX_GOAL = 1.5
"""ONNX Runtime's speed-up over torch at batch 1 (offline forward)."""
SERVER_MS_GOAL = 2.0
"""The server's own milliseconds per request at p50, at batch 1, unloaded: from each request's arrival to its answer
less its forward pass, as the server reports both (``Server-Timing``). Set for the CIFAR recipe's model, where HTTP
dominates."""


def _ms(value: float | None) -> str:
    return "none" if value is None else f"{value:.1f} ms"


def _measured(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The backends compared at batch 1 that were measured, by name."""
    return {row["backend"]: row for row in entry.get("backends", []) if "skipped" not in row}


def offline_ratio(torch_row: dict[str, Any], onnx_row: dict[str, Any]) -> tuple[float, str]:
    """ONNX Runtime's offline speed-up over torch at batch 1 and how it spread: the median of the ratios of the
    rounds that ran side by side (``round_ms``, :func:`vit.bench.serve_offline.backend_rates`) with their range, else
    (a report from before the rounds) the ratio of the two medians."""
    paired = [t / o for t, o in zip(torch_row.get("round_ms", []), onnx_row.get("round_ms", []), strict=False)]
    if not paired:
        return torch_row["batch_ms"] / onnx_row["batch_ms"], ""
    return statistics.median(paired), f"; {len(paired)} rounds side by side: {min(paired):.2f}-{max(paired):.2f}x"


def backend_checks(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """ONNX against torch at batch 1, and the server's own time per request of each backend measured.

    The ONNX goal is read on the offline forward (:meth:`ServeModel.predict` in this process, the two backends in
    alternating rounds: :func:`offline_ratio`): it is the backend's speed-up. The served ratio (unloaded p50 through
    the server) is reported beside it but adds the server's own time to both sides, which has its own goal; for a
    model whose forward takes about as long as HTTP (the CIFAR recipe's), no backend could lift the served ratio to
    1.5.
    """
    rows, checks = _measured(entry), []
    wanted = {row["backend"] for row in entry.get("backends", [])}
    if {"torch", "onnx"} <= wanted:
        torch_row, onnx_row = rows.get("torch"), rows.get("onnx")
        if torch_row and onnx_row:
            offline, rounds = offline_ratio(torch_row, onnx_row)
            served = torch_row["served_p50_ms"] / onnx_row["served_p50_ms"]
            detail = (f"offline forward {offline:.2f}x ({torch_row['batch_ms']:.1f} vs {onnx_row['batch_ms']:.1f} ms"
                      f"{rounds}), served unloaded p50 {served:.2f}x ({torch_row['served_p50_ms']:.1f} vs "
                      f"{onnx_row['served_p50_ms']:.1f} ms)")  # fmt: skip
            passed = offline >= ONNX_GOAL
        else:
            skipped = [r for r in entry["backends"] if "skipped" in r]
            passed, detail = False, "not measured: " + "; ".join(f"{r['backend']} {r['skipped']}" for r in skipped)
        checks.append(check(f"serve: onnx >= {ONNX_GOAL:g}x torch at batch 1 (offline forward)", passed, detail))
    for name, row in rows.items():
        if row.get("own_p50_ms") is not None:
            own = row["own_p50_ms"]
            how = (f"the server's Server-Timing, total less the forward pass ({row['served_model_p50_ms']:.2f} ms); "
                   f"seen by the client, its latency less the forward: {row['own_client_p50_ms']:.2f} ms")  # fmt: skip
            if row.get("own_handover_p50_ms") is not None:
                how += (f"; its parts at p50: hand-over to the worker and back {row['own_handover_p50_ms']:.2f} ms, "
                        f"the worker beside the forward {row['own_worker_p50_ms']:.2f} ms, the HTTP process "
                        f"{row['own_http_p50_ms']:.2f} ms")  # fmt: skip
        else:  # a server that does not report its forward pass: the offline one, measured apart
            own = row["served_p50_ms"] - row["batch_ms"]
            how = f"served unloaded p50 {row['served_p50_ms']:.2f} ms less the offline forward {row['batch_ms']:.2f} ms"
            how += " (below 0: the machine was busier offline; measure again)" if own < 0 else ""
        checks.append(check(
            f"serve: the server's own time per request ({name}, batch 1) <= {SERVER_MS_GOAL:g} ms at p50",
            0 <= own <= SERVER_MS_GOAL, f"{own:.2f} ms: {how}",
        ))  # fmt: skip
    return checks


def peak_rate(entry: dict[str, Any]) -> tuple[float, str]:
    """The server's rate at saturation: the most images/s it answered 200 while it had more to do than it could,
    in the closed-loop run or at an offered load of 1x saturation or more (where the clients' pacing, not the
    server, no longer limits it), and which run that was."""
    runs = [(entry["saturation"]["served_ips"], "closed loop")]
    runs += [(s["served_ips"], f"at {s['fraction']:g}x offered") for s in entry["loads"] if s["fraction"] >= 1]
    return max(runs, key=lambda run: run[0])


def half_load(entry: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The run whose percentiles the p99 goal reads, and where it ran: the soak when one ran (half load for minutes:
    its p99 is that of thousands of answers), else the load sweep's run nearest half of saturation (seconds: its p99 is
    one of its slowest few answers), whose p99 is named beside the soak's."""
    step = min(entry["loads"], key=lambda s: abs(s["fraction"] - 0.5))
    where = (f"at {step['fraction']:g}x saturation ({step['offered_rps']:.1f} req/s, {step['seconds']:g} s, "
             f"{step['status'].get('200', 0)} answers)")  # fmt: skip
    soak = entry.get("soak")
    if not soak or not soak.get("status", {}).get("200"):
        return step, where
    return soak, (
        f"over the soak at half load ({soak['offered_rps']:.1f} req/s, {soak['seconds']:g} s, "
        f"{soak['status']['200']} answers; the load sweep's run {where}: p99 {_ms(step['p99_ms'])})"
    )


def serve_checks(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The suite's goals, each a PASS / FAIL line with its numbers (reported, not asserted): over saturation only 200
    or 503 and none lost; saturation (:func:`peak_rate`) >= 0.85x the offline rate; p99 at half load
    (:func:`half_load`) <= 3x one unloaded request; soak RSS growth < 5 % (when a soak ran); ONNX >= 1.5x torch and
    the server's own time (:func:`backend_checks`)."""
    over = [s for s in entry["loads"] if s["fraction"] > 1]
    codes = sorted({code for s in over for code in s["status"]})
    lost = sum(s["lost"] for s in over)
    top = max(over, key=lambda s: s["fraction"], default=None)
    counts = f"; at {top['fraction']:g}x: 200 {top['status'].get('200', 0)}, 503 {top['status'].get('503', 0)}, " \
             f"lost {top['lost']}" if top else ""  # fmt: skip
    closed, offline = entry["saturation"]["served_ips"], entry["offline"]["images_per_s"]
    sat, where = peak_rate(entry)
    (half, half_where), unloaded = half_load(entry), entry["unloaded_p50_ms"]
    checks = [
        check("serve: over saturation every request answered 200 or 503, none lost",
              bool(over) and set(codes) <= {"200", "503"} and lost == 0,
              f"status codes {codes}, lost {lost}{counts}"),
        check(f"serve: saturation >= {SATURATION_GOAL:g}x the offline batched rate", sat >= SATURATION_GOAL * offline,
              f"{sat:.1f} img/s served ({where}; closed loop {closed:.1f}), {offline:.1f} offline: "
              f"{sat / offline:.2f}x"),
        check(f"serve: p99 at half load <= {P99_GOAL:g}x one unloaded request",
              half["p99_ms"] is not None and half["p99_ms"] <= P99_GOAL * unloaded,
              f"p50 {_ms(half['p50_ms'])}, p99 {_ms(half['p99_ms'])} {half_where}; unloaded p50 {unloaded:.1f} ms"),
    ]  # fmt: skip
    if entry.get("soak"):
        soak = entry["soak"]
        growth = soak["rss_end"] / soak["rss_start"] - 1 if soak["rss_start"] else float("inf")
        checks.append(check(
            f"serve: soak at half load, RSS growth < {SOAK_RSS_GOAL:.0%}, none lost",
            growth < SOAK_RSS_GOAL and soak["lost"] == 0,
            f"{soak['seconds']:.0f} s, RSS {soak['rss_start'] / 2**20:.0f} -> {soak['rss_end'] / 2**20:.0f} MiB "
            f"({growth:+.1%}), lost {soak['lost']}",
        ))  # fmt: skip
    return checks + backend_checks(entry)
