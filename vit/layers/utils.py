"""Small helpers shared by the layers."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import TypeVar

from torch import nn

T = TypeVar("T")


def lru_get(cache: OrderedDict, key: Hashable, build: Callable[[], T], size: int) -> T:
    """``cache[key]``, made by ``build()`` when missing; only the ``size`` most recently used entries are kept."""
    if key in cache:
        cache.move_to_end(key)
    else:
        cache[key] = build()
        if len(cache) > size:
            cache.popitem(last=False)
    return cache[key]


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
