"""Ray Serve engine of ``vit serve`` (``--engine ray``): the same ``/predict`` answers as the LitServe server, served
by replicas that a Ray cluster can spread over many machines.

Two deployments make the application (Ray Serve's model composition):

- ``Classifier``: one :class:`~vit.serve.model.ServeModel` per replica. Each image of a request is one call; calls
  from all requests are gathered by ``@serve.batch`` (``max_batch_size`` images or ``batch_timeout`` seconds) into one
  :meth:`ServeModel.predict` per ``top_k`` and ``explain`` setting. ``max_ongoing_requests`` bounds the calls a
  replica holds; the replicas are ``num_replicas`` or, with ``autoscale``, between its two bounds.
- ``Ingress``: a light FastAPI front (no model) that reads the request and writes the answer with the LitServe
  server's own functions (:mod:`vit.serve.payloads`), sending each image to a ``Classifier`` replica.
  A full queue (``max_queue`` calls waiting at its handle, Ray's ``BackPressureError``) answers 503 with
  ``Retry-After`` at once; a replica that dies under a call (killed, its node lost) is retried on another replica,
  and answers 503 only when none is left; ``timeout`` seconds answer 504.

``build_app`` returns the application for ``serve.run``; ``deploy_config`` returns the Serve config that
``serve deploy`` reads on a cluster (``vit serve --engine ray --print_config > serve.yaml``), whose ``import_path``
is :func:`app_builder`. Ray is an optional extra: ``pip install "vit[serve-ray]"``.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request) at run time, and
# Ray's class-based ingress does not resolve string annotations.
import asyncio
import logging
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from vit.serve.errors import RequestError
from vit.serve.gate import API_KEY_ENV, error_headers, key_error
from vit.serve.payloads import predict_answer, read_predict

RETRIES = 2
"""Other replicas tried after a replica died under a call, before the answer is 503."""

logger = logging.getLogger("ray.serve")
ingress_app = FastAPI(title="vit serve (Ray Serve)")


@serve.deployment(name="Classifier", max_ongoing_requests=16, max_queued_requests=64)
class Classifier:
    """One :class:`~vit.serve.model.ServeModel`; each call is one image, batched with the other calls."""

    def __init__(
        self,
        model_source: str,
        backend: str = "torch",
        threads: int | None = None,
        max_batch_size: int = 8,
        batch_timeout: float = 0.0,
        max_image_pixels: int | None = None,
    ) -> None:
        from vit.data.datasets import MAX_IMAGE_PIXELS
        from vit.serve.model import ServeModel

        pixels = MAX_IMAGE_PIXELS if max_image_pixels is None else max_image_pixels
        self.model = ServeModel(model_source, backend=backend, threads=threads, max_image_pixels=pixels)
        self.classify.set_max_batch_size(max_batch_size)
        self.classify.set_batch_wait_timeout_s(batch_timeout)

    def info(self) -> dict[str, Any]:
        return self.model.info()

    async def __call__(self, data: bytes, top_k: int, explain: str | None, explorer: bool) -> dict[str, Any]:
        """One image's result, or ``{"error": ..., "status": ...}`` (a bad image is an answer, not an exception, so
        that Ray never logs it as a failure)."""
        try:
            image = await asyncio.to_thread(self.model.decode, data)
            return await self.classify((image, top_k, explain, explorer))
        except RequestError as err:
            return err.payload()

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.0)  # both set per deployment in __init__
    async def classify(self, items: list[tuple[Any, int, str | None, bool]]) -> list[dict[str, Any]]:
        """One :meth:`ServeModel.predict` per distinct ``(top_k, explain, explorer)`` of the batch, in call order."""
        groups: dict[tuple[int, str | None, bool], list[int]] = defaultdict(list)
        for i, (_, *setting) in enumerate(items):
            groups[tuple(setting)].append(i)
        answers: list[dict[str, Any]] = [{}] * len(items)
        for (top_k, explain, explorer), slots in groups.items():
            images = [items[i][0] for i in slots]
            try:
                results = await asyncio.to_thread(self.model.predict, images, top_k, explain, explorer)
            except RequestError as err:  # an unknown explanation method for this model: every image of the group
                results = [err.payload()] * len(slots)
            for i, result in zip(slots, results, strict=True):
                answers[i] = result
        return answers


def _error(status: int, body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=error_headers(status) or None)


@serve.deployment(name="Ingress", max_ongoing_requests=256, max_queued_requests=256)
@serve.ingress(ingress_app)
class Ingress:
    """The HTTP front: reads requests, calls ``Classifier`` once per image, maps failures to status codes."""

    def __init__(
        self, classifier: DeploymentHandle, timeout: float = 30.0, max_body: int | None = None, auth: bool = False
    ) -> None:
        self.classifier = classifier
        self.timeout = timeout
        self.max_body = max_body
        self.api_key = os.environ.get(API_KEY_ENV) if auth else None  # the key never goes into a Serve config
        if auth and not self.api_key:
            raise RuntimeError(f"this deployment needs an API key: set {API_KEY_ENV} where the replicas run")

    def _denied(self, request: Request) -> JSONResponse | None:
        denied = key_error(request.headers.get("authorization"), self.api_key)
        return None if denied is None else _error(denied.status, {"error": denied.message})

    async def _one(self, data: bytes, top_k: int, explain: str | None, explorer: bool) -> dict[str, Any]:
        """One image's answer, retried on another replica when its replica dies under the call."""
        for attempt in range(RETRIES + 1):
            response = self.classifier.remote(data, top_k, explain, explorer)
            try:
                return await asyncio.wait_for(response, self.timeout)
            except BackPressureError:
                return RequestError(503, "the server is busy: its queue is full, retry later").payload()
            except asyncio.TimeoutError:
                response.cancel()
                return RequestError(504, f"no answer within {self.timeout:g} s").payload()
            except (ActorDiedError, ActorUnavailableError, RayActorError) as err:
                logger.warning("a Classifier replica died under a call (%s); try %d of %d",
                               type(err).__name__, attempt + 1, RETRIES + 1)  # fmt: skip
        return RequestError(503, "no replica could answer, retry later").payload()

    @ingress_app.post("/predict")
    async def predict(self, request: Request):
        if denied := self._denied(request):
            return denied
        size = int(request.headers.get("content-length") or 0)
        if self.max_body and size > self.max_body:
            return _error(413, {"error": f"the body has {size} bytes, more than the server's limit {self.max_body}"})
        try:
            payload = await read_predict(request)
        except RequestError as err:
            return _error(err.status, {"error": err.message})
        settings = (payload["top_k"], payload["explain"], payload["explorer"])
        results = await asyncio.gather(*(self._one(data, *settings) for data in payload["images"]))
        if all(r.get("status") == 503 for r in results):  # nothing answered: the whole request may be retried
            return _error(503, {"error": results[0]["error"]})
        status, body = predict_answer(payload, {"results": results})
        return _error(status, body) if status != 200 else JSONResponse(body)

    @ingress_app.get("/health")
    async def health(self):
        return PlainTextResponse("ok")

    @ingress_app.get("/info")
    async def info(self, request: Request):
        if denied := self._denied(request):
            return denied
        return JSONResponse(await self.classifier.info.remote())


