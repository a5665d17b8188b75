"""The worker side of ``vit serve``: :class:`VitAPI`, the LitServe API that runs a :class:`~vit.serve.model.ServeModel`.

The HTTP side (:mod:`vit.serve.server`) parses each request into a plain payload and LitServe carries it to a worker
process, batching the payloads of concurrent requests (``max_batch_size``, ``batch_timeout``; with ``batch_timeout``
0, :class:`GreedyBatchedLoop`: what is queued when the model is free, without waiting). A payload is one of

- ``{"kind": "predict", "images": [bytes, ...], "top_k": int, "explain": str | None, "explorer": bool}``;
- ``{"kind": "tensor", "inputs": float32 (N, C, H, W)}`` or ``{"kind": "tensor", "images": [bytes, ...]}`` (V2);
- ``{"kind": "info"}``.

The images of every plain request of a batch, and the V2 tensors, go through the model in one forward pass; a
request that asks for explanations is explained on its own. Nothing here raises for one request: each answer carries
its error (``{"error", "status"}``), for the request or in the slot of the image, so that a bad image fails only
itself and never the batch. Each answer that went through the model also carries ``model_ms``, the milliseconds of the
forward pass it shared (with ``explain``: of its prediction and explanation), and ``worker_ms``, the worker's
milliseconds for the whole batch (decoding, the forward pass, the top classes), which the HTTP side sends in the
``Server-Timing`` header. torch is imported in the worker only (:meth:`VitAPI.setup`).
"""

from __future__ import annotations

import signal
import time
from typing import Any

import litserve as ls
from litserve.loops.base import collate_requests
from litserve.loops.simple_loops import BatchedLoop

from .errors import RequestError

IDLE_WAIT_S = 1.0
"""Seconds an idle worker blocks for a request before it looks again (LitServe's own loops block as long)."""


class GreedyBatchedLoop(BatchedLoop):
    """LitServe's batched loop, except at ``batch_timeout`` 0: there LitServe polls an empty queue without pause (a
    core spent while idle); this loop blocks until a request comes, then adds those already queued, up to
    ``max_batch_size``, without waiting for more. So a lone request never waits for a batch to fill, and requests that
    arrive during a forward pass make the next batch. A positive ``batch_timeout`` is LitServe's loop unchanged."""

    def get_batch_requests(self, lit_api: ls.LitAPI, request_queue: Any, transport: Any) -> tuple[list, list]:
        if lit_api.batch_timeout > 0:
            return super().get_batch_requests(lit_api, request_queue, transport)
        return collate_requests(self, lit_api, _FirstBlocks(request_queue), transport)


class _FirstBlocks:
    """A view of the request queue whose first ``get_nowait`` blocks (up to :data:`IDLE_WAIT_S`, then ``Empty``: an
    empty batch, and the loop asks again), so that LitServe's own collation (its stop signal, its timeouts) takes a
    batch of what is queued once one request is there."""

    def __init__(self, queue: Any) -> None:
        self.queue, self.first = queue, True

    def get_nowait(self) -> Any:
        if self.first:
            self.first = False
            return self.queue.get(timeout=IDLE_WAIT_S)
        return self.queue.get_nowait()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queue, name)  # anything else a later LitServe asks of its queue


