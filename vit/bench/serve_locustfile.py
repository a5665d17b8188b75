"""The locustfile of ``vit bench --suite serve``: users that POST one image to ``/predict``; a record of every answer.

Run by :func:`vit.bench.serve_suite.drive` as ``locust -f`` this file ``--headless`` in its own process (locust
patches the standard library with gevent at import, which must not happen in a process that runs torch). Settings
come from the environment:

- ``VIT_LOCUST_IMAGE``: the image file each request sends (its bytes, ``Content-Type`` from its suffix).
- ``VIT_LOCUST_RATE``: requests per second of each user; ``0``: as fast as answers come. A paced user sends at a
  random phase of its period, then once a period (:meth:`Client.wait_time`), so that the users' requests spread over
  the period instead of arriving together in bursts of as many as there are users (locust's ``constant_throughput``
  counts its first period from the user's creation, which puts every user back in step).
- ``VIT_LOCUST_TIMEOUT``: seconds a request may take before the client gives up (counted as timed out).
- ``VIT_LOCUST_BAD_EVERY``: every n-th request of a user sends bytes that are no image (``0``: none).
- ``VIT_LOCUST_SECONDS``: how long the users send; then each waits for the answers still out and locust quits
  once none is (``--run-time`` is only the hard limit, and stops users in the middle of a request).
- ``VIT_LOCUST_MAX_REQUESTS``: the users stop sending after this many requests (``0``: no limit).
- ``VIT_LOCUST_OUT``: where the record is written as JSON when locust quits: requests sent, of them without an
  image (``bad``), answers by status (``0``: no answer: refused, reset or timed out), errors by kind, latencies of
  the 200 and of the 503 answers in milliseconds, the first request's and the last answer's time.
"""

import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import gevent
from locust import FastHttpUser, events, task

IMAGE = Path(os.environ.get("VIT_LOCUST_IMAGE", "image.png"))
RATE = float(os.environ.get("VIT_LOCUST_RATE", "0"))
TIMEOUT = float(os.environ.get("VIT_LOCUST_TIMEOUT", "60"))
BAD_EVERY = int(os.environ.get("VIT_LOCUST_BAD_EVERY", "0"))
SECONDS = float(os.environ.get("VIT_LOCUST_SECONDS", "10"))
MAX_REQUESTS = int(os.environ.get("VIT_LOCUST_MAX_REQUESTS", "0"))
OUT = os.environ.get("VIT_LOCUST_OUT")
TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}

state = {"deadline": float("inf"), "in_flight": 0, "quitting": False}
record = {
    "sent": 0,
    "bad": 0,
    "status": Counter(),
    "errors": Counter(),
    "ok_ms": [],
    "busy_ms": [],
    "first": None,
    "last": None,
}


class Client(FastHttpUser):
    """One client: POST the image, wait, again."""

    network_timeout = TIMEOUT
    connection_timeout = TIMEOUT

    def on_start(self) -> None:
        self.image = IMAGE.read_bytes()
        self.headers = {"Content-Type": TYPES.get(IMAGE.suffix.lower(), "application/octet-stream")}
        self.count = 0
        self.next_at = time.monotonic() + (random.uniform(0, 1 / RATE) if RATE > 0 else 0.0)
        gevent.sleep(self.next_at - time.monotonic())

    def wait_time(self) -> float:
        """Seconds until this user's next request: one period after the last was due (none when the answer took
        longer), or none at all without a rate."""
        if RATE <= 0:
            return 0.0
        self.next_at = max(self.next_at + 1 / RATE, time.monotonic())
        return self.next_at - time.monotonic()

    @task
    def predict(self) -> None:
        if time.time() > state["deadline"] or (MAX_REQUESTS and record["sent"] >= MAX_REQUESTS):
            if state["in_flight"] == 0 and not state["quitting"]:
                state["quitting"] = True  # quit from a greenlet of its own: quit() stops this user's greenlet
                gevent.spawn(self.environment.runner.quit)
            gevent.sleep(0.05)
            return
        self.count += 1
        bad = BAD_EVERY and self.count % BAD_EVERY == 0
        record["sent"] += 1
        record["bad"] += int(bool(bad))
        state["in_flight"] += 1
        body = b"this is not an image" if bad else self.image
        try:
            with self.client.post("/predict", data=body, headers=self.headers, catch_response=True) as response:
                if response.status_code in (200, 503) or (bad and response.status_code == 400):
                    response.success()  # what the server should answer: locust's table counts the rest as failures
        finally:
            state["in_flight"] -= 1


@events.test_start.add_listener
def on_test_start(**_) -> None:
    state["deadline"] = time.time() + SECONDS


@events.request.add_listener
def on_request(response_time, response, exception, start_time, **_) -> None:
    status = getattr(response, "status_code", 0) or 0
    record["status"][status] += 1
    if status == 0:
        record["errors"][type(exception).__name__ if exception else "no answer"] += 1
    elif status == 200:
        record["ok_ms"].append(response_time)
    elif status == 503:
        record["busy_ms"].append(response_time)
    now = time.time()
    record["first"] = start_time if record["first"] is None else min(record["first"], start_time)
    record["last"] = now if record["last"] is None else max(record["last"], now)


@events.quitting.add_listener
def on_quitting(**_) -> None:
    if OUT:
        out = {**record, "status": {str(k): v for k, v in record["status"].items()}, "errors": dict(record["errors"])}
        Path(OUT).write_text(json.dumps(out))
