"""LitServe's server with its answers on pipes: :class:`PipeQueueServer`.

LitServe carries each request from the HTTP process to a worker, and the worker's answers back (a ``START`` when it
takes the request, then the answer), through queues of a ``multiprocessing.Manager``: a process of its own, so that
every ``put`` and every ``get`` is a round trip to it. Here the answers travel on ``multiprocessing`` queues instead
(a pipe each, read by the HTTP process alone), which LitServe's transport uses unchanged. A worker holds the lock
of such a pipe only while it writes one answer into it.

The request queue stays the manager's. Its readers are the workers, and a ``multiprocessing`` queue's reader holds
the queue's lock while it waits: a worker killed while idle would keep it, and the worker LitServe starts in its
place would never get a request.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import litserve as ls
from litserve.transport.process_transport import MPQueueTransport


class PipeQueueServer(ls.LitServer):
    """``litserve.LitServer`` whose response queues are pipes rather than a manager's proxies."""

    def _init_manager(self, num_api_servers: int) -> Any:
        manager = super()._init_manager(num_api_servers)
        context = mp.get_context("spawn")  # LitServe spawns its workers (and forks its HTTP processes)
        self._transport = MPQueueTransport(manager, [context.Queue() for _ in range(num_api_servers)])
        return manager


__all__ = ["PipeQueueServer"]
