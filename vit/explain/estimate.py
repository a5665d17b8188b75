"""How long a long ``vit explain`` will take, said before it starts: the work timed on a first batch of the images.

The measurements (``--faithfulness``, ``--sanity``, ``--heads``) cost time in proportion to the images: the first
:data:`PROBE` images go through the same call, silently, and the time they took, scaled to all images, is printed as
one line on stderr before the whole run starts. The estimate holds while the machine's load does; the overlays and
the report, written afterwards, are not in it. The first batch is computed twice (2-5 % more time for a few hundred
images): the price of knowing at once whether to wait, to lower ``--limit`` or to come back later.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from ..text import plural

PROBE = 16
"""Images timed for the estimate; runs of fewer than twice as many are not estimated (they are short)."""


def duration(seconds: float) -> str:
    """``"45 s"``, ``"3 min 20 s"``, ``"1 h 5 min"``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def estimated(explain: Callable[..., Any], what: str, probe: int = PROBE) -> Callable[..., Any]:
    """``explain`` (:func:`vit.explain.explain`'s signature) that first times itself on the first ``probe`` images
    and prints the estimate of the whole call; ``what`` names the long options, or is empty to estimate nothing.

    Args:
        explain: The function to call.
        what: The options that make the call long (``"--faithfulness, --heads"``); empty: no estimate.
        probe: Images timed.
    """

    def call(model: Any, pixels: Any, methods: Any, **kwargs: Any) -> Any:
        if what and len(pixels) >= 2 * probe:
            first = {**kwargs, "show_progress": False}
            if kwargs.get("labels") is not None:
                first["labels"] = kwargs["labels"][:probe]
            started = time.perf_counter()
            explain(model, pixels[:probe], methods, **first)
            seconds = time.perf_counter() - started
            print(
                f"estimate: about {duration(seconds * len(pixels) / probe)} for {what} on "
                f"{plural(len(pixels), 'image')} (the first {probe} took {seconds:.1f} s, at this load; overlays and "
                "report after); --limit N for fewer",
                file=sys.stderr,
                flush=True,
            )
        return explain(model, pixels, methods, **kwargs)

    return call
