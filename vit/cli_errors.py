"""Parse errors of the ``vit fit|validate|test|predict`` command line as one sentence each.

jsonargparse reports a bad option or value with the whole usage (~100 lines) and its own wording
(``Parser key "model.lr": Expected a <class 'float'>. Got value: x``). :class:`VitArgumentParser` turns that into one
``error:`` line naming the key, the value, and where the value came from: the command line, or the YAML file that sets
it (the last ``--config`` file that does, unless the command line sets it later); an unknown option is told the
closest known one (:func:`vit.errors.suggest`).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

import yaml
from lightning.pytorch.cli import LightningArgumentParser

from .errors import fail, suggest

SUBCOMMANDS = ("fit", "validate", "test", "predict")


class VitArgumentParser(LightningArgumentParser):
    """Lightning's parser, whose errors are one line (:func:`describe_parse_error`), matching no option by a prefix.

    Args:
        command_line: The arguments being parsed, to find where a bad value came from; ``None`` reads
            ``sys.argv[1:]``.
    """

    def __init__(self, *args: Any, command_line: list[str] | None = None, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False  # no prefix matching: --trainer.max_epoch is an error, never max_epochs
        super().__init__(*args, **kwargs)
        self.command_line = command_line

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:
            super().error(message, ex)
        args = sys.argv[1:] if self.command_line is None else self.command_line
        fail(describe_parse_error(message, args, option_names(self)))


def option_names(parser: argparse.ArgumentParser) -> list[str]:
    """Every ``--option`` of ``parser`` and of its subcommands' parsers (without the subcommand: ``--model.lr``).

    A key of a YAML file is checked by the parser of the whole command line, which knows only ``--config`` and the
    subcommands; the options the key is compared with are the subcommand's.
    """
    names = []
    for action in parser._actions:
        names += [s for s in action.option_strings if s.startswith("--")]
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names += [name for name in option_names(sub) if name not in names]
    return names


def describe_parse_error(message: str, args: list[str], known: list[str] | None = None) -> str:
    """jsonargparse's error as one sentence naming the key, the value, and where the value came from.

    Args:
        message: jsonargparse's message, e.g. ``Parser key "model.lr":\\n  Expected a <class 'float'>. Got value: x``.
        args: The command-line arguments (to find the ``--config`` files and the options given).
        known: The parser's ``--options``: an unknown one is told the closest of them (:func:`vit.errors.suggest`).
    """
    text = re.sub(r"<class '([\w.]+)'>", r"\1", " ".join(message.split())).replace("NoneType", "null")
    if '"<unicode string>"' in text:  # jsonargparse parses the file's text: PyYAML's error does not name the file
        return yaml_syntax_error(args) or text
    text = re.sub(r"typing\.Literal\[([^\]]*)\]", r"one of \1", text)
    flag = re.search(r"unrecognized arguments: --([\w.]+)(?:=(\S+)|\s+(\S+))?", text)
    in_group = re.search(r"^Group '([\w.]+)' does not accept (?:option|key) '([\w.]+)'", text)  # trainer's max_epoch
    other = re.search(r"does not accept (?:option|key) '([\w.]+)'|^Option '([\w.]+)' is not accepted", text)
    typed = re.search(r'Parser key "([^"]+)": (.*)', text)
    given = None
    if flag:
        key, given = flag.group(1), flag.group(2) or flag.group(3)
    elif in_group:
        key = f"{in_group.group(1)}.{in_group.group(2)}"
    elif other:
        key = other.group(1) or other.group(2)
    elif typed:
        key = typed.group(1)
    else:
        return text
    unknown = bool(flag or in_group or other)
    source, value = value_source(key, args)
    if value is None:
        value = given
    where = {None: "", "command line": " on the command line"}.get(source, f" in {source}")
    if unknown:
        sub = args[0] if args and args[0] in SUBCOMMANDS else "<subcommand>"
        hint = closest_key(key, known or [])
        return f"unknown option {key}{where} (value {value!r}){hint}; `vit {sub} --help` lists the options"
    union = re.search(r"Subtypes: \[([^\]]*)\].*Given value: (.*)$", typed.group(2))
    expected = re.search(r"Expected a (.+?)\. Got value: (.*)$", typed.group(2))
    if union:
        detail = f"expected one of {union.group(1)}, got {union.group(2)!r}"
    elif expected:
        detail = f"expected {expected.group(1)}, got {expected.group(2)!r}"
    else:
        detail = typed.group(2) + (f" (value {value!r})" if value is not None else "")
    return f"bad value for {key}{where}: {detail}"


def config_files(args: list[str]) -> list[str]:
    """The ``--config`` files of ``args``, in order (inline YAML left out)."""
    files = [
        args[i + 1] if arg in ("--config", "-c") else arg.split("=", 1)[1]
        for i, arg in enumerate(args)
        if arg.startswith("--config=") or (arg in ("--config", "-c") and i + 1 < len(args))
    ]
    return [file for file in files if not file.lstrip().startswith("{")]


def yaml_syntax_error(args: list[str]) -> str | None:
    """PyYAML's error for the first ``--config`` file of ``args`` that is not valid YAML, read from the file so that
    the message names it (``in "configs/x.yaml", line 3, column 12``); ``None`` when every file parses."""
    for file in config_files(args):
        try:
            with open(file, encoding="utf-8") as stream:
                yaml.safe_load(stream)
        except OSError:
            continue
        except yaml.YAMLError as err:
            return f"config file {file} is not valid YAML: {' '.join(str(err).split())}"
    return None


def closest_key(key: str, known: list[str]) -> str:
    """``" (did you mean trainer.max_epochs?)"`` for the option of ``known`` closest to ``key``; for a key whose
    section is unknown, the closest section (``modle.lr``: ``model.lr``; ``modle.foo``: ``model``); else ``""``.

    Args:
        key: A dotted key, without ``--``.
        known: The parser's ``--options``.
    """
    head, dot, rest = key.partition(".")
    sections = sorted({name[2:].split(".")[0] for name in known if "." in name})
    if not dot or head in sections:
        return suggest(f"--{key}", known).replace("--", "", 1)
    section = suggest(head, sections)[len(" (did you mean ") : -len("?)")]  # a typo in the section's name
    if not section:
        return ""
    return f" (did you mean {section}.{rest}?)" if f"--{section}.{rest}" in known else f" (did you mean {section}?)"


def value_source(key: str, args: list[str]) -> tuple[str | None, Any]:
    """``("command line" | <yaml file> | None, value)``: where the last setting of ``key`` in ``args`` came from.

    Args:
        key: A dotted key, e.g. ``data.img_size``.
        args: The command-line arguments, ``--config`` files included.
    """
    source, value = None, None
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args) or arg.startswith("--config="):
            file = args[i + 1] if "=" not in arg else arg.split("=", 1)[1]
            found, found_value = _yaml_value(file, key)
            if found:
                source, value = file, found_value
        elif arg == f"--{key}" or arg.startswith(f"--{key}="):
            source = "command line"
            value = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else None)
    return source, value


def _yaml_value(file: str, key: str) -> tuple[bool, Any]:
    try:
        node: Any = yaml.safe_load(Path(file).read_text())
    except (OSError, yaml.YAMLError):
        return False, None
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, dict) and part in (node.get("init_args") or {}):
            node = node["init_args"][part]
        else:
            return False, None
    return True, node
