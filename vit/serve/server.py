"""The LitServe app of ``vit serve``: :func:`build_server` returns the ``litserve.LitServer``, :func:`run` runs it.

The model runs in LitServe's worker processes (:class:`~vit.serve.api.VitAPI`, batching concurrent requests); the
HTTP process parses the requests (:mod:`vit.serve.payloads`, :mod:`vit.serve.v2`), hands LitServe plain payloads
and writes the answers. Endpoints: ``POST /predict``, ``GET /info``, ``GET /metrics`` (Prometheus),
``GET /health`` (LitServe's), ``GET /`` (the web page of :mod:`vit.serve.page`), ``GET /docs`` (OpenAPI), and the
Open Inference Protocol's ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/{name}``,
``/v2/models/{name}/ready`` and ``POST /v2/models/{name}/infer``. Every error is its status and
``{"error": "<one line>"}``. :mod:`vit.serve.gate` guards the door (API key, bounded queue, body limit, shutdown).

SIGTERM and Ctrl-C drain the server: requests in flight finish, new ones get 503, and the process exits 0 once none
is left or after ``grace`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from starlette.requests import Request

from .errors import RequestError
from .gate import Gate, Shared, error_headers

MAX_BODY = 64 * 1024 * 1024
"""``--max_body``'s default: 64 MiB, a few large photographs in one request."""
WATCH_S = 1.0
"""Seconds between two looks, while a request waits, at whether its worker died (then it gets 503 at once)."""
PLACEHOLDER_PAGE = "<!doctype html><title>vit serve</title><p>vit serve is running: POST images to /predict.</p>"


def build_server(
    model_source: str | Path,
    *,
    backend: str = "torch",
    max_batch_size: int = 8,
    batch_timeout: float = 0.0,
    workers: int = 1,
    threads: int | None = None,
    max_queue: int = 64,
    timeout: float = 30.0,
    max_body: int | None = MAX_BODY,
    max_image_pixels: int | None = None,
    api_key: str | None = None,
    accelerator: str = "auto",
    model_class: type | None = None,
) -> Any:
    """The ``litserve.LitServer`` of a model (not started: :func:`run` or its ``run()``).

    Args:
        model_source: A ``.ckpt`` or export folder (resolved: :mod:`vit.serve.command` resolves ``last`` / ``best``).
        backend: ``"torch"`` or ``"onnx"`` (``model.onnx`` of an export folder).
        max_batch_size: Requests batched into one forward pass at most.
        batch_timeout: Seconds a batch waits to fill; 0: none (what queued while the model was busy).
        workers: Worker processes per device, each with the model.
        threads: Intra-op threads per worker; ``None``: :func:`worker_threads`.
        max_queue: Inference requests in flight at most; the next gets 503 at once.
        timeout: Seconds a request may take (queue and model) before it gets 504.
        max_body: Largest request body in bytes (413 above); ``None``: no limit.
        max_image_pixels: The pixel limit of the images; ``None``: :data:`vit.data.datasets.MAX_IMAGE_PIXELS`.
        api_key: The bearer key every endpoint but the health checks requires; ``None``: none.
        accelerator: LitServe's accelerator (``"auto"``, ``"cpu"``, ``"cuda"``).
        model_class: The predictor class instead of :class:`~vit.serve.model.ServeModel` (a subclass).
    """
    from . import metrics

    metrics_folder = metrics.prepare()  # before prometheus-client is imported anywhere

    from .api import VitAPI
    from .queues import PipeQueueServer

    if max_image_pixels is None:
        from ..data.datasets import MAX_IMAGE_PIXELS as max_image_pixels
    threads = threads or worker_threads(workers)
    api = VitAPI(str(model_source), backend, threads, max_image_pixels, model_class, max_batch_size, batch_timeout)
    shared = Shared(max_queue=max_queue, max_body=max_body, api_key=api_key)
    server = PipeQueueServer(api, accelerator=accelerator, workers_per_device=workers, timeout=timeout,
                             restart_workers=True, middlewares=[(Gate, {"shared": shared})])  # fmt: skip
    server.vit_shared, server.vit_metrics_folder, server.vit_timeout = shared, metrics_folder, timeout
    add_routes(server, api)
    return server


