"""The ``vit`` command: one console script whose subcommands cover the whole pipeline.

    vit fit|validate|test|predict --config CONFIG [--section.key VALUE ...]   # LightningCLI (vit.cli)
    vit calibrate CHECKPOINT [--out FILE]                                    # vit.evaluation.calibrate
    vit explain CHECKPOINT IMAGES... [--methods attnlrp,...] [--html report.html]  # vit.explain.command
    vit compare runs/ [--plot val_acc.png]                                   # vit.compare
    vit sweep configs/sweeps/FILE.yaml [--budget 5m,15m] [--workers K]     # vit.sweep
    vit bench --suite model|attention|data|explorer|all [--json report.json] # vit.bench
    vit export --ckpt_path CKPT --out DIR [--onnx] [--ema]                   # vit.export
    vit data prepare --data.dataset NAME --data.data_dir SRC --out DEST      # vit.data.prepare

``fit``, ``validate``, ``test`` and ``predict`` are LightningCLI's; every other subcommand is a command module with
``build_parser(prog)`` and ``main(argv, prog)`` that imports torch only when its work needs it.
Every subcommand reports bad input the same way: one ``error: <message>`` line on stderr, no traceback, and an exit
status from :mod:`vit.errors` (``2`` for bad input). ``vit SUB --help`` shows a subcommand's options.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib import import_module

from vit.errors import EXIT_BAD_INPUT, EXIT_OK, UsageError, VitError, exit_with, fail, suggest


def _lightning(sub: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        from vit.cli import cli_main

        cli_main([sub, *argv])
        return EXIT_OK

    return run


def _command(module: str, prog: str) -> Callable[[list[str]], int]:
    """``vit SUB`` of a command module: ``module.main(argv, prog=prog)``, imported when the subcommand runs. Every such
    module exposes ``build_parser(prog)`` and ``main(argv, prog)`` and imports only the standard library and light
    modules of ``vit`` at its top, so that ``--help`` and argument errors answer before torch is imported."""

    def run(argv: list[str]) -> int:
        status = import_module(module).main(argv, prog=prog)
        return status if isinstance(status, int) else EXIT_OK  # vit.bench's main returns its report

    return run


DATA_ACTIONS = {
    "prepare": (
        "write a dataset as streaming shards (LitData) that training reads with --data.dataset streaming",
        "vit.data.prepare",
    ),
}
"""``vit data ACTION``: its one-line description and its command module."""


def _data(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: vit data ACTION [...]\n\nactions:")
        for name, (text, _) in DATA_ACTIONS.items():
            print(f"  {name:10s}{text}")
        print("\n`vit data ACTION --help` shows an action's options.")
        return EXIT_OK if argv else EXIT_BAD_INPUT
    if argv[0] not in DATA_ACTIONS:
        raise UsageError(
            f"vit data: unknown action {argv[0]!r}{suggest(argv[0], DATA_ACTIONS)}; actions: {', '.join(DATA_ACTIONS)}"
        )
    return _command(DATA_ACTIONS[argv[0]][1], f"vit data {argv[0]}")(argv[1:])


SUBCOMMANDS: dict[str, tuple[str, Callable[[list[str]], int]]] = {
    "fit": ("train a model (LightningCLI: --config, --model.*, --data.*, --trainer.*)", _lightning("fit")),
    "validate": ("evaluate a checkpoint on the validation split", _lightning("validate")),
    "test": ("evaluate a checkpoint on the test split (with optional test-time augmentation)", _lightning("test")),
    "predict": ("classify a folder of images with a checkpoint, writing predictions.csv", _lightning("predict")),
    "calibrate": (
        "fit a checkpoint's temperature on validation images and write a calibrated copy",
        _command("vit.evaluation.calibrate", "vit calibrate"),
    ),
    "explain": (
        "rollout and attribution maps, faithfulness and an HTML report for a checkpoint's predictions",
        _command("vit.explain.command", "vit explain"),
    ),
    "compare": (
        "compare W&B runs (offline folders or a project): a table and a plot",
        _command("vit.compare.command", "vit compare"),
    ),
    "sweep": (
        "run a W&B sweep file with Optuna: equal time budgets, successive halving, resumable studies",
        _command("vit.sweep.command", "vit sweep"),
    ),
    "bench": ("benchmarks of the model, attention and data pipelines", _command("vit.bench.cli", "vit bench")),
    "export": (
        "write a checkpoint as a timm / Hugging Face Hub folder (safetensors, config.json, ONNX)",
        _command("vit.export", "vit export"),
    ),
    "data": ("prepare datasets: `vit data prepare` writes streaming shards", _data),
    "serve": ("serve a model over HTTP: batching, explanations, metrics", _command("vit.serve.command", "vit serve")),
}
"""``vit SUB``: its one-line description and the function that runs it on the remaining arguments."""


def usage() -> str:
    """The text of ``vit --help``: every subcommand with one line."""
    width = max(map(len, SUBCOMMANDS)) + 2
    lines = [
        "usage: vit SUBCOMMAND [...]",
        "",
        "Train, evaluate, explain and export Vision Transformers.",
        "",
        "subcommands:",
        *(f"  {name:{width}s}{text}" for name, (text, _) in SUBCOMMANDS.items()),
        "",
        "`vit SUBCOMMAND --help` shows a subcommand's options.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``vit`` on ``argv`` (default ``sys.argv[1:]``) and return its exit status.

    Raises:
        SystemExit: with status 2 after one ``error:`` line for bad input, and with its own status after a
            :class:`~vit.errors.VitError` raised by a subcommand (:data:`vit.errors.EXIT_STATUSES`).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return EXIT_OK if argv else EXIT_BAD_INPUT
    if argv[0] in ("-V", "--version"):
        from vit import __version__

        print(f"vit {__version__}")
        return EXIT_OK
    sub, rest = argv[0], argv[1:]
    if sub not in SUBCOMMANDS:
        fail(f"unknown subcommand {sub!r}{suggest(sub, SUBCOMMANDS)}; `vit --help` lists them")
    try:
        return SUBCOMMANDS[sub][1](rest)
    except VitError as err:
        exit_with(err)


def console(prefix: Sequence[str] = ()) -> None:
    """The ``vit`` console script, ``python -m vit`` and the thin aliases (``scripts/*.py``, ``python -m vit.bench``):
    exits with the status of :func:`main` on ``prefix`` + ``sys.argv[1:]``."""
    sys.exit(main([*prefix, *sys.argv[1:]]))
