"""A ``vit serve`` whose model waits for a file before each forward pass, for the tests of a full queue, the drain on
SIGTERM, ``--timeout`` and a worker that dies (tests/test_serve_faults.py): ``python tests/serve_gate.py CHECKPOINT PORT
[NAME=VALUE ...]`` (options of :func:`vit.serve.server.run`, numbers); the gate is ``CHECKPOINT.gate``, and each
worker writes its process id to ``CHECKPOINT.pid`` once its model is loaded."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from vit.serve.model import ServeModel


class GatedModel(ServeModel):
    """:class:`ServeModel` whose forward pass waits until the file named by ``<checkpoint>.gate`` exists."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        Path(str(self.source) + ".pid").write_text(str(os.getpid()))

    def logits(self, inputs):
        gate = Path(str(self.source) + ".gate")
        deadline = time.monotonic() + 120
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return super().logits(inputs)


if __name__ == "__main__":
    from serve_gate import GatedModel as Gated  # by its module name, so that the spawned workers unpickle it

    from vit.serve.server import run

    checkpoint, port = sys.argv[1], int(sys.argv[2])
    options = dict(max_queue=1, grace=60, max_batch_size=1, workers=1)
    options.update({k: float(v) for k, v in (a.split("=", 1) for a in sys.argv[3:])})
    options = {k: int(v) if k in ("max_queue", "workers", "max_batch_size") else v for k, v in options.items()}
    sys.exit(run(checkpoint, port=port, model_class=Gated, **options))
