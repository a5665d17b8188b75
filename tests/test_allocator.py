"""vit.allocator: glibc keeps freed blocks for reuse, and a user's own malloc settings win (the benchmark's and the
CLI's switches are tested beside their other options).

Checked against glibc's own accounting (mallinfo2), which no other process changes; what keeping the blocks saves
(page faults, time) depends on the machine's other work and is measured by ``vit bench`` (``--keep_freed_memory``
against ``--keep_freed_memory false``), never asserted here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vit import allocator

# Where glibc puts a fresh 24 MiB block, from its own accounting (mallinfo2: bytes in mmapped blocks).
MAPPED = """
import ctypes, sys, torch
from vit.allocator import keep_freed_memory
class MallInfo2(ctypes.Structure):
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(name, ctypes.c_size_t) for name in names.split()]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep":
    assert keep_freed_memory()
before = libc.mallinfo2().hblkhd
block = torch.ones(6 * 2**20)
print(libc.mallinfo2().hblkhd - before)
"""
MIB = 2**20


def run_python(code: str, *args: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not allocator.is_glibc(), reason="glibc's malloc only")
def test_large_blocks_come_from_the_heap_not_fresh_mappings():
    assert run_python(MAPPED, "default") >= 24 * MIB  # glibc's default: a block this large is a fresh mmap
    assert run_python(MAPPED, "keep") == 0  # below the raised threshold: served from the heap


@pytest.mark.parametrize(
    "name, value",
    [
        ("MALLOC_TRIM_THRESHOLD_", "131072"),
        ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=131072"),
        ("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
    ],
)
def test_a_users_own_malloc_settings_are_left_alone(name, value, monkeypatch):
    monkeypatch.setattr(allocator, "_applied", False)
    monkeypatch.setenv(name, value)

    def no_libc(*args, **kwargs):
        raise AssertionError("mallopt must not be called")

    monkeypatch.setattr(allocator.ctypes, "CDLL", no_libc)
    assert allocator.keep_freed_memory() is False
