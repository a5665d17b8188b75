"""W&B sweep files, read for ``vit sweep``: the YAML that ``wandb sweep`` takes, checked key by key.

The keys are W&B's ("Sweep configuration options"): ``program``, ``command``, ``method`` (``grid``, ``random``,
``bayes``), ``metric`` (``name``, ``goal``), ``parameters``, ``run_cap``, ``name``, ``description``, ``project``,
``entity`` and ``early_terminate`` (``type: hyperband`` with ``eta``, ``min_iter``, ``max_iter``, ``s``). A parameter
is ``value``, ``values``, or a ``distribution`` with ``min`` / ``max`` (and ``q``), or a group of nested
``parameters`` whose names join with dots (``model: {parameters: {lr: ...}}`` is ``model.lr``). Whatever the format
allows and ``vit sweep`` cannot do (``normal`` and ``beta`` distributions, ``probabilities``, ``metric.target``,
``${args_json}``...) is refused with one error naming the key. Standard library and PyYAML only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vit.errors import UsageError

METHODS = ("grid", "random", "bayes")
"""``method``: every combination, random draws, or Optuna's TPE (multivariate, constant liar)."""

DISTRIBUTIONS = (
    "constant", "categorical", "int_uniform", "uniform", "q_uniform", "log_uniform", "log_uniform_values",
    "q_log_uniform_values",
)  # fmt: skip
"""The W&B distributions ``vit sweep`` draws from; W&B's others (normal, beta, inverse log...) have no Optuna twin."""

TOP_KEYS = ("program", "command", "method", "metric", "parameters", "run_cap", "name", "description", "project",
            "entity", "early_terminate")  # fmt: skip
PARAMETER_KEYS = ("value", "values", "distribution", "min", "max", "q", "parameters")
MACROS = ("${env}", "${interpreter}", "${program}", "${args}")
"""The ``command`` macros ``vit sweep`` expands; the rest of W&B's (``${args_json}``, ...) are refused by name."""


class SweepFileError(UsageError):
    """A sweep file that ``vit sweep`` cannot run; the message names the file and the key."""


@dataclass(frozen=True)
class Parameter:
    """One searched (or fixed) config key of a sweep.

    Args:
        name: Dotted config key, as on the ``vit fit`` command line (``model.lr``).
        distribution: One of :data:`DISTRIBUTIONS`.
        values: The choices of ``categorical``, the one value of ``constant``.
        low: ``min`` (for ``log_uniform``: ``exp(min)``, W&B's exponents turned into values).
        high: ``max``, likewise.
        q: The step of the ``q_`` distributions.
    """

    name: str
    distribution: str
    values: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    q: float | None = None

    @property
    def searched(self) -> bool:
        """Whether the sampler chooses this value (a ``constant`` is passed to every trial as it is)."""
        return self.distribution != "constant"

    def grid(self) -> list[Any] | None:
        """Every value of this parameter for ``method: grid``, or ``None`` when it cannot be enumerated."""
        if self.distribution in ("constant", "categorical"):
            return list(self.values)
        if self.distribution == "int_uniform":
            return list(range(int(self.low), int(self.high) + 1))
        if self.distribution == "q_uniform":
            steps = int(math.floor((self.high - self.low) / self.q + 1e-9))
            return [_tidy(self.low + k * self.q, self.q) for k in range(steps + 1)]
        return None


@dataclass(frozen=True)
class Sweep:
    """A sweep file as ``vit sweep`` runs it.

    Args:
        name: ``name``, else the file's stem: the sweep folder, the Optuna study and the W&B group.
        method: One of :data:`METHODS`.
        metric: ``metric.name`` (``val/acc``): the trial's value of it when its fit ends.
        goal: ``maximize`` or ``minimize`` (W&B's default).
        parameters: Every parameter, constants included.
        fit_args: The ``vit fit`` arguments of ``command`` around ``${args}`` (``--config FILE``...).
        run_cap: ``run_cap``: how many configurations to try.
        eta: ``early_terminate.eta`` of ``hyperband`` (the halving factor), else ``None``.
        rungs: The rung count ``early_terminate`` implies (``s``, or ``log_eta(max_iter / min_iter) + 1``).
        source: The file.
        raw: The file as loaded (what a study's fingerprint holds).
    """

    name: str
    method: str
    metric: str
    goal: str
    parameters: tuple[Parameter, ...]
    fit_args: tuple[str, ...] = ()
    run_cap: int | None = None
    eta: int | None = None
    rungs: int | None = None
    source: Path = field(default=Path("sweep.yaml"))
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def searched(self) -> tuple[Parameter, ...]:
        """The parameters the sampler chooses."""
        return tuple(p for p in self.parameters if p.searched)

    @property
    def maximize(self) -> bool:
        return self.goal == "maximize"


