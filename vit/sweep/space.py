"""A sweep's parameters as Optuna sees them: one distribution per searched key, the sampler of the method, and the
values a trial passes to ``vit fit``.

=====================  ===============================================================================
W&B                    Optuna
=====================  ===============================================================================
``method: grid``       every combination enqueued once (``GridSampler`` over the same grid)
``method: random``     ``RandomSampler``
``method: bayes``      ``TPESampler(multivariate=True, constant_liar=True)``
``values``             ``CategoricalDistribution`` (lists and mappings stored as their JSON text)
``int_uniform``        ``IntDistribution(min, max)``
``uniform``            ``FloatDistribution(min, max)``
``q_uniform``          ``FloatDistribution(min, max, step=q)`` (``IntDistribution`` for whole numbers)
``log_uniform_values`` ``FloatDistribution(min, max, log=True)``; ``log_uniform``: ``exp(min)``, ``exp(max)``
``q_log_uniform_values`` ``FloatDistribution(min, max, log=True)``, the value rounded to a multiple of ``q``
=====================  ===============================================================================
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from .spec import Parameter, Sweep

_PRIMITIVE = (type(None), bool, int, float, str)


def encode(value: Any) -> Any:
    """A choice as Optuna stores it: a primitive as it is, a list or mapping as its JSON text."""
    return value if isinstance(value, _PRIMITIVE) else json.dumps(value)


def decode(parameter: Parameter, stored: Any) -> Any:
    """The config value of an Optuna parameter value (:func:`encode` undone; ``q_log_uniform_values`` rounded)."""
    if parameter.distribution in ("categorical", "constant"):
        return next((v for v in parameter.values if encode(v) == stored), stored)
    if parameter.distribution == "q_log_uniform_values":
        value = round(stored / parameter.q) * parameter.q
        return int(value) if float(parameter.q).is_integer() else value
    return stored


def distribution(parameter: Parameter, grid: bool = False) -> BaseDistribution:
    """The Optuna distribution of a searched parameter; with ``grid``, the categorical of its grid points."""
    if grid or parameter.distribution == "categorical":
        choices = parameter.grid() if grid else list(parameter.values)
        return CategoricalDistribution([encode(v) for v in choices])
    low, high, q = parameter.low, parameter.high, parameter.q
    if parameter.distribution == "int_uniform":
        return IntDistribution(int(low), int(high))
    if parameter.distribution == "q_uniform":
        if all(float(v).is_integer() for v in (low, high, q)):
            return IntDistribution(int(low), int(high), step=int(q))
        return FloatDistribution(low, high, step=q)
    log = parameter.distribution in ("log_uniform", "log_uniform_values", "q_log_uniform_values")
    return FloatDistribution(low, high, log=log)


def search_space(sweep: Sweep) -> dict[str, BaseDistribution]:
    """Each searched parameter's Optuna distribution, by config key."""
    grid = sweep.method == "grid"
    return {p.name: distribution(p, grid) for p in sweep.searched}


def grid_points(sweep: Sweep) -> list[dict[str, Any]]:
    """Every combination of a grid sweep, as Optuna parameter values (the order W&B's grid visits them)."""
    names = [p.name for p in sweep.searched]
    choices = [[encode(v) for v in p.grid()] for p in sweep.searched]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*choices)]


def sampler(sweep: Sweep, seed: int) -> optuna.samplers.BaseSampler:
    """The sampler of ``sweep.method``."""
    if sweep.method == "grid":
        grid = {p.name: [encode(v) for v in p.grid()] for p in sweep.searched}
        return optuna.samplers.GridSampler(grid, seed=seed)
    if sweep.method == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(multivariate=True, constant_liar=True, seed=seed)


def suggest(trial: optuna.Trial, sweep: Sweep) -> dict[str, Any]:
    """Draw (or read back, for an enqueued or retried trial) every parameter of ``sweep``: the config values by
    key, constants included."""
    space = search_space(sweep)
    values = {p.name: p.values[0] for p in sweep.parameters if not p.searched}
    for p in sweep.searched:
        values[p.name] = decode(p, _draw(trial, p.name, space[p.name]))
    return values


def _draw(trial: optuna.Trial, name: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)


def config_values(sweep: Sweep, params: dict[str, Any]) -> dict[str, Any]:
    """The config values of a finished trial's Optuna ``params`` (constants included)."""
    values = {p.name: p.values[0] for p in sweep.parameters if not p.searched}
    for p in sweep.searched:
        if p.name in params:
            values[p.name] = decode(p, params[p.name])
    return values