class VitAPI(ls.LitAPI):
    """The LitServe API of one model.

    Args:
        source: The checkpoint or export folder.
        backend: ``"torch"`` or ``"onnx"``.
        threads: Intra-op threads per worker.
        max_image_pixels: The pixel limit of the images.
        model_class: The predictor class (:class:`~vit.serve.model.ServeModel` or a subclass); ``None``: that one.
        max_batch_size: Requests batched into one call at most.
        batch_timeout: Seconds a batch waits to fill; 0: none (:class:`GreedyBatchedLoop`).
    """

    def __init__(
        self,
        source: str,
        backend: str = "torch",
        threads: int | None = None,
        max_image_pixels: int | None = None,
        model_class: type | None = None,
        max_batch_size: int = 8,
        batch_timeout: float = 0.0,
    ) -> None:
        loop = GreedyBatchedLoop() if max_batch_size > 1 else "auto"
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path="/predict", loop=loop)
        self.source, self.backend, self.threads = source, backend, threads
        self.max_image_pixels = max_image_pixels
        self.model_class = model_class
        self.model: Any = None

    def setup(self, device: str) -> None:
        """Load the model in the worker. Ctrl-C reaches every process of the terminal: the worker ignores it and
        finishes its requests while the server drains, then the server stops it."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        from .model import ServeModel

        cls = self.model_class or ServeModel
        device = device if str(device).startswith(("cuda", "mps")) and self.backend == "torch" else "cpu"
        self.model = cls(self.source, self.backend, self.threads, self.max_image_pixels, device=device)

    def decode_request(self, request: Any, **kwargs: Any) -> Any:
        return request  # decoded per image in predict: a bad image must fail only itself

    def predict(self, x: Any, **kwargs: Any) -> Any:
        """The answers of one payload (``max_batch_size`` 1) or of a batch of them, in order."""
        batch = x if isinstance(x, list) else [x]
        tick = time.perf_counter()
        answers = self.answer(batch)
        worker_ms = 1000 * (time.perf_counter() - tick)
        for answer in answers:
            if "model_ms" in answer:
                answer["worker_ms"] = worker_ms
        return answers if isinstance(x, list) else answers[0]

    def encode_response(self, output: Any, **kwargs: Any) -> Any:
        return output

    # -------------------------------------------------------------------------------------------- answering
    def answer(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One answer per payload of ``batch``: plain requests and tensors share one forward pass."""
        answers: list[dict[str, Any]] = [{} for _ in batch]
        plain: list[tuple[int, int | None, Any]] = []  # (payload, image slot or None for a tensor, input)
        for i, payload in enumerate(batch):
            try:
                kind = payload.get("kind")
                if kind == "info":
                    answers[i] = self.model.info()
                elif kind == "tensor":
                    plain.append((i, None, self.tensor_input(payload)))
                elif payload.get("explain"):
                    answers[i] = self.explained(payload)
                else:
                    answers[i] = {"results": [None] * len(payload["images"])}
                    plain += [(i, slot, image) for slot, image in enumerate(self.decoded(payload, answers[i]))]
            except RequestError as err:
                answers[i] = err.payload()
        self.forward(batch, answers, [item for item in plain if item[2] is not None])
        return answers

    def decoded(self, payload: dict[str, Any], answer: dict[str, Any]) -> list[Any]:
        """The decoded images of a request, ``None`` in the slots of those that failed (their error in ``answer``)."""
        images = []
        for slot, data in enumerate(payload["images"]):
            try:
                images.append(self.model.decode(data))
            except RequestError as err:
                answer["results"][slot] = err.payload()
                images.append(None)
        return images

    def tensor_input(self, payload: dict[str, Any]) -> Any:
        """A V2 request's normalised ``(N, C, H, W)`` inputs: its FP32 tensor, or its encoded images preprocessed."""
        import numpy as np

        from ..normalize import normalize

        if payload.get("inputs") is not None:
            inputs = np.asarray(payload["inputs"], dtype=np.float32)
            self.model.check_inputs(inputs)
            return inputs
        if not payload.get("images"):
            raise RequestError(400, "the BYTES input holds no image")
        images = [self.model.decode(data) for data in payload["images"]]  # one bad image fails the tensor
        cfg = self.model.predictor.cfg
        return normalize(self.model.pixels(images), cfg["mean"], cfg["std"]).numpy()

    def forward(self, batch: list[dict], answers: list[dict], items: list[tuple[int, int | None, Any]]) -> None:
        """Run the images and tensors of ``items`` through the model at once and fill in their answers."""
        if not items:
            return
        import numpy as np

        from ..normalize import normalize
        from .metrics import observe_batch
        from .model import softmax

        cfg = self.model.predictor.cfg
        images = [image for _, slot, image in items if slot is not None]
        parts = [normalize(self.model.pixels(images), cfg["mean"], cfg["std"]).numpy()] if images else []
        parts += [inputs for _, slot, inputs in items if slot is None]
        tick = time.perf_counter()
        logits = self.model.logits(np.concatenate(parts))
        model_ms = 1000 * (time.perf_counter() - tick)
        observe_batch(len(logits))
        row = 0
        for i, slot, _ in [item for item in items if item[1] is not None]:
            probs = softmax(logits[row : row + 1])
            answers[i]["results"][slot] = {"predictions": self.model.top(probs, batch[i].get("top_k", 5))[0]}
            row += 1
        for i, _, inputs in [item for item in items if item[1] is None]:
            answers[i] = {"logits": logits[row : row + len(inputs)]}
            row += len(inputs)
        for i in {item[0] for item in items}:
            answers[i]["model_ms"] = model_ms

    def explained(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The answer of a request with ``explain``: each good image predicted and explained, the others' errors."""
        from .metrics import observe_batch

        answer: dict[str, Any] = {"results": [None] * len(payload["images"])}
        images = self.decoded(payload, answer)
        good = [slot for slot, image in enumerate(images) if image is not None]
        if good:
            tick = time.perf_counter()
            results = self.model.predict([images[s] for s in good], payload.get("top_k", 5), payload["explain"],
                                         bool(payload.get("explorer")))  # fmt: skip
            answer["model_ms"] = 1000 * (time.perf_counter() - tick)
            observe_batch(len(good))
            for slot, result in zip(good, results, strict=True):
                answer["results"][slot] = result
        return answer


__all__ = ["GreedyBatchedLoop", "VitAPI"]