def read_sweep(path: str | Path) -> Sweep:
    """Read and check a W&B sweep file.

    Raises:
        SweepFileError: For a missing or unreadable file and for any key ``vit sweep`` cannot run (named).
    """
    import yaml

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise SweepFileError(f"cannot read the sweep file {path}: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise SweepFileError(f"{path} is not YAML: {' '.join(str(err).split())}") from None
    return parse_sweep(raw, path)


def parse_sweep(raw: Any, path: str | Path = "sweep.yaml") -> Sweep:
    """:func:`read_sweep` of an already loaded sweep file (a mapping)."""
    path = Path(path)

    def bad(key: str, what: str) -> SweepFileError:
        return SweepFileError(f"{path}: {key}: {what}")

    if not isinstance(raw, Mapping):
        raise SweepFileError(f"{path}: a sweep file is a mapping of W&B sweep keys (program, method, parameters...)")
    for key in raw:
        if key not in TOP_KEYS:
            raise bad(key, f"not a W&B sweep key; the keys are {', '.join(TOP_KEYS)}")
    method = raw.get("method")
    if method not in METHODS:
        raise bad("method", f"{method!r} is not one of {', '.join(METHODS)}")
    metric, goal = _metric(raw.get("metric"), bad)
    if not isinstance(raw.get("parameters"), Mapping) or not raw["parameters"]:
        raise bad("parameters", "missing or empty: name the config keys to search")
    parameters = tuple(_parameters(raw["parameters"], "parameters", "", bad))
    run_cap = raw.get("run_cap")
    if run_cap is not None and (not isinstance(run_cap, int) or isinstance(run_cap, bool) or run_cap < 1):
        raise bad("run_cap", f"{run_cap!r} is not a positive whole number")
    eta, rungs = _early_terminate(raw.get("early_terminate"), bad)
    if method == "grid":
        for p in parameters:
            if p.grid() is None:
                raise bad(f"parameters.{p.name}", f"method grid needs values to enumerate; {p.distribution} has none")
    name = str(raw.get("name") or path.stem)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise bad("name", f"{name!r}: the sweep folder's name takes letters, digits, '_', '.' and '-'")
    fit_args = _fit_args(raw.get("program"), raw.get("command"), bad)
    return Sweep(name, method, metric, goal, parameters, fit_args, run_cap, eta, rungs, path, dict(raw))


def _metric(metric: Any, bad) -> tuple[str, str]:
    if not isinstance(metric, Mapping) or not isinstance(metric.get("name"), str):
        raise bad("metric", "missing: vit sweep ranks trials by metric.name (e.g. val/acc) and metric.goal")
    for key in metric:
        if key not in ("name", "goal"):
            raise bad(f"metric.{key}", "not supported by vit sweep (it runs every trial it plans); remove it")
    goal = metric.get("goal", "minimize")
    if goal not in ("maximize", "minimize"):
        raise bad("metric.goal", f"{goal!r} is neither maximize nor minimize")
    return metric["name"], goal


def _parameters(spec: Mapping[str, Any], where: str, prefix: str, bad) -> list[Parameter]:
    found = []
    for name, entry in spec.items():
        key = f"{where}.{name}"
        if not isinstance(entry, Mapping):
            raise bad(key, "a parameter is a mapping (value, values, or distribution with min and max)")
        if "parameters" in entry:
            if set(entry) != {"parameters"} or not isinstance(entry["parameters"], Mapping):
                raise bad(key, "a group of nested parameters holds only 'parameters'")
            found += _parameters(entry["parameters"], f"{key}.parameters", f"{prefix}{name}.", bad)
        else:
            found.append(_parameter(f"{prefix}{name}", entry, key, bad))
    return found


def _parameter(name: str, entry: Mapping[str, Any], key: str, bad) -> Parameter:
    for option in entry:
        if option not in PARAMETER_KEYS:
            raise bad(f"{key}.{option}", f"not supported by vit sweep; a parameter takes {', '.join(PARAMETER_KEYS)}")
    kind = entry.get("distribution") or _implied(entry)
    if kind not in DISTRIBUTIONS:
        raise bad(f"{key}.distribution", f"{kind!r} is not supported; vit sweep draws from {', '.join(DISTRIBUTIONS)}")
    if kind == "constant":
        if "value" not in entry:
            raise bad(key, "distribution constant needs 'value'")
        return Parameter(name, kind, (entry["value"],))
    if kind == "categorical":
        values = entry.get("values")
        if not isinstance(values, list) or not values:
            raise bad(f"{key}.values", "a non-empty list of choices is needed")
        return Parameter(name, kind, tuple(values))
    low, high = entry.get("min"), entry.get("max")
    for option, value in (("min", low), ("max", high)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad(f"{key}.{option}", f"distribution {kind} needs a number, not {value!r}")
    if low >= high:
        raise bad(key, f"min ({low}) must be below max ({high})")
    if kind == "int_uniform" and not (isinstance(low, int) and isinstance(high, int)):
        raise bad(key, "int_uniform needs whole numbers for min and max")
    if kind in ("log_uniform_values", "q_log_uniform_values") and low <= 0:
        raise bad(f"{key}.min", f"{kind} needs min > 0")
    if kind == "log_uniform":  # W&B's min and max are natural logarithms of the bounds
        low, high = math.exp(low), math.exp(high)
    q = entry.get("q", 1) if kind.startswith("q_") else None
    if q is not None and (isinstance(q, bool) or not isinstance(q, (int, float)) or q <= 0):
        raise bad(f"{key}.q", f"a positive step is needed, not {q!r}")
    return Parameter(name, kind, (), low, high, q)


def _implied(entry: Mapping[str, Any]) -> str:
    """W&B's distribution when none is named: categorical for values, constant for value, int_uniform for whole
    min and max, else uniform."""
    if "values" in entry:
        return "categorical"
    if "value" in entry:
        return "constant"
    whole = all(isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool) for k in ("min", "max"))
    return "int_uniform" if whole else "uniform"


def _early_terminate(spec: Any, bad) -> tuple[int | None, int | None]:
    if spec is None:
        return None, None
    if not isinstance(spec, Mapping) or spec.get("type") != "hyperband":
        raise bad("early_terminate.type", "vit sweep runs hyperband only (as successive halving of --budget)")
    for key in spec:
        if key not in ("type", "eta", "min_iter", "max_iter", "s"):
            raise bad(
                f"early_terminate.{key}", "not supported by vit sweep; hyperband takes eta, min_iter, max_iter, s"
            )
    for key in ("eta", "min_iter", "max_iter", "s"):
        value = spec.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise bad(f"early_terminate.{key}", f"{value!r} is not a positive whole number")
    eta = spec.get("eta", 3)
    if eta < 2:
        raise bad("early_terminate.eta", "the halving factor must be at least 2")
    rungs = spec.get("s")
    if rungs is None and spec.get("min_iter") and spec.get("max_iter"):
        rungs = int(math.floor(math.log(spec["max_iter"] / spec["min_iter"], eta) + 1e-9)) + 1
    return eta, rungs


def _fit_args(program: Any, command: Any, bad) -> tuple[str, ...]:
    if not isinstance(program, str) or Path(program).name != "fit.py":
        raise bad("program", f"{program!r}: vit sweep runs `vit fit` trials; program is scripts/fit.py")
    if command is None:
        return ()
    if not isinstance(command, list) or "${args}" not in command:
        raise bad("command", "a list of arguments holding ${args}, e.g. [${env}, ${interpreter}, ${program}, ${args}]")
    args = []
    for item in command:
        text = str(item)
        if text in MACROS:
            continue
        if "${" in text:
            raise bad("command", f"{text} is not supported by vit sweep; it expands {', '.join(MACROS)}")
        args.append(text)
    return tuple(args)


def _tidy(value: float, q: float) -> float | int:
    """A grid point on a ``q`` step without float noise (``0.30000000000000004`` -> ``0.3``); whole for whole steps."""
    if float(q).is_integer() and float(value).is_integer():
        return int(round(value))
    return round(value, 12)
