"""One way to write a file so that readers never see half of it: :func:`atomic_write`.

Every file the package writes (checkpoints, CSVs, JSON, HTML, PNGs, caches, compiled kernels) goes through here: the
data lands in a temporary file beside the target (same file system), is flushed and fsynced, and is renamed over the
target with :func:`os.replace`. A failure at any point removes the temporary file and leaves the target as it was.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

TMP_MARK = ".tmp-"
"""Temporary files are ``.<name>.tmp-<pid>-<random>`` beside their target: :func:`remove_stale_temporaries` finds
the ones whose writer died."""


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "wb", **open_kwargs: Any) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path`` for writing; on a clean exit it replaces ``path`` in one rename.

    Args:
        path: The file to write; its folder is created if missing.
        mode: ``"wb"`` (default) or ``"w"`` (text; ``encoding`` defaults to UTF-8).
        **open_kwargs: Passed to :func:`open` (``encoding``, ``newline``).

    Example:
        >>> with atomic_write("report.json", "w") as f:  # doctest: +SKIP
        ...     f.write("{}")
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write writes whole files: mode 'w' or 'wb', not {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "w":
        open_kwargs.setdefault("encoding", "utf-8")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}{TMP_MARK}{os.getpid()}-")
    try:
        with open(fd, mode, **open_kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, default_mode())  # mkstemp makes 0600; a written file gets the usual permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`atomic_write`) and return ``path``."""
    with atomic_write(path, "wb") as f:
        f.write(data)
    return Path(path)


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_write`) and return ``path``."""
    with atomic_write(path, "w") as f:
        f.write(text)
    return Path(path)


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Delete the temporary files of ``path`` left by processes that were killed mid-write (their pid is gone).

    Returns:
        The files removed.
    """
    path = Path(path)
    removed = []
    for tmp in path.parent.glob(f".{path.name}{TMP_MARK}*"):
        pid = tmp.name[len(f".{path.name}{TMP_MARK}") :].split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            with contextlib.suppress(OSError):
                tmp.unlink()
                removed.append(tmp)
    return removed


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (a zombie counts as gone: it will never finish its work)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def default_mode(folder: bool = False) -> int:
    """The permissions ``open`` and ``mkdir`` (so ``cp``) give a new file (``0o666``) or folder (``0o777``) under the
    process's umask: what a file written through a temporary (``mkstemp``, ``mkdtemp``: ``0o600``, ``0o700``) is
    given before it is renamed into place."""
    return (0o777 if folder else 0o666) & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
