"""Small helpers shared by the layers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


def to_2tuple(value: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """Return ``(value, value)`` for an int, or the pair itself as a tuple."""
    if isinstance(value, int):
        return (value, value)
    height, width = value
    return (int(height), int(width))


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Put every module of ``model`` in eval mode, and give each its own ``training`` flag back afterwards."""
    flags = {module: module.training for module in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for module, flag in flags.items():
            module.training = flag