def _deployments(
    *,
    workers: int = 1,
    autoscale: tuple[int, int] | None = None,
    max_batch_size: int = 8,
    max_queue: int = 64,
    cpus_per_replica: float = 1.0,
    grace: float = 10.0,
) -> dict[str, dict[str, Any]]:
    """The options of both deployments, as Ray's ``Deployment.options`` and a Serve config's ``deployments`` take
    them."""
    classifier: dict[str, Any] = {
        # a batch being computed and a full one waiting: more would only wait in the replica instead of the queue
        "max_ongoing_requests": 2 * max_batch_size,
        "max_queued_requests": max_queue,
        "graceful_shutdown_timeout_s": grace,
        "ray_actor_options": {"num_cpus": cpus_per_replica},
    }
    if autoscale:
        low, high = autoscale
        classifier["autoscaling_config"] = {
            "min_replicas": low,
            "max_replicas": high,
            "target_ongoing_requests": max_batch_size,
        }
    else:
        classifier["num_replicas"] = workers
    ingress = {
        # an image waits in the classifier's queue, not here: the front only has to hold every waiting request
        "max_ongoing_requests": max(256, 4 * max_queue),
        "max_queued_requests": max(256, 4 * max_queue),
        "graceful_shutdown_timeout_s": grace,
        "ray_actor_options": {"num_cpus": 0},
    }
    return {"Classifier": classifier, "Ingress": ingress}


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The model's, the front's and the deployments' share of ``build_app``'s keywords."""
    model_keys = ("backend", "threads", "max_batch_size", "batch_timeout", "max_image_pixels")
    model = {k: options.pop(k) for k in model_keys if k in options}
    front = {k: options.pop(k) for k in ("timeout", "max_body") if k in options}
    shape = {
        k: options.pop(k) for k in ("workers", "autoscale", "max_queue", "cpus_per_replica", "grace") if k in options
    }
    if "max_batch_size" in model:
        shape["max_batch_size"] = model["max_batch_size"]
    if model.get("threads") and "cpus_per_replica" not in shape:
        shape["cpus_per_replica"] = model["threads"]  # Ray gives a replica as many OpenMP threads as CPUs
    if options:
        raise TypeError(f"build_app: unknown options {sorted(options)}")
    return model, front, shape


def build_app(model_source: str | Path, *, api_key: str | None = None, **options: Any) -> serve.Application:
    """The Ray Serve application of ``model_source`` (what ``vit serve MODEL`` takes), for ``serve.run``.

    Args:
        model_source: The checkpoint, run folder or export folder :class:`~vit.serve.model.ServeModel` reads.
        api_key: Asked of every request but ``/health`` (``Authorization: Bearer KEY``); ``None``: the replicas read
            ``VIT_SERVE_API_KEY`` when ``auth=True`` is given, else no key.
        **options: ``backend``, ``threads``, ``max_batch_size``, ``batch_timeout``, ``max_image_pixels`` (the model
            replicas); ``timeout``, ``max_body``, ``auth`` (the front); ``workers`` (replicas), ``autoscale``
            (``(min, max)`` replicas instead), ``max_queue``, ``cpus_per_replica`` (default: ``threads``, else 1),
            ``grace`` (the deployments).
    """
    auth = bool(options.pop("auth", False)) or api_key is not None
    model, front, shape = _split(dict(options))
    deployments = _deployments(**shape)
    ingress = deployments["Ingress"]
    if api_key is not None:
        ingress["ray_actor_options"] = {
            **ingress["ray_actor_options"],
            "runtime_env": {"env_vars": {API_KEY_ENV: api_key}},
        }
    classifier = Classifier.options(**deployments["Classifier"]).bind(str(model_source), **model)
    return Ingress.options(**ingress).bind(classifier, auth=auth, **front)


def app_builder(args: dict[str, Any]) -> serve.Application:
    """The ``import_path`` of :func:`deploy_config`'s application: ``args`` are its ``args`` (``model`` and
    :func:`build_app`'s keywords); the API key, if any, is read from ``VIT_SERVE_API_KEY`` on each node."""
    args = dict(args)
    if isinstance(args.get("autoscale"), list):
        args["autoscale"] = tuple(args["autoscale"])
    return build_app(args.pop("model"), **args)


