"""A ``vit serve`` whose model waits for a file before each forward pass, for the tests of a full queue and of the
drain on SIGTERM (tests/test_serve.py): ``python tests/serve_gate.py CHECKPOINT PORT``; the gate is
``CHECKPOINT.gate``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from vit.serve.model import ServeModel


class GatedModel(ServeModel):
    """:class:`ServeModel` whose forward pass waits until the file named by ``<checkpoint>.gate`` exists."""

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
    sys.exit(run(checkpoint, port=port, max_queue=1, grace=60, max_batch_size=1, workers=1, model_class=Gated))
