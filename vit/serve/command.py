"""``vit serve MODEL``: serve a trained model over HTTP (LitServe), with batching, explanations and metrics.

    vit serve last --config quickstart                  # the newest quickstart run, on http://127.0.0.1:8000
    vit serve runs/quickstart/<run>/checkpoints/last.ckpt --workers 2 --max_batch_size 16
    vit serve my_vit/ --backend onnx                    # a `vit export --onnx` folder on ONNX Runtime
    vit serve my_vit/ --host 0.0.0.0 --api_key KEY      # other machines: a key (or --insecure)

MODEL is a ``.ckpt`` of ``vit fit``, a run folder, ``last`` / ``best`` (of the newest run of ``--config``), or a
folder written by ``vit export``. ``POST /predict`` takes image bytes, multipart files or JSON base64 and answers the
top classes (``?top_k=3``), with an explanation map on request (``?explain=default``); ``GET /info``, ``/metrics``,
``/health``, ``/docs`` and the Open Inference Protocol (``/v2/models/NAME/infer``) are beside it. SIGTERM or Ctrl-C
finishes the requests in flight (``--grace`` seconds at most) and exits 0. The options are checked before torch loads.
"""

from __future__ import annotations

import argparse
import importlib.util
import socket
from collections.abc import Sequence
from pathlib import Path

from ..checkpoints.naming import find_checkpoint
from ..errors import ArgumentParser, UsageError
from ..text import plural

EXPORT_CONFIG = "config.json"
"""The file that marks a ``vit export`` folder (:data:`vit.checkpoints.loading.CONFIG_FILE`, which imports torch)."""
ENGINES = ("litserve", "ray")
BACKENDS = ("torch", "onnx")


