"""The one error a request can end with: :class:`RequestError`, an HTTP status and a one-line reason.

Standard library only: the HTTP side of ``vit serve`` imports it without torch.
"""

from __future__ import annotations


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


__all__ = ["RequestError"]
