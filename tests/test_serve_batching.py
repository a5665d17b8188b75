"""How ``vit serve``'s worker takes its batches from LitServe's request queue: at ``batch_timeout`` 0 it blocks until
a request comes (LitServe's own loop polls an empty queue without pause), then takes what is queued, up to
``max_batch_size``, without waiting for more; a positive ``batch_timeout`` is LitServe's loop unchanged."""

from __future__ import annotations

import queue
import threading
import time

import pytest

pytest.importorskip("litserve")
from litserve.loops.base import _SENTINEL_VALUE, _StopLoopError  # noqa: E402
from litserve.loops.simple_loops import BatchedLoop, SingleLoop  # noqa: E402
from litserve.utils import LitAPIStatus  # noqa: E402

from vit.serve import api as serve_api  # noqa: E402
from vit.serve.api import GreedyBatchedLoop, VitAPI  # noqa: E402


def batched_api(max_batch_size: int = 4, batch_timeout: float = 0.0) -> VitAPI:
    api = VitAPI("unused.ckpt", max_batch_size=max_batch_size, batch_timeout=batch_timeout)
    api.request_timeout = 30.0  # what LitServer sets from its ``timeout``
    return api


class RecordingQueue(queue.Queue):
    """A request queue that records how each item was asked for: ``"wait"`` (a blocking get) or ``"now"``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def get(self, block: bool = True, timeout: float | None = None):
        self.calls.append("wait" if block else "now")
        return super().get(block, timeout)  # get_nowait comes here too, with block=False


class Transport:
    """LitServe's transport, as far as the loop uses it: the messages sent to the HTTP side."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def send(self, item: tuple, consumer_id: int) -> None:
        self.sent.append(item)


def request(n: int) -> tuple:
    return (0, f"uid-{n}", time.monotonic(), {"n": n})  # (response queue, uid, arrival, payload), as LitServe queues


def payloads(batch: list) -> list[int]:
    return [x["n"] for _, _, x in batch]


def test_the_loop_is_ours_for_batches_and_litserves_for_single_requests():
    assert isinstance(batched_api().loop, GreedyBatchedLoop)
    assert isinstance(batched_api(max_batch_size=1).loop, SingleLoop)


def test_an_idle_worker_waits_for_the_first_request_where_litserve_returns_at_once(monkeypatch):
    monkeypatch.setattr(serve_api, "IDLE_WAIT_S", 30.0)  # returns when the request comes, long before
    api, requests = batched_api(), RecordingQueue()
    assert BatchedLoop().get_batch_requests(api, requests, None) == ([], [])  # LitServe's: the caller polls again
    assert requests.calls == ["now"]  # ... and again, a core's worth while the server is idle
    requests.calls.clear()
    threading.Timer(0.3, requests.put, [request(1)]).start()
    batch, timed_out = api.loop.get_batch_requests(api, requests, None)
    assert payloads(batch) == [1] and timed_out == []
    assert requests.calls == ["wait", "now"]  # blocked for the request, then found nothing more queued


def test_what_is_queued_is_taken_up_to_the_batch_size_without_waiting_for_more(monkeypatch):
    monkeypatch.setattr(serve_api, "IDLE_WAIT_S", 0.05)
    api, requests = batched_api(max_batch_size=4), RecordingQueue()
    for n in range(6):
        requests.put(request(n))
    assert payloads(api.loop.get_batch_requests(api, requests, None)[0]) == [0, 1, 2, 3]
    assert requests.calls == ["wait", "now", "now", "now"]  # one blocking get a batch: no wait once one is there
    assert payloads(api.loop.get_batch_requests(api, requests, None)[0]) == [4, 5]
    assert api.loop.get_batch_requests(api, requests, None) == ([], [])  # idle: empty after IDLE_WAIT_S, asked again


def test_each_request_taken_is_announced_to_the_http_side_as_litserve_does():
    """With workers restarted on failure, LitServe tells the HTTP side which worker took each request (START)."""
    api, requests, transport = batched_api(), queue.Queue(), Transport()
    api.loop._restart_workers = True  # what LitServer sets with restart_workers=True
    for n in range(3):
        requests.put(request(n))
    api.loop.get_batch_requests(api, requests, transport)
    started = [uid for uid, (_, status, *_) in transport.sent if status == LitAPIStatus.START]
    assert started == ["uid-0", "uid-1", "uid-2"]


def test_the_stop_signal_and_a_request_queued_too_long_are_litserves():
    api, requests = batched_api(), queue.Queue()
    requests.put((0, "old", time.monotonic() - 60, {"n": 0}))
    requests.put(request(1))
    batch, timed_out = api.loop.get_batch_requests(api, requests, None)
    assert payloads(batch) == [1] and timed_out == [(0, "old")]
    requests.put(_SENTINEL_VALUE)
    with pytest.raises(_StopLoopError):
        api.loop.get_batch_requests(api, requests, None)


def test_a_positive_batch_timeout_waits_for_the_batch_to_fill_as_litserve_does():
    api, requests = batched_api(max_batch_size=2, batch_timeout=5.0), queue.Queue()
    requests.put(request(0))
    threading.Timer(0.3, requests.put, [request(1)]).start()  # within the window: fills the batch
    assert payloads(api.loop.get_batch_requests(api, requests, None)[0]) == [0, 1]
