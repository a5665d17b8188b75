"""The one error a request can end with: :class:`RequestError`, an HTTP status and a one-line reason; and
:func:`check_onnx_backend`, the one check of ``--backend onnx`` (the command line's and the worker's).

Without torch: the HTTP side of ``vit serve`` and its option checks import it.
"""

from __future__ import annotations

from pathlib import Path


class RequestError(Exception):
    """A request that cannot be answered: its HTTP status (400, 404, 413, 415, 503, 504) and one line saying why and
    what to send instead; the server answers ``{"error": message}`` with ``status``.

    Attributes:
        status: The HTTP status code.
        message: The reason, one line.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = " ".join(str(message).split())

    def payload(self) -> dict[str, object]:
        """What the server sends for it (in a batch, in the image's slot): ``{"error": ..., "status": ...}``."""
        return {"error": self.message, "status": self.status}


def check_onnx_backend(source: Path) -> None:
    """Refuse ``--backend onnx`` for ``source`` without a ``model.onnx`` or without ONNX Runtime.

    Raises:
        UsageError: Naming what is missing and how to get it.
    """
    import importlib.util

    from ..errors import UsageError
    from ..export import ONNX_FILE

    if not (source.is_dir() and (source / ONNX_FILE).is_file()):
        raise UsageError(f"--backend onnx runs the {ONNX_FILE} of an export folder and {source} has none: write one "
                         f"with `vit export --ckpt_path {source} --out DIR --onnx`, then serve DIR")  # fmt: skip
    if importlib.util.find_spec("onnxruntime") is None:
        raise UsageError("--backend onnx needs onnxruntime: pip install 'vit[export]'")


__all__ = ["RequestError", "check_onnx_backend"]
