"""Small helpers shared by the layers."""

from __future__ import annotations


def to_2tuple(value: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """Return ``(value, value)`` for an int, or the pair itself as a tuple."""
    if isinstance(value, int):
        return (value, value)
    height, width = value
    return (int(height), int(width))
