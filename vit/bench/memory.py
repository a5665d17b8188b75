"""Peak tensor memory of a step on any device: the CUDA allocator's counters, or a dispatch-mode tracker on the CPU."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vit.bench.harness import synchronize


class TensorMemoryTracker(TorchDispatchMode):
    """Peak bytes of the tensor storages that ops allocate while the mode is active, on any device.

    The CPU stand-in for ``torch.cuda.max_memory_allocated``: every storage an op returns that is not one of its
    inputs' storages counts from its creation until it is freed (a finaliser on the storage). Storages that existed
    before (parameters, optimizer state) are not counted; add them yourself. Only eager ops are seen: kernels that
    ``torch.compile`` generates allocate outside the dispatcher.
    """

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._live: dict[tuple[str, int], weakref.finalize] = {}

    def _release(self, key: tuple[str, int], nbytes: int) -> None:
        self.current -= nbytes
        self._live.pop(key, None)

    @staticmethod
    def _storage(value: Any) -> torch.UntypedStorage | None:
        if not isinstance(value, torch.Tensor):
            return None
        try:
            return value.untyped_storage()
        except (RuntimeError, NotImplementedError):  # tensors without storage (nested, some subclasses)
            return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        inputs = {(str(s.device), s.data_ptr()) for s in map(self._storage, leaves) if s is not None}
        for value in torch.utils._pytree.tree_leaves(out):
            storage = self._storage(value)
            if storage is None or storage.nbytes() == 0:
                continue
            key = (str(storage.device), storage.data_ptr())
            if key in inputs or key in self._live:
                continue
            nbytes = storage.nbytes()
            self.current += nbytes
            self.peak = max(self.peak, self.current)
            self._live[key] = weakref.finalize(storage, self._release, key, nbytes)
        return out


def peak_bytes(fn: Callable[[], Any], device: torch.device) -> int:
    """Peak bytes that ``fn`` allocates on top of what is already allocated: CUDA allocator or the tracker."""
    if device.type == "cuda":
        synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    with TensorMemoryTracker() as tracker:
        fn()
    return tracker.peak


def tensor_bytes(tensors: Iterator[torch.Tensor]) -> int:
    """Bytes held by ``tensors`` (parameters, optimizer state), counted by element."""
    return sum(t.numel() * t.element_size() for t in tensors)
