"""vit.allocator: glibc keeps freed blocks for reuse, and a user's own malloc settings win (the benchmark's and the
CLI's switches are tested beside their other options)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vit import allocator

# Four 8 MiB blocks alive together, then all freed: with glibc's defaults they usually come back as fresh pages
# (40,800 faults over these 5 steps here), but not always (an allocation that lands above them keeps them in the
# heap; a CI run saw that in three processes in a row), so the defaults' faults are no reference to test against.
STEPS = """
import resource, torch
from vit.allocator import keep_freed_memory
assert keep_freed_memory()
def step():
    blocks = [torch.ones(2**21) for _ in range(4)]
    del blocks
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

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


@pytest.mark.slow
@pytest.mark.skipif(not allocator.is_glibc(), reason="glibc's malloc only")
def test_freed_blocks_are_reused_without_page_faults():
    pages = 5 * 4 * (2**21 * 4) // os.sysconf("SC_PAGE_SIZE")  # every block of every step faulted in again
    assert run_python(STEPS) <= 0.01 * pages  # kept: the blocks are reused (0 here)


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
