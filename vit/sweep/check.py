"""A sweep file checked against the config it trains, before the first trial: every parameter's name is an option of
``vit fit`` with the sweep's command (its ``--config`` files), and every value the sweep can pass (each choice, a
range's ends) has the option's type. The check parses the trials' command lines with ``vit fit``'s own parser, so an
unknown key gets the did-you-mean of ``vit fit`` (:func:`vit.cli_errors.closest_key`) and a bad value the same
sentence; nothing is built, trained or written. Three things the parser cannot see are checked too: a continuous
distribution on an option that takes whole numbers (its ends may be whole, its draws are not), a ``metric.name`` that
a fit does not log (:data:`FIT_METRICS`), and a model name ``vit fit`` would not find (:func:`vit.models.model_config`).

The same parse gives ``vit sweep --baseline`` its first trial (:func:`baseline_params`): each searched parameter at the
value the command itself trains with.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vit.errors import UsageError, suggest

from .space import encode, search_space
from .spec import Parameter, Sweep
from .trial import fit_arguments

FIT_METRICS = (
    "train/loss_step", "train/loss_epoch", "train/acc", "train/acc_top5", "train/lr", "train/img_per_sec",
    "train/budget_used", "val/loss", "val/acc", "val/acc_top5",
)  # fmt: skip
"""The scalars a ``vit fit`` logs (:class:`vit.lit_module.ImageClassifier`'s ``log`` calls, ``accuracy_metrics``, the
throughput and time-budget callbacks), which a sweep's ``metric.name`` can rank by; ``{stage}/acc_top5`` from five
classes, ``train/budget_used`` with ``--budget``."""
METRIC_PREFIXES = ("attn/", "explain/")
"""The prefixes of the explanation callback's scalars (per block, per method: too many to list)."""
MODEL_KEY = "model.model"
"""The option that names the model preset."""
FRACTIONAL = ("uniform", "log_uniform", "log_uniform_values")
"""Distributions whose draws are fractions (``q_uniform`` and ``q_log_uniform_values`` too, unless every number is
whole)."""


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


def fraction(parameter: Parameter) -> float | None:
    """A value inside the range of ``parameter`` as it draws one (``38.73`` of ``uniform 8..64``), or ``None`` for a
    choice, a constant and a range of whole numbers only."""
    low, high, q, kind = parameter.low, parameter.high, parameter.q, parameter.distribution
    whole = q is not None and all(float(v).is_integer() for v in (q, *((low, high) if kind == "q_uniform" else ())))
    if kind not in (*FRACTIONAL, "q_uniform", "q_log_uniform_values") or whole:
        return None
    if q is not None:  # a grid point, not a whole number
        k = math.floor((high - low) / q / 2)
        value = low + k * q if kind == "q_uniform" else round(math.sqrt(low * high) / q) * q
        return round(value, 12) if not float(value).is_integer() else round(value + q / 2, 12)
    if kind == "uniform":
        return float(f"{low + (high - low) * 0.5523:.4g}")
    return float(f"{math.exp(math.log(low) + (math.log(high) - math.log(low)) * 0.5523):.4g}")


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

    check_metric(sweep)
    check_models(sweep)
    lines = [resolve_config_args(line) for line in trial_command_lines(sweep, fit_args, budget_s)]
    parser = None
    for line in lines:
        message, parser = _parse(line, parser)
        if message:
            raise UsageError(_in_sweep_file(message, sweep, fit_args))
    first = {p.name: candidates(p)[0] for p in sweep.parameters}
    for p in sweep.parameters:
        value = fraction(p)
        if value is None:
            continue
        line = ["fit", *fit_arguments(fit_args, {**first, p.name: value}, Path("runs"), budget_s, None)]
        message, parser = _parse(resolve_config_args(line), parser)
        if message:
            refused = _in_sweep_file(message, sweep, fit_args).split(": bad value: ", 1)[-1]
            raise UsageError(
                f"{sweep.source}: parameters.{p.name}: distribution {p.distribution} draws fractions such as {value} "
                f"({refused}); for whole numbers use int_uniform, q_uniform with a whole q, or values"
            )


def check_metric(sweep: Sweep) -> None:
    """Refuse a ``metric.name`` that no fit logs (:data:`FIT_METRICS`), with the closest name."""
    if sweep.metric in FIT_METRICS or sweep.metric.startswith(METRIC_PREFIXES):
        return
    raise UsageError(
        f"{sweep.source}: metric.name: {sweep.metric!r} is not logged by vit fit{suggest(sweep.metric, FIT_METRICS)}; "
        f"the metrics are {', '.join(FIT_METRICS)}"
    )


