"""The CPU kernel of sliding-window attention (``csrc/neighborhood_attention_cpu.cpp``): exact, fused, trainable.

Each patch query computes its scores against exactly its ``k × k`` neighbours and the prefix keys, so nothing is
masked, gathered or padded (the tiled path of :class:`~vit.layers.NeighborhoodAttention` hands ``(t + k - 1)²`` keys
to every tile of ``t × t`` queries). Prefix queries attend to every token in the same call.

The source is plain C++ with a C interface and no torch headers. Nothing is compiled when a layer is built: the
layer's first forward that would run the kernel (CPU, fp32, no autocast, no ``torch.func`` transform) calls
:func:`ready`, which calls :func:`load` once per process. The first time on a machine that compiles the source with
the system's C++ compiler (``$CXX``, else ``c++``, ``g++`` or ``clang++``; about two seconds) into :func:`cache_dir`,
keyed by the source, the compiler, the flags and the CPU; afterwards it only loads it with :mod:`ctypes`. A model
that runs only on CUDA (FlexAttention), or is only built, inspected or exported by ``vit export`` (explicit paths),
never compiles it. The kernel is called through a :func:`torch.library.custom_op` with its fake (shape) function
and autograd formula registered, so ``torch.compile(fullgraph=True)`` traces the layer as one opaque op.
Without a compiler (or with ``VIT_NEIGHBORHOOD_KERNEL=0``) the layer uses its tiled path and says so once in the log.

fp32 only; head dims 16, 32, 48, 64, 96 and 128 run vectorised code, other head dims a plain loop.
The work is split over (image, head) pairs across ``torch.get_num_threads()`` threads (ctypes releases the GIL).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from ..atomic import write_bytes

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "neighborhood_attention_cpu.cpp"
FLAG_SETS = (  # tried in order: tuned for this CPU, then portable
    ["-std=c++17", "-O3", "-march=native", "-fno-math-errno", "-shared", "-fPIC"],
    ["-std=c++17", "-O3", "-fno-math-errno", "-shared", "-fPIC"],
)
ENV_SWITCH = "VIT_NEIGHBORHOOD_KERNEL"
ABI_VERSION = 1
"""The C interface this module calls (``vit_na_abi_version()`` in the source): a library that reports another version
is refused at load, with both numbers, instead of being called with the wrong arguments."""
COMPILE_TIMEOUT_S = 300

_lib: ctypes.CDLL | None = None
_state = "not built"  # "not built", "ready" or why it is unavailable
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_key = (0, 0)  # (process id, threads): a forked child starts its own pool (the parent's threads are not in it)


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$VIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/vit``, else ``~/.cache/vit``."""
    if os.environ.get("VIT_CACHE_DIR"):
        return Path(os.environ["VIT_CACHE_DIR"]) / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vit" / "kernels"


def find_compiler() -> list[str] | None:
    """The compiler's command: ``$CXX`` if set (it may carry a launcher, as ``ccache g++``), else the first of
    ``c++``, ``g++``, ``clang++`` on the PATH."""
    if os.environ.get("CXX"):
        return shlex.split(os.environ["CXX"])
    return next(([c] for c in ("c++", "g++", "clang++") if shutil.which(c)), None)


def _cpu_fingerprint() -> str:
    """What ``-march=native`` depends on: the machine and, on Linux, the CPU's flags."""
    flags = ""
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        flags = next((line for line in lines if line.startswith(("flags", "Features"))), "")
    return f"{platform.machine()} {platform.processor()} {flags}"


