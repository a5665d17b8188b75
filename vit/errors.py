"""The one usage-error type and the one table of exit statuses of every ``vit`` subcommand.

A command raises :class:`UsageError` (or one of the library's errors listed in :data:`EXIT_STATUSES`) and the
``vit`` entry point prints it as one ``error: <message>`` line on stderr, without traceback, and exits with its status.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable
from typing import Any, NoReturn

EXIT_OK = 0
"""Success, also ``--help``."""
EXIT_BAD_INPUT = 2
"""Bad input: an argument, config file, data set, checkpoint or output folder that cannot work (one ``error:`` line)."""
EXIT_NON_FINITE = 3
"""Training stopped at a non-finite loss or gradient (the last good checkpoint is kept)."""


class UsageError(Exception):
    """Bad input from the user of a command: printed as one ``error:`` line, exit :data:`EXIT_BAD_INPUT`."""


def fail(message: object, status: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print ``error: <message>`` (one line) on stderr and exit with ``status``."""
    sys.stderr.write(f"error: {' '.join(str(message).split())}\n")
    sys.stderr.flush()
    raise SystemExit(status)


class ArgumentParser(argparse.ArgumentParser):
    """:class:`argparse.ArgumentParser` for the ``vit`` subcommands: no prefix matching of options
    (``allow_abbrev=False``: a typo is an error, never another option), and a usage error is one ``error:`` line
    naming the option, with the closest known option suggested, exit :data:`EXIT_BAD_INPUT`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        unknown = re.search(r"unrecognized arguments: (\S+)", message)
        if unknown:
            option = unknown.group(1).split("=", 1)[0]
            message = f"unknown option {option}{suggest(option, self.option_names())}"
        fail(f"{self.prog}: {message}; `{self.prog} --help` lists the options")

    def option_names(self) -> list[str]:
        """Every ``--option`` this parser knows."""
        return [s for action in self._actions for s in action.option_strings if s.startswith("--")]


def suggest(name: str, known: Iterable[str]) -> str:
    """``" (did you mean --max_epochs?)"`` for the closest of ``known`` to ``name``, or ``""`` when none is close."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""
