"""Progress of long explanation work on stderr (``vit explain`` and, when asked, the benchmark and faithfulness APIs).

A tqdm bar updated in place while stderr is a terminal, and one plain line per finished phase either way, so that
a log file holds no carriage returns; silent unless enabled, as the training callback needs.
"""

from __future__ import annotations

import sys
from time import perf_counter

from tqdm import tqdm


class Progress:
    """One phase of long work on stderr, silent unless ``enabled``: a tqdm bar updated in place while stderr is a
    terminal, then one plain line ``<label>: <summary>`` when the phase ends (the bar is cleared first).

    Args:
        label: What the phase works on, e.g. the method's name; it opens the bar and the final line.
        total: Units of work in the phase (images).
        enabled: Report at all.
    """

    def __init__(self, label: str, total: int, enabled: bool = False) -> None:
        self.label, self.enabled, self.start = label, enabled, perf_counter()
        self.bar = None
        if enabled and sys.stderr.isatty():
            self.bar = tqdm(total=total, desc=label, unit="img", file=sys.stderr, leave=False, dynamic_ncols=True)

    def update(self, n: int) -> None:
        """``n`` more units done."""
        if self.bar is not None:
            self.bar.update(n)

    @property
    def seconds(self) -> float:
        """Wall time since the phase began."""
        return perf_counter() - self.start

    def close(self, summary: str) -> None:
        """End the phase: clear the bar and print ``<label>: <summary>``."""
        if self.bar is not None:
            self.bar.close()
        if self.enabled:
            print(f"{self.label}: {summary}", file=sys.stderr, flush=True)