def worker_threads(workers: int, cores: int | None = None, busy: float | None = None) -> int:
    """Intra-op threads of each of ``workers`` worker processes: the threads ``vit explain`` would take
    (:func:`vit.env.default_threads`: the cores less those other processes keep busy now) shared among the workers,
    at least 1 each.

    Args:
        workers: Worker processes.
        cores: The cores this process may use; ``None``: :func:`vit.env.available_cores`.
        busy: The cores other processes keep busy; ``None``: :func:`vit.env.busy_cores`, measured now.
    """
    from ..env import available_cores, busy_cores, default_threads

    cores = available_cores() if cores is None else cores
    busy = busy_cores() if busy is None else busy
    return max(1, default_threads(cores, busy) // max(1, workers))


def add_routes(server: Any, api: Any) -> None:
    """Replace LitServe's ``/``, ``/info`` and ``/predict`` with ours and add ``/metrics`` and the V2 endpoints."""
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    app, routes = server.app, Endpoints(server, api)
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in ("/", "/info", "/predict")]
    for path, endpoint, methods in (
        ("/predict", routes.predict, ["POST"]), ("/info", routes.info, ["GET"]), ("/metrics", routes.metrics, ["GET"]),
        ("/", routes.page, ["GET"]), ("/v2", routes.server_metadata, ["GET"]),
        ("/v2/health/live", routes.live, ["GET"]),
        ("/v2/health/ready", routes.ready, ["GET"]), ("/v2/models/{name}", routes.model_metadata, ["GET"]),
        ("/v2/models/{name}/ready", routes.model_ready, ["GET"]), ("/v2/models/{name}/infer", routes.infer, ["POST"]),
        ("/v2/models/{name}/versions/{version}/infer", routes.infer, ["POST"]),
    ):  # fmt: skip
        app.add_api_route(path, endpoint, methods=methods)
    app.add_exception_handler(RequestError, lambda request, err: JSONResponse(
        {"error": err.message}, err.status, headers=error_headers(err.status) or None))  # fmt: skip
    app.add_exception_handler(HTTPException, http_error)


