"""Progress of long explanation work on stderr (``vit explain`` and, when asked, the benchmark and faithfulness APIs).

A tqdm bar updated in place while stderr is a terminal; otherwise (a log file, a pipe) a plain line with the count
and the elapsed time every :data:`LOG_INTERVAL` seconds, so that a long phase is never silent and a log holds no
carriage returns. Either way one line per finished phase; silent unless enabled, as the training callback needs.
"""

from __future__ import annotations

import sys
import threading
from time import perf_counter

from tqdm import tqdm

LOG_INTERVAL = 10.0
"""Seconds between the plain progress lines of a phase when stderr is not a terminal."""

_OPEN: set[Progress] = set()


class Progress:
    """One phase of long work on stderr, silent unless ``enabled``: a tqdm bar updated in place while stderr is a
    terminal, else a line ``<label>: <done>/<total> <unit>, <seconds> s`` every :data:`LOG_INTERVAL` seconds (from a
    background thread, so that a phase without updates still reports); then one plain line ``<label>: <summary>``
    when the phase ends (the bar is cleared first).

    Args:
        label: What the phase works on, e.g. the method's name; it opens the bar and the final line.
        total: Units of work in the phase (images).
        enabled: Report at all.
        unit: What ``total`` counts, for the plain lines.
    """

    def __init__(self, label: str, total: int, enabled: bool = False, unit: str = "images") -> None:
        self.label, self.total, self.unit, self.enabled, self.start = label, total, unit, enabled, perf_counter()
        self.done = 0
        self.bar = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if enabled and sys.stderr.isatty():
            self.bar = tqdm(total=total, desc=label, unit="img", file=sys.stderr, leave=False, dynamic_ncols=True)
        elif enabled:
            _OPEN.add(self)
            self._thread = threading.Thread(target=self._log, args=(LOG_INTERVAL, sys.stderr), daemon=True)
            self._thread.start()

    def _log(self, interval: float, stream) -> None:
        while not self._stop.wait(interval):
            stream.write(f"{self.label}: {self.done}/{self.total} {self.unit}, {self.seconds:.0f} s\n")
            stream.flush()

    def update(self, n: int) -> None:
        """``n`` more units done."""
        self.done += n
        if self.bar is not None:
            self.bar.update(n)

    @property
    def seconds(self) -> float:
        """Wall time since the phase began."""
        return perf_counter() - self.start

    def stop(self) -> None:
        """Clear the bar and end the plain lines, printing nothing more (also on an error)."""
        if self.bar is not None:
            self.bar.close()
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        _OPEN.discard(self)

    def close(self, summary: str) -> None:
        """End the phase: clear the bar and print ``<label>: <summary>``."""
        self.stop()
        if self.enabled:
            print(f"{self.label}: {summary}", file=sys.stderr, flush=True)


def stop_all() -> None:
    """:meth:`Progress.stop` every phase still open: before an error line, nothing prints after it."""
    for progress in list(_OPEN):
        progress.stop()
