"""Time budgets of a sweep: ``--budget 5m`` for every trial, or ``--budget 5m,15m,45m`` for the rungs of successive
halving, each a fresh run with ``model.schedule: time`` that anneals as its ``trainer.max_time`` ends.

Successive halving (Jamieson & Talwalkar 2016) with budgets measured in time (Li, Yumer & Ramanan 2019, budgeted
training): rung 0 runs every configuration for the first budget, rung ``k`` runs the best ``1/eta`` of rung ``k - 1``
again from scratch for budget ``k``. No run is cut mid-schedule, so every result compared is an annealed one.
"""

from __future__ import annotations

import math
import re

from vit.errors import UsageError

_PART = re.compile(r"(\d+(?:\.\d+)?)([smh])")
_UNIT = {"s": 1, "m": 60, "h": 3600}

BUDGET_KEYS = ("model.schedule", "trainer.max_time", "trainer.max_epochs", "trainer.max_steps")
"""Config keys that ``--budget`` sets for every trial, so that a sweep parameter must not."""


def parse_duration(text: str) -> float:
    """Seconds of ``20s``, ``5m``, ``1.5h`` or ``1h30m``.

    Raises:
        UsageError: For anything else, naming the text.
    """
    text = text.strip().lower()
    parts = _PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise UsageError(f"--budget: {text!r} is not a duration; write 20s, 5m, 1h or 1h30m")
    seconds = sum(float(number) * _UNIT[unit] for number, unit in parts)
    if seconds < 1:
        raise UsageError(f"--budget: {text!r} is shorter than a second")
    return seconds


def rung_budgets(text: str | None, eta: int, rungs: int | None = None) -> list[float]:
    """The seconds of every rung: the comma-separated durations of ``--budget``; one duration and ``rungs`` from
    ``early_terminate: hyperband`` give ``budget * eta**k`` for ``k < rungs`` (W&B's brackets at ``min_iter *
    eta**k``, counted in time instead of iterations). ``None`` without ``--budget``: trials run as configured.

    Raises:
        UsageError: For a duration that cannot be read, or rungs that do not grow.
    """
    if text is None:
        return []
    budgets = [parse_duration(part) for part in text.split(",")]
    if len(budgets) == 1 and rungs:
        budgets = [budgets[0] * eta**k for k in range(rungs)]
    if any(later <= earlier for earlier, later in zip(budgets, budgets[1:], strict=False)):
        raise UsageError(f"--budget {text}: each rung's budget must be longer than the one before")
    return budgets


def survivors(count: int, eta: int) -> int:
    """How many of ``count`` configurations go on to the next rung: the best ``1/eta`` of them, at least one."""
    return max(1, count // eta)


def max_time(seconds: float) -> str:
    """``trainer.max_time`` for ``seconds``: Lightning's ``DD:HH:MM:SS``."""
    whole = int(math.ceil(seconds))
    days, rest = divmod(whole, 86400)
    return f"{days:02d}:{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"


def format_duration(seconds: float) -> str:
    """``45s``, ``5m``, ``1h30m``: a budget as ``--budget`` writes it."""
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "") + (f"{secs}s" if secs else "")
    return text or "0s"