def build_parser(prog: str = "vit serve") -> argparse.ArgumentParser:
    """The options of ``vit serve``."""
    parser = ArgumentParser(prog=prog, doc=__doc__)
    parser.add_argument("model", metavar="MODEL", help="a .ckpt, a run folder, last / best, or a vit export folder")
    parser.add_argument("--config", default=None, help="the config whose newest run MODEL last / best means")
    parser.add_argument("--runs_dir", default="runs", help="the folder of all runs (default: runs)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind: 127.0.0.1 (default), 0.0.0.0 or ::")
    parser.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    parser.add_argument("--backend", choices=BACKENDS, default="torch", help="torch, or onnx: the model.onnx of a "
                        "`vit export --onnx` folder on ONNX Runtime (default: torch)")  # fmt: skip
    parser.add_argument("--max_batch_size", type=int, default=8, help="requests batched into one pass (default: 8)")
    parser.add_argument("--batch_timeout", type=float, default=0.0, help="seconds a batch waits to fill (default "
                        "0: none; a batch is what queued while the model was busy)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=1, help="model worker processes per device (default: 1)")
    parser.add_argument("--threads", type=int, default=None, help="threads per worker (default: the cores "
                        "not busy with other processes, divided among the workers)")  # fmt: skip
    parser.add_argument("--max_queue", type=int, default=64, help="inference requests in flight at most; the next "
                        "gets 503 with Retry-After at once (default: 64)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds before a request gets 504 (default: 30)")
    parser.add_argument("--max_body", type=int, default=64 * 1024 * 1024, help="largest request body in bytes, 413 "
                        "above (default: 64 MiB)")  # fmt: skip
    parser.add_argument("--max_image_pixels", type=int, default=None, help="largest image (width x height), 413 "
                        "above, read from the header before decoding (default: 50 megapixels)")  # fmt: skip
    parser.add_argument("--grace", type=float, default=10.0, help="seconds SIGTERM / Ctrl-C waits for requests in "
                        "flight before exiting (default: 10)")  # fmt: skip
    parser.add_argument("--api_key", default=None, help="require `Authorization: Bearer KEY` (default: the "
                        "environment variable VIT_SERVE_API_KEY); needed to bind a non-loopback host")  # fmt: skip
    parser.add_argument("--insecure", action="store_true", help="bind a non-loopback host without an API key")
    parser.add_argument("--engine", choices=ENGINES, default="litserve", help="litserve (one machine, default) or "
                        "ray (Ray Serve, past one machine)")  # fmt: skip
    parser.add_argument("--print_config", action="store_true", help="with --engine ray: print the Ray Serve config")
    parser.add_argument("--log_level", default="warning", choices=("debug", "info", "warning", "error"),
                        help="the server's log level (default: warning; info logs every request)")  # fmt: skip
    return parser


def resolve_model(spec: str, config: str | None = None, runs_dir: str | Path = "runs") -> Path:
    """The file or folder MODEL names: a ``vit export`` folder as it is, else :func:`find_checkpoint`'s checkpoint.

    Raises:
        VitError: If MODEL names nothing to serve (one sentence saying what to pass).
    """
    path = Path(spec)
    if path.is_dir() and (path / EXPORT_CONFIG).is_file():
        return path
    return Path(find_checkpoint(spec, config=config, runs_dir=runs_dir, option="MODEL"))


def check_options(args: argparse.Namespace, source: Path) -> None:
    """Refuse options that cannot work, before anything loads.

    Raises:
        UsageError: Naming the option and the fix.
    """
    from .errors import check_onnx_backend

    for name in ("max_batch_size", "workers", "max_queue", "port"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be at least 1, got {getattr(args, name)}")
    for name in ("max_image_pixels", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name} must be at least 1, got {getattr(args, name)}")
    for name in ("batch_timeout", "grace"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name} must not be negative, got {getattr(args, name)}")
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be above 0 seconds, got {args.timeout:g}: every request would get 504")
    if args.engine == "litserve" and importlib.util.find_spec("litserve") is None:
        raise UsageError("vit serve needs LitServe and prometheus-client: pip install 'vit[serve]'")
    if args.engine == "litserve" and args.host not in ("127.0.0.1", "localhost", "0.0.0.0", "::"):
        raise UsageError(f"--host {args.host}: LitServe binds 127.0.0.1, 0.0.0.0 (every IPv4 interface) or ::")
    if args.backend == "onnx":
        check_onnx_backend(source)
    check_port(args.host, args.port)


def check_port(host: str, port: int) -> None:
    """Refuse a port another process listens on, before the model loads.

    Raises:
        UsageError: Naming the port and the fix.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no obstacle
        try:
            probe.bind(("127.0.0.1" if host == "localhost" else host, port))
        except OSError as err:
            raise UsageError(
                f"--port {port} on {host} cannot be bound ({err.strerror}): another server holds it? "
                "Pass another --port"
            ) from None


def main(argv: Sequence[str] | None = None, prog: str = "vit serve") -> int:
    """Run ``vit serve`` on ``argv``; returns 0 after a drained shutdown.

    Raises:
        VitError: For bad input (the ``vit`` entry point prints one ``error:`` line and exits 2).
    """
    from .gate import check_bind

    args = build_parser(prog).parse_args(argv)
    source = resolve_model(args.model, args.config, args.runs_dir)
    api_key = check_bind(args.host, args.api_key, args.insecure)
    check_options(args, source)
    options = dict(backend=args.backend, max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout,
                   workers=args.workers, threads=args.threads, max_queue=args.max_queue, timeout=args.timeout,
                   max_body=args.max_body or None, max_image_pixels=args.max_image_pixels, api_key=api_key)  # fmt: skip
    if args.engine == "ray":
        return run_ray(source, args, options)
    from .model import model_name
    from .server import run, worker_threads

    options["threads"] = threads = args.threads or worker_threads(args.workers)
    url = f"http://{'[::1]' if args.host == '::' else args.host}:{args.port}"
    name = model_name(source)
    print(
        f"vit serve: {source} as model {name!r} on {url} ({args.backend}, {plural(args.workers, 'worker')} of "
        f"{plural(threads, 'thread')}, batches of up to {args.max_batch_size}): POST /predict, GET /info /metrics "
        f"/docs, /v2/models/{name}/infer; GET /health answers 200 once the model is loaded",
        flush=True,
    )
    try:
        return run(source, host=args.host, port=args.port, grace=args.grace, log_level=args.log_level, **options)
    except RuntimeError as err:  # LitServe: a worker failed to load the model (its traceback is above)
        raise UsageError(f"{source}: the model did not load in the worker ({err})") from None


def run_ray(source: Path, args: argparse.Namespace, options: dict) -> int:
    """``--engine ray``: :mod:`vit.serve.ray_app` serves the same model on Ray Serve.

    Raises:
        UsageError: If Ray Serve is not installed.
    """
    try:
        from . import ray_app
    except ImportError as err:
        if (err.name or "").split(".")[0] == "ray":
            raise UsageError("--engine ray needs Ray Serve: pip install 'ray[serve]'") from None
        raise UsageError(f"--engine ray is not available in this install ({err})") from None
    return ray_app.run(source, host=args.host, port=args.port, print_config=args.print_config, grace=args.grace,
                       **options)  # fmt: skip


if __name__ == "__main__":
    from ..main import console

    console(["serve"])