def build(compiler: list[str] | None = None) -> Path:
    """Compile the kernel (or find it compiled) and return the shared library's path.

    Raises:
        RuntimeError: No compiler, or none of the flag sets compiled; the message carries the compiler's output.
    """
    compiler = compiler or find_compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++ or clang++)")
    source = SOURCE.read_bytes()
    try:
        version = subprocess.run([*compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise RuntimeError(f"the C++ compiler {shlex.join(compiler)!r} does not run: {err}") from None
    errors = []
    for flags in FLAG_SETS:
        parts = [source, version.encode(), " ".join(flags).encode(), _cpu_fingerprint().encode()]
        key = hashlib.sha256(b"\0".join(parts))
        target = cache_dir() / f"neighborhood_attention_cpu-{key.hexdigest()[:16]}.so"
        if target.exists():
            return target
        # The compiler writes into a private folder; the library reaches the cache through vit.atomic, so processes
        # building at once (DDP) never load half a file, and a failed build leaves nothing in the cache.
        with tempfile.TemporaryDirectory(prefix="vit-kernel-") as scratch:
            built = Path(scratch) / target.name
            command = [*compiler, *flags, str(SOURCE), "-o", str(built)]
            result = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
            if result.returncode == 0:
                write_bytes(target, built.read_bytes())
                log.info("vit: compiled the CPU sliding-window kernel into %s", target)
                return target
        errors.append(f"{' '.join(flags)}: {result.stderr.strip()[-2000:]}")
    raise RuntimeError(f"{shlex.join(compiler)} could not compile {SOURCE.name}:\n" + "\n".join(errors))


def load() -> ctypes.CDLL | None:
    """The kernel's library, built on first call; ``None`` (logged once, with the reason) where it cannot be."""
    global _lib, _state
    if _state != "not built":
        return _lib
    with _lock:
        if _state != "not built":
            return _lib
        if os.environ.get(ENV_SWITCH, "1") == "0":
            _state = f"switched off ({ENV_SWITCH}=0)"
        else:
            try:
                path = build()
                lib = ctypes.CDLL(str(path))
                lib.vit_na_abi_version.restype = ctypes.c_int
                if (found := lib.vit_na_abi_version()) != ABI_VERSION:
                    raise RuntimeError(
                        f"{path} has C interface version {found}, this module calls version {ABI_VERSION}"
                    )
                pointers, ints = [ctypes.c_void_p], [ctypes.c_int64]
                tail = ints * 5 + [ctypes.c_float] + ints * 2
                lib.vit_na_forward.argtypes = pointers * 7 + tail
                lib.vit_na_backward.argtypes = pointers * 11 + tail
                lib.vit_na_forward.restype = lib.vit_na_backward.restype = None
                _lib, _state = lib, "ready"
            except (OSError, RuntimeError, subprocess.SubprocessError) as err:
                _state = str(err)
        if _lib is None:
            log.warning("vit: the CPU sliding-window kernel is unavailable, using the tiled path: %s", _state)
    return _lib


@torch.compiler.assume_constant_result  # run once while tracing and compiled in as a constant: no graph break
def ready() -> bool:
    """Build or load the kernel on the first call that needs it (:func:`load`) and say whether it is there.

    The layer's CPU fp32 forward calls it before taking the kernel's path, so building a layer compiles nothing and a
    model that only runs on CUDA never compiles the kernel. Under ``torch.compile`` it runs once while tracing and its
    answer is compiled in, so a model compiled before it ever ran eagerly traces the kernel's op too.
    """
    return load() is not None


def available() -> bool:
    """Whether the kernel is loaded; builds nothing (reads a flag only, so ``torch.compile`` traces it without a graph
    break)."""
    return _lib is not None


def status() -> str:
    """``"ready"``, ``"not built"`` or why the kernel is unavailable."""
    return _state


def _run(fn, args: list, units: int) -> None:
    """Call ``fn(*args, begin, end)`` over the (image, head) units, split across torch's thread count."""
    global _pool, _pool_key
    threads = max(1, min(torch.get_num_threads(), units))
    bounds = [units * i // threads for i in range(threads + 1)]
    if threads > 1:
        with _lock:
            if _pool_key[0] != os.getpid() or _pool_key[1] < threads - 1:
                # Not shut down: another thread may still be submitting to it. Its idle workers exit once the
                # executor is garbage-collected.
                _pool = ThreadPoolExecutor(threads - 1, thread_name_prefix="vit-neighborhood")
                _pool_key = (os.getpid(), threads - 1)
            pool = _pool
        others = [pool.submit(fn, *args, bounds[i], bounds[i + 1]) for i in range(1, threads)]
    fn(*args, bounds[0], bounds[1])  # this thread takes the first share
    if threads > 1:
        for future in others:
            future.result()


def _library() -> ctypes.CDLL:
    lib = load()
    if lib is None:
        raise RuntimeError(f"the CPU sliding-window kernel is unavailable: {status()}")
    return lib


def _empty_outputs(q: torch.Tensor, neighbours: torch.Tensor, prefix: int) -> tuple[torch.Tensor, ...]:
    """``out`` (like ``q``, packed), ``prob`` ``(B, heads, N - prefix, K)`` and ``prob_prefix`` ``(B, heads, prefix,
    N)``, uninitialised."""
    B, N, H, D = q.shape
    return q.new_empty(B, N, H, D), q.new_empty(B, H, N - prefix, neighbours.shape[1]), q.new_empty(B, H, prefix, N)


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, neighbours: torch.Tensor, prefix: int) -> None:
    """Every index the kernel reads stays inside the tensors."""
    if q.dim() != 4:
        raise ValueError(f"q must be (batch, tokens, heads, head_dim), got shape {tuple(q.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != torch.float32 or t.device.type != "cpu" or t.shape != q.shape:
            raise ValueError(f"{name} must be a float32 CPU tensor of q's shape, got {t.dtype} {tuple(t.shape)}")
    N = q.shape[1]
    if not 0 <= prefix <= N:
        raise ValueError(f"num_prefix_tokens must be in [0, {N}] (the number of tokens), got {prefix}")
    if neighbours.dtype != torch.int64 or neighbours.device.type != "cpu" or neighbours.dim() != 2:
        raise ValueError(f"neighbours must be a 2-D int64 CPU tensor, got {neighbours.dtype} {tuple(neighbours.shape)}")
    if neighbours.shape[0] != N - prefix:
        raise ValueError(f"neighbours has {neighbours.shape[0]} rows for {N - prefix} patch queries ({N} tokens)")
    low, high = (int(neighbours.min()), int(neighbours.max())) if neighbours.numel() else (0, 0)
    if low < 0 or high >= N:
        raise ValueError(f"neighbours must index tokens in [0, {N}), got [{low}, {high}]")


@torch.library.custom_op("vit::neighborhood_attention_cpu", mutates_args=())
def neighborhood_attention_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, neighbours: torch.Tensor, num_prefix_tokens: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention of each patch query to its neighbours and of each prefix query to every token.

    Args:
        q, k, v: ``(B, N, heads, head_dim)`` float32; the first ``num_prefix_tokens`` tokens are prefix tokens.
        neighbours: ``(N - prefix, K)`` int64: the tokens (prefix and patches) each patch query attends to.
        num_prefix_tokens: Number of prefix tokens.
        scale: Multiplies the scores (``head_dim ** -0.5``).

    Returns:
        ``out`` ``(B, N, heads, head_dim)``, and the softmax probabilities kept for the backward: ``(B, heads,
        N - prefix, K)`` of the patch queries and ``(B, heads, prefix, N)`` of the prefix queries.
    """
    lib = _library()
    _check(q, k, v, neighbours, num_prefix_tokens)
    q, k, v, neighbours = q.contiguous(), k.contiguous(), v.contiguous(), neighbours.contiguous()
    B, N, H, D = q.shape
    out, prob, prob_prefix = _empty_outputs(q, neighbours, num_prefix_tokens)
    args = [_ptr(t) for t in (q, k, v, neighbours, out, prob, prob_prefix)]
    _run(lib.vit_na_forward, [*args, N, H, D, num_prefix_tokens, neighbours.shape[1], scale], B * H)
    return out, prob, prob_prefix


@neighborhood_attention_cpu.register_fake
def _(q, k, v, neighbours, num_prefix_tokens, scale):
    return _empty_outputs(q, neighbours, num_prefix_tokens)


@torch.library.custom_op("vit::neighborhood_attention_cpu_backward", mutates_args=())
def neighborhood_attention_cpu_backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    neighbours: torch.Tensor,
    out: torch.Tensor,
    prob: torch.Tensor,
    prob_prefix: torch.Tensor,
    num_prefix_tokens: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of ``q``, ``k`` and ``v`` from the forward's outputs and the gradient of ``out``."""
    lib = _library()
    # The kernel reads packed layouts: whatever strides the caller's tensors (saved for the backward) have.
    tensors = [t.contiguous() for t in (q, k, v, neighbours, out, prob, prob_prefix, grad)]
    B, N, H, D = q.shape
    grad_q, grad_k, grad_v = q.new_empty(q.shape), q.new_zeros(q.shape), q.new_zeros(q.shape)
    tensors += [grad_q, grad_k, grad_v]
    args = [_ptr(t) for t in tensors] + [N, H, D, num_prefix_tokens, neighbours.shape[1], scale]
    _run(lib.vit_na_backward, args, B * H)
    return grad_q, grad_k, grad_v


@neighborhood_attention_cpu_backward.register_fake
def _(grad, q, k, v, neighbours, out, prob, prob_prefix, num_prefix_tokens, scale):
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, neighbours, num_prefix_tokens, scale = inputs
    out, prob, prob_prefix = output
    ctx.mark_non_differentiable(prob, prob_prefix)  # kept for the backward, not a result to differentiate
    ctx.save_for_backward(q, k, v, neighbours, out, prob, prob_prefix)
    ctx.num_prefix_tokens, ctx.scale = num_prefix_tokens, scale


def _backward(ctx, grad_out, _grad_prob, _grad_prob_prefix):
    q, k, v, neighbours, out, prob, prob_prefix = ctx.saved_tensors
    grads = neighborhood_attention_cpu_backward(
        grad_out, q, k, v, neighbours, out, prob, prob_prefix, ctx.num_prefix_tokens, ctx.scale
    )
    return *grads, None, None, None


neighborhood_attention_cpu.register_autograd(_backward, setup_context=_setup_context)
