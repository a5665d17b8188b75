"""Small helpers shared by the layers."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import TypeVar

import torch
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


def check_num_tokens(x: torch.Tensor, grid_size: tuple[int, int], num_prefix_tokens: int, layer: str) -> torch.Tensor:
    """``x`` itself, once its ``(B, N, C)`` sequence is checked to hold ``num_prefix_tokens`` and one token per patch of
    ``grid_size``. Modules that call it mark it a leaf of torch.fx graphs (``torch.fx.wrap``): while tracing, ``N`` is
    not a number yet; the traced graph runs the check.

    Raises:
        ValueError: Naming ``layer``, the grid and both counts.
    """
    rows, cols = grid_size
    if x.shape[1] != num_prefix_tokens + rows * cols:
        raise ValueError(
            f"{layer} over a {rows}x{cols} grid with {num_prefix_tokens} prefix tokens expects "
            f"{num_prefix_tokens + rows * cols} tokens, got {x.shape[1]}"
        )
    return x


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
