"""A sweep file checked against the config it trains, before the first trial: every parameter's name is an option of
``vit fit`` with the sweep's command (its ``--config`` files), and every value the sweep can pass (each choice, a
range's ends) has the option's type. The check parses the trials' command lines with ``vit fit``'s own parser, so an
unknown key gets the did-you-mean of ``vit fit`` (:func:`vit.cli_errors.closest_key`) and a bad value the same
sentence; nothing is built, trained or written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vit.errors import UsageError

from .spec import Parameter, Sweep
from .trial import fit_arguments


class _Parsed(Exception):  # noqa: N818 - not an error: how the parse-only CLI hands back its parser and error
    def __init__(self, parser: Any, error: Exception | None) -> None:
        super().__init__()
        self.parser, self.error = parser, error


def candidates(parameter: Parameter) -> list[Any]:
    """The values of ``parameter`` to check: each choice of ``values``, the ``value`` of a constant, or the ends of a
    range (whole numbers for ``int_uniform``)."""
    if parameter.values:
        return list(parameter.values)
    ends = [parameter.low, parameter.high]
    return [int(v) for v in ends] if parameter.distribution == "int_uniform" else ends


def trial_command_lines(sweep: Sweep, fit_args: Sequence[str], budget_s: float | None) -> list[list[str]]:
    """``vit fit`` command lines that together pass every :func:`candidates` value of every parameter once, as the
    trials pass them (:func:`vit.sweep.trial.fit_arguments`)."""
    choices = {p.name: candidates(p) for p in sweep.parameters}
    count = max(len(values) for values in choices.values())
    lines = []
    for i in range(count):
        values = {name: values[min(i, len(values) - 1)] for name, values in choices.items()}
        lines.append(["fit", *fit_arguments(fit_args, values, Path("runs"), budget_s, None)])
    return lines


def check_against_config(sweep: Sweep, fit_args: Sequence[str], budget_s: float | None = None) -> None:
    """Parse every trial's command line (:func:`trial_command_lines`) with ``vit fit``'s parser.

    Args:
        sweep: The sweep file.
        fit_args: The arguments of every trial before its values (the sweep's command, those after ``--``).
        budget_s: The first rung's budget, which sets ``trainer.max_time`` and ``model.schedule``; ``None``: none.

    Raises:
        UsageError: For the first parameter the config has no option for (with the closest one), or the first value
            of the wrong type, naming the sweep file and the parameter.
    """
    from vit.configs import resolve_config_args

    lines = [resolve_config_args(line) for line in trial_command_lines(sweep, fit_args, budget_s)]
    parser = None
    for line in lines:
        message, parser = _parse(line, parser)
        if message:
            raise UsageError(_in_sweep_file(message, sweep, fit_args))


def _parse(line: list[str], parser: Any) -> tuple[str | None, Any]:
    """``(error message or None, the parser)``: ``line`` parsed by ``parser``, or by a new ``vit fit`` parser."""
    from jsonargparse import ArgumentError

    from vit.cli import VitCLI, cli_kwargs
    from vit.cli_errors import describe_parse_error, option_names
    from vit.data import ImageDataModule
    from vit.lit_module import ImageClassifier

    class ParseOnly(VitCLI):
        def parse_arguments(self, parser: Any, args: Any) -> None:
            try:
                super().parse_arguments(parser, args)
            except ArgumentError as err:
                raise _Parsed(parser, err) from None
            raise _Parsed(parser, None)

    kwargs = cli_kwargs(line)
    kwargs["parser_kwargs"] = {
        key: {**value, "exit_on_error": False} if isinstance(value, dict) else value
        for key, value in kwargs["parser_kwargs"].items()
    } | {"exit_on_error": False}
    error = None
    try:
        if parser is None:
            ParseOnly(ImageClassifier, ImageDataModule, args=line, **kwargs)
        parser.parse_args(line)
    except _Parsed as parsed:
        parser, error = parsed.parser, parsed.error
    except ArgumentError as err:
        error = err
    return (describe_parse_error(str(error), line, option_names(parser)) if error else None), parser


def _in_sweep_file(message: str, sweep: Sweep, fit_args: Sequence[str]) -> str:
    """A parse error of a trial's command line as an error of the sweep file: ``FILE: parameters.KEY: ...`` for a
    parameter's key, ``FILE: command: ...`` for one of the command's arguments."""
    message = message.replace(" on the command line", "").replace("; `vit fit --help` lists the options", "")
    found = re.match(r"(?:unknown option|bad value for) ([\w.]+)", message)
    key = found.group(1) if found else ""
    if key not in {p.name for p in sweep.parameters}:
        return f"{sweep.source}: command: {message}"
    message = message.replace(f"unknown option {key}", "not an option of vit fit", 1)
    message = message.replace(f"bad value for {key}", "bad value", 1)
    if message.startswith("not an option"):
        message += f"; `vit fit {' '.join(fit_args)} --help` lists the options".replace("  ", " ")
    return f"{sweep.source}: parameters.{key}: {message}"
