"""Words for counts in what the commands print: ``1 image``, ``2 images``, never ``1 images`` or ``image(s)``."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``"1 image"``, ``"3 images"``, ``"0 images"``; ``many`` for a noun whose plural is not ``noun + "s"``
    (``plural(n, "class", "classes")``). Whole counts are written with thousands separators (``1,437 images``).

    Args:
        count: How many.
        noun: The singular.
        many: The plural; default ``noun + "s"``.
    """
    word = noun if count == 1 else (many or f"{noun}s")
    return f"{count:,} {word}"
