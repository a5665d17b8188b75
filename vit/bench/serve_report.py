"""What ``vit bench --suite serve`` shows of its report: the figure (latency percentiles and throughput against
offered load) and the table of the load sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vit.bench.harness import print_table


def plot_load(entry: dict[str, Any], path: str | Path) -> None:
    """Latency percentiles (left) and served images/s with 503 answers/s (right) against offered requests/s."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(entry["loads"], key=lambda s: s["offered_rps"])
    offered = [s["offered_rps"] for s in steps]
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(11, 4.2))
    for q, style in ((50, "o-"), (90, "s--"), (99, "^:")):
        lat.plot(offered, [s[f"p{q}_ms"] for s in steps], style, label=f"p{q} (200 answers)")
    lat.axhline(entry["unloaded_p50_ms"], color="grey", lw=1, label="one unloaded request (p50)")
    lat.axvline(entry["saturation"]["served_ips"], color="k", lw=0.8, ls="--", label="saturation")
    lat.set(xlabel="offered load (requests/s)", ylabel="latency (ms)", yscale="log", title="Latency")
    lat.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    lat.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    lat.legend(fontsize=8)
    thr.plot(offered, [s["served_ips"] for s in steps], "o-", label="served (200/s)")
    busy = [s["status"].get("503", 0) / s["seconds"] for s in steps]
    thr.plot(offered, busy, "x--", color="tab:red", label="shed (503/s)")
    sat = entry["saturation"]["served_ips"]
    thr.plot([sat], [sat], "D", color="k", label="saturation (closed loop)")
    thr.plot([0, max(offered)], [0, max(offered)], color="grey", lw=0.8, label="served = offered")
    thr.axhline(entry["offline"]["images_per_s"], color="k", lw=1, ls=":", label="offline batched forward (limit)")
    top = max(entry["offline"]["images_per_s"], max(offered), *(s["served_ips"] for s in steps))
    thr.set(xlabel="offered load (requests/s)", ylabel="images/s", title="Throughput", ylim=(0, 1.6 * top))
    thr.legend(fontsize=8)
    fig.suptitle(
        f"vit serve {Path(entry['model']).name}: batches of {entry['max_batch_size']}{batch_wait(entry)}, "
        f"queue {entry['max_queue']}, threads {entry['threads'] or 'default'}, "
        f"load average {entry['load_before'][0]:.1f} before"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def batch_wait(entry: dict[str, Any]) -> str:
    """How long the server's batches waited to fill, as the titles say it (nothing where the report does not say)."""
    timeout = entry.get("batch_timeout")
    return "" if timeout is None else f" (waiting {1000 * timeout:g} ms to fill)" if timeout > 0 else " (no wait)"


def print_loads(entry: dict[str, Any]) -> None:
    """The load sweep as a table."""
    rows = [{**s, "200": s["status"].get("200", 0), "503": s["status"].get("503", 0)} for s in entry["loads"]]
    print_table(
        f"vit serve under load ({Path(entry['model']).name}, batches of {entry['max_batch_size']}{batch_wait(entry)}, "
        f"queue {entry['max_queue']}; offline limit {entry['offline']['images_per_s']:.1f} img/s)",
        rows,
        [("fraction", "x saturation", "g"), ("offered_rps", "offered req/s", ".1f"),
         ("served_ips", "served img/s", ".1f"), ("p50_ms", "p50 ms", ".1f"), ("p99_ms", "p99 ms", ".1f"),
         ("200", "200", "d"), ("503", "503", "d"), ("lost", "lost", "d")],
    )  # fmt: skip
