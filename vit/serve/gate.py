"""What every request of ``vit serve`` passes first: :class:`Gate`, one ASGI middleware, and the bind rule.

In order: the API key (``Authorization: Bearer KEY`` on every endpoint but the health checks), the shutdown (while
the server drains, new requests get 503 at once), the bounded queue (an inference request past ``max_queue`` in
flight gets 503 and ``Retry-After`` at once, never a wait), the body limit (413 from ``Content-Length`` before the
body is read, and while it streams), then the request, counted in the Prometheus metrics and timed (a
``Server-Timing: total;dur=MS`` header on every answer). The counters are shared with the process that handles
SIGTERM (:class:`Shared`), which waits for the requests in flight before it stops.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from .errors import RequestError

API_KEY_ENV = "VIT_SERVE_API_KEY"
PUBLIC_PATHS = ("/", "/health", "/v2/health/live", "/v2/health/ready")
"""Answered without the API key: the health checks (load balancers and orchestrators probe them) and the page, which a
browser loads without a header and which holds no data (it asks for the key when ``/info`` or ``/predict`` answer
401)."""
RETRY_AFTER_FULL = 1
"""Seconds a client is asked to wait when the queue is full."""


def key_error(authorization: str | None, key: str | None) -> RequestError | None:
    """The 401 of a request whose ``Authorization`` header is not ``Bearer key`` (compared in constant time), or
    ``None`` when it is or when there is no ``key``."""
    if not key or hmac.compare_digest((authorization or "").encode(), f"Bearer {key}".encode()):
        return None
    return RequestError(401, "missing or wrong API key: send the header `Authorization: Bearer KEY`")


def error_headers(status: int) -> dict[str, str]:
    """The headers an error answer carries beside its body: ``Retry-After`` on 503, ``WWW-Authenticate`` on 401."""
    if status == 503:
        return {"Retry-After": str(RETRY_AFTER_FULL)}
    if status == 401:
        return {"WWW-Authenticate": "Bearer"}
    return {}


def total_timing(start: float) -> tuple[bytes, bytes]:
    """The ``Server-Timing`` header of the milliseconds since ``start`` (``time.perf_counter()`` when the request
    reached the server): ``total;dur=MS``, beside the ``model;dur=MS`` of an answer that went through the model. Their
    difference is the server's own time for the request: HTTP, decoding, the hand-over to the worker and back."""
    return b"server-timing", f"total;dur={1000 * (time.perf_counter() - start):.3f}".encode()


def is_loopback(host: str) -> bool:
    """Whether ``host`` binds the loopback interface only (``127.0.0.1``, ``::1``, ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None, insecure: bool = False) -> str | None:
    """The API key that guards a server bound to ``host``: ``api_key``, else :data:`API_KEY_ENV`'s value; a
    non-loopback host needs one unless ``insecure``.

    Raises:
        UsageError: For a non-loopback host without a key and without ``insecure``.
    """
    key = api_key or os.environ.get(API_KEY_ENV) or None
    if key is None and not insecure and not is_loopback(host):
        raise UsageError(
            f"--host {host} accepts requests from other machines: give a key with --api_key KEY (or the environment"
            f" variable {API_KEY_ENV}; clients send `Authorization: Bearer KEY`), or pass --insecure to serve without"
            " one"
        )
    return key


@dataclass
class Shared:
    """Counters shared by the HTTP process and the process that handles signals (created before the fork)."""

    max_queue: int = 64
    max_body: int | None = None
    api_key: str | None = None
    in_flight: Any = field(default_factory=lambda: mp.Value("i", 0))
    draining: Any = field(default_factory=mp.Event)


def inference(scope: dict[str, Any]) -> bool:
    """Whether a request runs the model (and so counts against ``max_queue``)."""
    path = scope["path"]
    return scope["method"] == "POST" and (path == "/predict" or (path.startswith("/v2/") and path.endswith("/infer")))


class Gate:
    """The ASGI middleware of the module docstring.

    Args:
        app: The application.
        shared: The limits and the counters.
    """

    def __init__(self, app: Any, shared: Shared) -> None:
        self.app = app
        self.shared = shared

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from .metrics import observe_request

        start, status = time.perf_counter(), [500]  # 500 until the answer starts

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), total_timing(start)]}
            await send(message)

        counted = False
        try:
            self.admit(scope)
            if inference(scope):
                self.enter()
                counted = True  # only once counted in: a request refused by enter() must not be counted out
            await self.app(scope, self.limited(scope, receive), sending)
        except RequestError as err:
            if status[0] != 500:  # the answer has started (a body cut past max_body while it streams): too late
                raise
            await reply(sending, err)
        finally:
            if counted:
                self.leave()
            observe_request(scope["path"], status[0], time.perf_counter() - start)

    def admit(self, scope: dict[str, Any]) -> None:
        """Refuse a request without the key (401), during shutdown (503) or with too large a body (413)."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        denied = key_error(headers.get("authorization"), self.shared.api_key)
        if denied and scope["path"] not in PUBLIC_PATHS:
            raise denied
        if self.shared.draining.is_set():
            raise RequestError(503, "the server is shutting down: retry on another replica or after it restarts")
        length = headers.get("content-length", "")
        if self.shared.max_body and length.isdigit() and int(length) > self.shared.max_body:
            raise RequestError(413, f"the body has {int(length):,} bytes, above the limit of "
                                    f"{self.shared.max_body:,} (--max_body)")  # fmt: skip

    def enter(self) -> None:
        """Count an inference request in, or refuse it (503) when ``max_queue`` are in flight."""
        from .metrics import set_queue_depth

        with self.shared.in_flight.get_lock():
            depth = self.shared.in_flight.value
            if depth >= self.shared.max_queue:
                raise RequestError(503, f"the server is busy: {depth} requests in flight (--max_queue "
                                        f"{self.shared.max_queue}); retry after {RETRY_AFTER_FULL} s")  # fmt: skip
            self.shared.in_flight.value = depth + 1
        set_queue_depth(depth + 1)

    def leave(self) -> None:
        from .metrics import set_queue_depth

        with self.shared.in_flight.get_lock():
            self.shared.in_flight.value -= 1
            depth = self.shared.in_flight.value
        set_queue_depth(depth)

    def limited(self, scope: dict[str, Any], receive: Any) -> Any:
        """``receive`` that stops a body streaming past ``max_body`` (413)."""
        limit, total = self.shared.max_body, [0]
        if not limit:
            return receive

        async def receiving() -> dict[str, Any]:
            message = await receive()
            total[0] += len(message.get("body", b""))
            if total[0] > limit:
                raise RequestError(413, f"the body is above the limit of {limit:,} bytes (--max_body)")
            return message

        return receiving


async def reply(send: Any, error: RequestError) -> None:
    """Answer ``{"error": message}`` with the error's status (and ``Retry-After`` for 503)."""
    body = json.dumps({"error": error.message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error_headers(error.status).items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = ["API_KEY_ENV", "Gate", "Shared", "check_bind", "error_headers", "is_loopback", "key_error"]