def check_models(sweep: Sweep) -> None:
    """Refuse a model name among the values of ``model.model`` that :func:`vit.models.model_config` (what ``vit fit``
    builds the model with) does not know, with the closest preset."""
    from vit.models import list_models, model_config
    from vit.network import timm_name

    for p in sweep.parameters:
        if p.name != MODEL_KEY:
            continue
        for value in p.values:
            if not isinstance(value, str) or timm_name(value) is not None:
                continue  # a class_path mapping: the parser's to check; a timm model: built when a trial starts
            try:
                model_config(value)
            except ValueError:
                raise UsageError(
                    f"{sweep.source}: parameters.{MODEL_KEY}: unknown model {value!r}{suggest(value, list_models())}; "
                    f"the models are {', '.join(list_models())}"
                ) from None


def baseline_params(sweep: Sweep, fit_args: Sequence[str], budget_s: float | None = None) -> dict[str, Any]:
    """The Optuna values of the configuration that the sweep's command trains without any of the sweep's values (its
    ``--config`` files and the arguments after ``--``, else the defaults of ``vit fit``; a key of
    ``model.model_overrides`` it leaves out: the preset's value, else the model's default): the first trial of rung 0
    with ``vit sweep --baseline``, as Optuna's ``enqueue_trial`` takes it.

    Raises:
        UsageError: For a searched parameter whose own value the sweep could not draw (not among its ``values``,
            outside its range or off its step), naming the parameter and the value.
    """
    from vit.configs import resolve_config_args

    line = resolve_config_args(["fit", *fit_arguments(fit_args, {}, Path("runs"), budget_s, None)])
    message, parser = _parse(line, None)
    if message:
        raise UsageError(_in_sweep_file(message, sweep, fit_args))
    config = parser.parse_args(line)
    space = search_space(sweep)
    params = {}
    for p in sweep.searched:
        value = _as_written(p, encode(_own_value(config, p.name, sweep)))
        refused = _outside(space[p.name], value)
        if refused:
            raise UsageError(
                f"{sweep.source}: parameters.{p.name}: the command's own value {value!r} is {refused}, so the sweep "
                "cannot run it as its baseline (--baseline); add the value to the parameter or leave --baseline out"
            )
        params[p.name] = value
    return params


def _as_written(p: Any, value: Any) -> Any:
    """``value`` as the sweep file writes it among the choices of ``p`` when it is one of them: the parser types
    ``warmup_epochs: 2`` as ``2.0``, and the table and summary show the sweep's ``2``."""
    same = [c for c in p.values if c == value and isinstance(c, bool) == isinstance(value, bool)]
    return same[0] if p.distribution == "categorical" and same else value


OVERRIDES_KEY = "model.model_overrides."
"""The prefix of a parameter that overrides one argument of the model preset."""


def _own_value(config: Any, name: str, sweep: Sweep) -> Any:
    """The value of ``name`` in the parsed ``config`` (a key of ``model.model_overrides`` the config leaves out: the
    preset's, else :class:`vit.VisionTransformer`'s default)."""
    import inspect

    from jsonargparse import Namespace

    from vit.models import VisionTransformer, model_config
    from vit.network import timm_name

    if f"fit.{name}" in config:
        value = config[f"fit.{name}"]
        return value.as_dict() if isinstance(value, Namespace) else value
    leaf = name.removeprefix(OVERRIDES_KEY)
    preset, overrides = config.get("fit.model.model"), config.get("fit.model.model_overrides") or {}
    ours = isinstance(preset, str) and timm_name(preset) is None  # a timm model: its overrides alone are known
    own = model_config(preset, **overrides) if ours else overrides
    defaults = inspect.signature(VisionTransformer).parameters if ours or not isinstance(preset, str) else {}
    if name.startswith(OVERRIDES_KEY) and (leaf in own or leaf in defaults):
        return own[leaf] if leaf in own else defaults[leaf].default
    raise UsageError(f"{sweep.source}: parameters.{name}: the command's config has no value of it for --baseline")


def _outside(dist: Any, value: Any) -> str:
    """Why Optuna's ``dist`` could not hold ``value`` (``""`` when it can)."""
    from optuna.distributions import CategoricalDistribution

    if isinstance(dist, CategoricalDistribution):
        return "" if value in dist.choices else f"not one of its values {list(dist.choices)}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"not a number of its range {dist.low}..{dist.high}"
    if not dist.low <= value <= dist.high:
        return f"outside its range {dist.low}..{dist.high}"
    steps = (value - dist.low) / dist.step if dist.step else 0.0
    return "" if math.isclose(steps, round(steps), abs_tol=1e-9) else f"off its step {dist.step} from {dist.low}"


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