def deploy_config(
    model_source: str | Path,
    *,
    host: str = "0.0.0.0",
    port: int = 8000,
    auth: bool = True,
    timeout: float = 30.0,
    **options: Any,
) -> dict[str, Any]:
    """The Serve config (``serve deploy serve.yaml``) of :func:`build_app`'s application on a cluster.

    Every node runs an HTTP proxy on ``host:port``; ``model_source`` must be readable at the same path on every node
    that runs a ``Classifier`` replica (a shared file system, or the same copy on each). Without ``auth=False`` the
    replicas ask for the key in ``VIT_SERVE_API_KEY`` of the nodes' environment.

    Args:
        model_source: As :func:`build_app`'s.
        host: Where each node's proxy listens.
        port: Its port.
        auth: Whether requests need the API key.
        timeout: Seconds to answer a request (504 after), also the proxies' request timeout.
        **options: :func:`build_app`'s other keywords.
    """
    model, front, shape = _split(dict(options))
    args = {"model": str(Path(model_source).resolve()), "auth": auth, "timeout": timeout, **model, **front, **shape}
    if "autoscale" in args and args["autoscale"] is not None:
        args["autoscale"] = list(args["autoscale"])
    deployments = _deployments(**shape)
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": host, "port": port, "request_timeout_s": timeout + 5},
        "applications": [
            {
                "name": "vit",
                "route_prefix": "/",
                "import_path": "vit.serve.ray_app:app_builder",
                "args": {k: v for k, v in args.items() if v is not None},
                "deployments": [{"name": name, **opts} for name, opts in deployments.items()],
            }
        ],
    }


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def run(
    model_source: str | Path, *, host: str = "127.0.0.1", port: int = 8000, print_config: bool = False, **options: Any
) -> int:
    """``vit serve --engine ray``: print :func:`deploy_config` as YAML (``print_config``), or serve ``model_source``
    with Ray Serve on ``host:port`` until interrupted, on a local Ray instance unless ``RAY_ADDRESS`` names a
    cluster. Returns the exit status."""
    if print_config:
        import yaml

        api_key = options.pop("api_key", None)
        config = deploy_config(model_source, host=host, port=port, auth=api_key is not None, **options)
        print(yaml.safe_dump(config, sort_keys=False), end="")
        return 0
    import signal

    import ray

    ray.init(include_dashboard=False, ignore_reinit_error=True)
    # SIGTERM as Ctrl-C: the replicas finish their calls (``grace`` seconds) and a local Ray instance is stopped
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        serve.start(http_options={"host": host, "port": port})
        print(f"vit serve (Ray Serve): {model_source} on http://{host}:{port}: POST /predict, GET /info /health",
              flush=True)  # fmt: skip
        serve.run(build_app(model_source, **options), name="vit", route_prefix="/", blocking=True)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