class Endpoints:
    """The endpoints of the HTTP process: each request's payload goes to LitServe's workers (:meth:`submit`), and the
    model's description is asked of them once (:meth:`description`)."""

    def __init__(self, server: Any, api: Any) -> None:
        from litserve.server import RegularRequestHandler

        self.server, self.handler, self.cache = server, RegularRequestHandler(api, server), {}

    async def submit(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The workers' answer to ``payload``; 504 after ``timeout`` seconds. As LitServe's ``handle_request``, but
        the request's entry in LitServe's response buffer is removed however the wait ends (a timed-out request left
        it behind there, and the buffer grew by one per timeout), and a request whose worker died gets 503 as soon
        as LitServe restarts the worker (:meth:`restarting`) instead of 504 at ``timeout``."""
        from litserve.server import ResponseBufferItem
        from litserve.utils import LitAPIStatus

        timeout, buffer = self.server.vit_timeout, self.server.response_buffer
        sent = time.perf_counter()
        uid, _ = await self.handler._submit_request(payload)
        event = asyncio.Event()
        buffer[uid] = ResponseBufferItem(event)
        deadline = time.monotonic() + timeout
        try:
            while not event.is_set():
                if time.monotonic() >= deadline:
                    raise RequestError(504, f"no answer within {timeout:g} s (--timeout)")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), min(WATCH_S, deadline - time.monotonic()))
                if not event.is_set() and self.restarting(buffer[uid].worker_id):
                    raise RequestError(503, "the model worker holding this request died and is being restarted: "
                                            "retry in a few seconds")  # fmt: skip
        finally:
            item = buffer.pop(uid, None)
        response, status = item.response
        if status == LitAPIStatus.ERROR:
            self.handler._handle_error_response(response)
        if isinstance(response, dict) and "worker_ms" in response:  # the round trip less the worker's own time
            response["handover_ms"] = max(0.0, 1000 * (time.perf_counter() - sent) - response["worker_ms"])
        return response

    def restarting(self, worker_id: int | None) -> bool:
        """Whether the worker ``worker_id`` is not ready: it died and LitServe's monitor is starting it again (its
        requests would otherwise wait for ``--timeout``). A request no worker has taken yet (``None``: the workers
        announce each request they take, LitServe's ``START``): whether any worker is not ready."""
        states = dict(getattr(self.server, "workers_setup_status", None) or {})
        suffix = "" if worker_id is None else f"_{worker_id}"
        return any(key.endswith(suffix) and state != "ready" for key, state in states.items())

    async def description(self, name: str | None = None) -> dict[str, Any]:
        """:meth:`ServeModel.info <vit.serve.model.ServeModel.info>`; 404 if ``name`` is not the model's."""
        if "info" not in self.cache:
            self.cache["info"] = await self.submit({"kind": "info"})
        info = self.cache["info"]
        if name is not None and name != info["model"]:
            raise RequestError(404, f"unknown model {name!r}: this server serves {info['model']!r}")
        return info

    async def predict(self, request: Request) -> Any:
        from fastapi.responses import JSONResponse

        from .payloads import predict_answer, read_predict

        payload = await read_predict(request)
        answer = await self.submit(payload)
        status, content = predict_answer(payload, answer)
        return JSONResponse(content, status_code=status, headers=model_timing(answer))

    async def infer(self, name: str, request: Request) -> Any:
        from fastapi.responses import Response

        from . import v2

        info = await self.description(name)
        payload, parsed = v2.parse_infer(await request.body(), request.headers)
        answer = await self.submit(payload)
        if "error" in answer:
            raise RequestError(int(answer.get("status", 500)), answer["error"])
        body, headers = v2.infer_response(parsed, answer["logits"], info)
        return Response(body, headers={**headers, **model_timing(answer)})

    async def info(self) -> Any:
        from fastapi.responses import JSONResponse

        return JSONResponse(await self.description())

    async def ready(self) -> Any:
        from fastapi.responses import Response

        states = dict(getattr(self.server, "workers_setup_status", None) or {})
        draining = self.server.vit_shared.draining.is_set()
        ok = bool(states) and all(v == "ready" for v in states.values()) and not draining
        return Response(status_code=200 if ok else 503)

    async def live(self) -> Any:
        from fastapi.responses import Response

        return Response(status_code=200)

    async def model_ready(self, name: str) -> Any:
        await self.description(name)
        return await self.ready()

    async def model_metadata(self, name: str) -> Any:
        from fastapi.responses import JSONResponse

        from .v2 import model_metadata

        return JSONResponse(model_metadata(await self.description(name)))

    async def server_metadata(self) -> Any:
        from fastapi.responses import JSONResponse

        import vit

        from .v2 import EXTENSIONS

        return JSONResponse({"name": "vit", "version": vit.__version__, "extensions": EXTENSIONS})

    async def metrics(self) -> Any:
        from fastapi.responses import Response

        from .metrics import exposition

        body, content_type = exposition()
        return Response(body, media_type=content_type)

    async def page(self) -> Any:
        from fastapi.responses import HTMLResponse

        try:
            from .page import page_html
        except ImportError:
            return HTMLResponse(PLACEHOLDER_PAGE)
        return HTMLResponse(page_html())


TIMINGS = {"model": "forward pass", "worker": "in the worker", "handover": "to the worker and back"}
"""The ``Server-Timing`` metrics of an answer that went through the model, and their descriptions."""


def model_timing(answer: dict[str, Any]) -> dict[str, str]:
    """The ``Server-Timing`` header (W3C Server Timing) of an answer that went through the model:
    ``model;dur=MS``, the milliseconds of its forward pass in the worker; ``worker;dur=MS``, the worker's time for
    the batch (decoding, the forward pass, the top classes); ``handover;dur=MS``, the rest of the time from the
    HTTP process handing the request to LitServe to the answer coming back (its queues both ways, and a wait for
    the worker or for a batch to fill). :mod:`vit.serve.gate` adds the request's ``total;dur=MS``: ``total`` less
    ``worker`` and ``handover`` is the HTTP process's own (reading, parsing, encoding the answer). Browsers'
    developer tools show them all."""
    found = [(name, answer.get(f"{name}_ms"), desc) for name, desc in TIMINGS.items()]
    items = [f'{name};dur={ms:.3f};desc="{desc}"' for name, ms, desc in found if ms is not None]
    return {"Server-Timing": ", ".join(items)} if items else {}


def http_error(request: Any, err: Any) -> Any:
    """Starlette's and LitServe's HTTP errors as ``{"error": ...}`` (404 of unknown paths, LitServe's 504, 500)."""
    from fastapi.responses import JSONResponse

    detail = err.detail if isinstance(err.detail, str) else str(err.detail)
    return JSONResponse({"error": detail}, status_code=err.status_code, headers=getattr(err, "headers", None))


def run(model_source: str | Path, *, host: str = "127.0.0.1", port: int = 8000, grace: float = 10.0,
        log_level: str = "warning", **options: Any) -> int:  # fmt: skip
    """Build (:func:`build_server`, ``options``) and serve until SIGTERM or Ctrl-C, then drain: requests in flight
    finish within ``grace`` seconds, new ones get 503; returns 0."""
    from . import metrics

    server = build_server(model_source, **options)
    server.uvicorn_graceful_timeout = grace
    logging.getLogger("litserve.server").addFilter(lambda record: not stopping_noise(server, record))
    drain_on_signals(server, grace)
    bind = "127.0.0.1" if host == "localhost" else host
    try:
        server.run(host=bind, port=port, num_api_servers=1, generate_client_file=False, log_level=log_level)
    finally:
        metrics.cleanup(server.vit_metrics_folder)
    return 0


def stopping_noise(server: Any, record: logging.LogRecord) -> bool:
    """LitServe's log lines of a drained stop that say nothing wrong: its monitor thread losing the stopped manager,
    the HTTP process that already exited."""
    text = record.getMessage()
    return server.vit_shared.draining.is_set() and ("Monitoring worker crashed" in text or "not alive" in text)


def drain_on_signals(server: Any, grace: float) -> None:
    """SIGTERM and SIGINT start the drain (:func:`drain`); a second one stops at once."""

    def handle(signum: int, frame: Any) -> None:
        shared = server.vit_shared
        if shared.draining.is_set():
            stop(server)
            return
        shared.draining.set()
        name = signal.Signals(signum).name
        print(f"vit serve: {name}: finishing {shared.in_flight.value} requests in flight (at most {grace:g} s), "
              "refusing new ones", file=sys.stderr, flush=True)  # fmt: skip
        threading.Thread(target=drain, args=(server, grace), daemon=True, name="vit-serve-drain").start()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def drain(server: Any, grace: float) -> None:
    """Wait until no request is in flight or ``grace`` seconds have passed, then stop the server."""
    deadline = time.monotonic() + grace
    while server.vit_shared.in_flight.value > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop(server)


def stop(server: Any) -> None:
    """Stop LitServe (its HTTP process, then its workers) as its own shutdown endpoint does."""
    event = getattr(server, "_shutdown_event", None)
    if event is not None:
        event.set()


__all__ = ["build_server", "run", "worker_threads"]
