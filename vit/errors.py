"""The user errors of every ``vit`` subcommand, one hierarchy, and the one table of exit statuses.

A command raises a :class:`VitError` (bad usage, input, data or checkpoint; a non-finite training run) and the ``vit``
entry point prints it as one ``error: <message>`` line on stderr, without traceback, and exits with the error's
:attr:`~VitError.exit_status` (:data:`EXIT_STATUSES`). Each error class also derives from the built-in exception
callers caught before this hierarchy existed (``ValueError``, ``RuntimeError``, ``FileNotFoundError``).
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import sys
import textwrap
from collections.abc import Iterable
from typing import Any, NoReturn

EXIT_OK = 0
"""Success, also ``--help``."""
EXIT_BAD_INPUT = 2
"""Bad input: an argument, config file, data set, checkpoint or output folder that cannot work (one ``error:`` line)."""
EXIT_NON_FINITE = 3
"""Training stopped at a non-finite loss or gradient (the last good checkpoint is kept)."""


class VitError(Exception):
    """An error the user can fix: printed as one ``error:`` line, exit :attr:`exit_status`."""

    exit_status: int = EXIT_BAD_INPUT


class UsageError(VitError):
    """Bad input from the user of a command: an option, a config value or an output folder that cannot work."""


class ConfigError(UsageError, ValueError):
    """An :class:`~vit.ImageClassifier` argument that cannot work (unknown preset, bad override, disagreeing sizes)."""


class InputError(VitError):
    """An input file of a command that cannot be used: a missing or unreadable image, a run folder without runs."""


class DataError(VitError, ValueError):
    """The data on disk is missing, laid out differently than expected, or unreadable."""


class CheckpointError(VitError, RuntimeError):
    """A checkpoint or weight file that cannot be used (the subclasses say why)."""


class MissingCheckpointError(CheckpointError, FileNotFoundError):
    """A checkpoint path that does not exist."""


class CheckpointFolderError(CheckpointError, IsADirectoryError):
    """A checkpoint path that is a folder (a run's, or its ``checkpoints/``) rather than the file inside it."""


class CorruptCheckpointError(CheckpointError):
    """A file that is not a PyTorch checkpoint: another kind of file, empty, truncated or corrupt."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file that cannot be loaded without running arbitrary code."""


class IncompatibleCheckpointError(CheckpointError):
    """A checkpoint whose keys or shapes do not fit the model."""


class NonFiniteError(VitError, RuntimeError):
    """Training produced a non-finite loss, gradient or weight (:class:`vit.callbacks.NonFiniteGuard`)."""

    exit_status = EXIT_NON_FINITE


EXIT_STATUSES: dict[type[VitError], int] = {
    kind: kind.exit_status for kind in (UsageError, InputError, DataError, CheckpointError, NonFiniteError)
}
"""The one table of exit statuses: each error becomes ``error: <message>`` on stderr and this status (a subclass
takes its base's). Besides these, ``0`` is success (also ``--help``), a bad argument or config file exits with
:data:`EXIT_BAD_INPUT`, and a run stopped by SIGTERM/SIGINT after writing its checkpoint exits with ``128 + signal``
(143, 130; :class:`vit.callbacks.resume.Preempted`). :data:`EXIT_NON_FINITE`: with the default
``--nonfinite.check_every_n_steps 1`` the weights in memory are still finite too."""


def fail(message: object, status: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print ``error: <message>`` (one line, on a line of its own after any progress bar) on stderr and exit with
    ``status``."""
    close_progress_bars()
    sys.stderr.write(f"error: {' '.join(str(message).split())}\n")
    sys.stderr.flush()
    raise SystemExit(status)


def exit_with(error: VitError) -> NoReturn:
    """:func:`fail` with ``error``'s message and exit status."""
    fail(error_message(error), error.exit_status)


def error_message(error: BaseException) -> str:
    """``error``'s own message. An error raised in a DataLoader worker reaches the main process as the same class
    whose message is the worker's whole traceback (``Caught DataError in DataLoader worker process 0. Original
    Traceback ...``): only the message at its end is the user's."""
    text = str(error)
    if not (text.startswith("Caught ") and "Original Traceback" in text):
        return text
    kind = type(error)
    for name in (f"{kind.__module__}.{kind.__qualname__}: ", f"{kind.__qualname__}: "):
        at = text.rfind(name)
        if at >= 0:
            return text[at + len(name) :].strip()
    return text.rstrip().splitlines()[-1]


def close_progress_bars() -> None:
    """End the progress bars still open (tqdm's, as Lightning's), so that what is printed next starts a line of its
    own instead of continuing the bar's."""
    tqdm = sys.modules.get("tqdm.std")  # never imported here: without a bar there is nothing to close
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", None) or []):
        if not getattr(bar, "disable", True):
            bar.close()


class ArgumentParser(argparse.ArgumentParser):
    """:class:`argparse.ArgumentParser` for the ``vit`` subcommands, one behaviour and one help layout for all.

    - Options are spelled as LightningCLI's (``--data.data_dir``, ``--img_size``, ``--overlays false``). An older
      spelling still works for a release: ``--img-size`` (any option with ``-`` for ``_``) or a name of ``renamed``
      (``{"--data_dir": "--data.data_dir", "--no-overlays": "--overlays false"}``), with one ``note:`` line on
      stderr giving the new spelling.
    - No prefix matching (``allow_abbrev=False``: a typo is an error, never another option); a usage error is one
      ``error:`` line naming the option, with the closest option in the new spelling suggested, exit
      :data:`EXIT_BAD_INPUT`.
    - The help: the usage, ``doc``'s first paragraph (the command's one sentence, without a leading usage such as
      ``vit export --out DIR:``), the options, then ``doc``'s other paragraphs as written (examples keep their layout;
      paragraphs for the developer, starting with ``:mod:``, are left out), reST markup removed.
    """

    def __init__(self, *args: Any, doc: str = "", renamed: dict[str, str] | None = None, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        if doc:
            kwargs.setdefault("description", help_description(doc))
            kwargs.setdefault("epilog", help_epilog(doc))
        super().__init__(*args, **kwargs)
        self.renamed = dict(renamed or {})

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        return super().parse_known_args(self.modernize(sys.argv[1:] if args is None else list(args)), namespace)

    def modernize(self, argv: list[str]) -> list[str]:
        """``argv`` with every older spelling of an option replaced by its new one, after one ``note:`` line on
        stderr naming them (nothing is printed when every option is spelled the new way)."""
        known, out, notes = set(self.option_names()), [], []
        for at, token in enumerate(argv):
            if token == "--":
                out.extend(argv[at:])
                break
            name, eq, value = token.partition("=")
            new = None if not token.startswith("--") or name in known else self.new_spelling(name, known)
            if new is None:
                out.append(token)
                continue
            notes.append(f"{new} for {name}")
            out.extend(new.split() if not eq else [f"{new}={value}"])
        if notes:
            sys.stderr.write(f"note: {self.prog}: use {', '.join(dict.fromkeys(notes))} (the old spelling goes in "
                             "the next release)\n")  # fmt: skip
        return out

    def new_spelling(self, name: str, known: set[str]) -> str | None:
        """The new spelling of option ``name`` (``--img_size`` for ``--img-size``), or ``None`` for an unknown one."""
        if name in self.renamed:
            return self.renamed[name]
        underscored = "--" + name[2:].replace("-", "_")
        return underscored if underscored in known else None

    def error(self, message: str) -> NoReturn:
        unknown = re.search(r"unrecognized arguments: (\S+)", message)
        if unknown:
            option = unknown.group(1).split("=", 1)[0]
            message = f"unknown option {option}{suggest(option, self.option_names())}"
        fail(f"{self.prog}: {message}; `{self.prog} --help` lists the options")

    def option_names(self) -> list[str]:
        """Every ``--option`` this parser knows."""
        return [s for action in self._actions for s in action.option_strings if s.startswith("--")]


def add_switch(parser: Any, option: str, *, default: bool, help: str) -> None:
    """An on/off option as LightningCLI spells one: ``--overlays false``, ``--overlays true``, or ``--overlays``
    alone for true; ``parser`` is an :class:`ArgumentParser` or one of its groups."""
    parser.add_argument(option, type=boolean, nargs="?", const=True, default=default, metavar="{true,false}", help=help)


def boolean(text: str) -> bool:
    """``true``/``false`` (also ``yes``/``no``, ``1``/``0``, any case) as a bool."""
    value = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


def plain(text: str) -> str:
    """reST ``text`` as a terminal shows it: ````code```` as ``code``, ``:mod:`~vit.sweep.spec``` as ``spec``."""
    text = re.sub(r":\w+:`~[\w.]*?(\w+)`", r"\1", text)
    text = re.sub(r":\w+:`([^`]+)`", r"\1", text)
    return re.sub(r"``([^`]+)``", r"\1", text).replace("::\n", ":\n")


def help_description(doc: str) -> str:
    """``doc``'s first paragraph as a help description: plain, one sentence starting with a capital (a leading usage
    in double backticks, with any parenthesis after it, and its colon left out), filled."""
    first = " ".join(doc.strip().split("\n\n", 1)[0].split())
    first = re.sub(r"^``vit [^`]*``( \([^)]*\))?: ", "", first)
    return fill(plain(first[:1].upper() + first[1:]))


def help_epilog(doc: str) -> str:
    """``doc``'s paragraphs after the first, plain and filled, without those for the developer (starting with
    ``:mod:``); an indented paragraph (examples) keeps its lines, a list keeps its items."""
    out = []
    for paragraph in doc.strip().split("\n\n")[1:]:
        if paragraph.lstrip().startswith(":mod:"):
            continue
        if paragraph.startswith((" ", "\t")):
            out.append(plain(paragraph))
        elif paragraph.startswith("- "):
            items = re.split(r"\n(?=- )", paragraph)
            out.append("\n".join(fill(plain(" ".join(item.split())), "  ") for item in items))
        else:
            out.append(fill(plain(" ".join(paragraph.split()))))
    return "\n\n".join(out)


def fill(text: str, indent: str = "") -> str:
    """``text`` filled to the terminal's width as argparse fills the options (at most 120 columns)."""
    width = max(40, min(120, shutil.get_terminal_size().columns - 2))
    return textwrap.fill(text, width, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)


def suggest(name: str, known: Iterable[str]) -> str:
    """``" (did you mean --max_epochs?)"`` for the closest of ``known`` to ``name``, or ``""`` when none is close.

    A whole-word match in the same section comes first (:func:`word_match`: ``--model.learning_rate`` is
    ``--model.lr``, ``--model.lr_min`` ``--model.min_lr``, ``--trainer.epochs`` ``--trainer.max_epochs``), then the
    closest spelling (difflib's ratio: ``--trainer.max_epoch`` is ``--trainer.max_epochs``).
    """
    known = list(known)
    section, _, leaf = name.rpartition(".")
    ranked = [
        (rank, len(option), option)
        for option in known
        if option.rpartition(".")[0] == section and (rank := word_match(leaf, option.rpartition(".")[2])) is not None
    ]
    close = [min(ranked)[2]] if ranked else difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def word_match(given: str, option: str) -> int | None:
    """How ``given`` names ``option`` by its words (``_``/``-`` separated), best first: 0, the same words in another
    order (``lr_min``, ``min_lr``; a plural as its singular: ``tune_image``, ``tune_images``); 1, one is the other's
    initials (``learning_rate``, ``lr``); 2, the words of one among the other's (``epochs``, ``max_epochs``);
    ``None``: no whole-word match."""
    a, b = (sorted(singular(w) for w in re.split(r"[_\-]+", text.lower().lstrip("-")) if w) for text in (given, option))
    initials = ["".join(w[0] for w in re.split(r"[_\-]+", x.lower()) if w) for x in (given, option)]
    if not a or not b:
        return None
    if a == b:
        return 0
    if (len(a) > 1 and initials[0] == option.lower()) or (len(b) > 1 and initials[1] == given.lower()):
        return 1
    return 2 if set(a) <= set(b) or set(b) <= set(a) else None


def singular(word: str) -> str:
    """``word`` without a plural's ``s`` (``images``: ``image``; ``loss`` stays)."""
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word
