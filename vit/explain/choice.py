"""The explanation method chosen for a checkpoint, kept in a file beside it: ``<checkpoint>.explain.json``.

``vit explain CKPT --tune`` measures which map is most faithful for the model (:func:`~vit.explain.tune_method`) and
writes its choice here, next to the checkpoint and never into it: a checkpoint is what training wrote, and a reader
of it should not find it changed by an explanation command. Whoever explains the checkpoint without naming a method
reads the file back: ``vit explain`` without ``--methods``, the report, the training callback when it resumes or
validates that checkpoint, and :func:`stored_methods` for Python. The file records the checkpoint's SHA-256: a
checkpoint rewritten since (``last.ckpt`` after more training) no longer matches, and its old choice is ignored
with a line saying so.

Only the standard library: ``vit explain`` reads it before torch loads.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SUFFIX = ".explain.json"


class StaleChoice(ValueError):
    """A stored choice that does not belong to the checkpoint as it is now (or cannot be read)."""


@dataclass
class MethodChoice:
    """The method chosen for one checkpoint, as stored beside it.

    Attributes:
        method: The chosen name of :data:`~vit.explain.METHODS`.
        options: Method name to its measured options (the gamma rule of ``attnlrp`` / ``cp_lrp``), for every method
            tuned, chosen or not: ``vit explain --methods attnlrp`` uses them too.
        mean_srg: The chosen method's SRG averaged over ``removals`` on the held-out images.
        removals: The removals averaged.
        num_images: Held-out images measured.
        checkpoint_sha256: SHA-256 of the checkpoint file the choice was measured on.
        candidates: Every method measured: ``{"method", "options", "srg", "mean_srg", "ms_per_image"}``.
        header: Command, date, machine, versions and load of the run that chose (:func:`vit.env.run_header`).
    """

    method: str
    options: dict[str, dict[str, float]]
    mean_srg: float
    removals: list[str]
    num_images: int
    checkpoint_sha256: str
    candidates: list[dict[str, Any]] = field(default_factory=list)
    header: dict[str, Any] = field(default_factory=dict)

    def method_options(self, methods: list[str] | tuple[str, ...] | None = None) -> dict[str, dict[str, float]]:
        """The stored options of ``methods`` (default: the chosen one), as :func:`~vit.explain.explain` takes them."""
        names = [self.method] if methods is None else methods
        return {name: dict(self.options[name]) for name in names if name in self.options}

    def describe(self) -> str:
        """One line: the method, its options, the score and where it was measured."""
        options = ", ".join(f"{k} {v:g}" for k, v in self.options.get(self.method, {}).items())
        date = str(self.header.get("date", "?"))[:10]
        return (f"{self.method}{f' ({options})' if options else ''}, mean SRG {self.mean_srg:+.3f} over "
                f"{', '.join(self.removals)} on {self.num_images} held-out images, chosen {date}")  # fmt: skip


def choice_path(checkpoint: str | Path) -> Path:
    """Where the choice of ``checkpoint`` is kept: ``<checkpoint>.explain.json`` beside it."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.name + SUFFIX)


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_choice(checkpoint: str | Path, choice: MethodChoice) -> Path:
    """Write ``choice`` beside ``checkpoint`` in one rename (:func:`vit.atomic.write_bytes`); returns the path.

    The checkpoint itself is only read (for its SHA-256, which ``choice`` carries).
    """
    from ..atomic import write_bytes

    path = choice_path(checkpoint)
    write_bytes(path, (json.dumps(asdict(choice), indent=2) + "\n").encode())
    return path


def read_choice(checkpoint: str | Path) -> MethodChoice | None:
    """The choice stored beside ``checkpoint``, or ``None`` when there is none.

    Raises:
        StaleChoice: If the file cannot be read as a choice, or was measured on another version of the checkpoint
            (its SHA-256 differs); the message says what to do.
    """
    path = choice_path(checkpoint)
    if not path.is_file():
        return None
    try:
        choice = MethodChoice(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as err:
        raise StaleChoice(f"{path} is not a stored method choice ({err}): run `vit explain {checkpoint} --tune` "
                          "again, or delete it") from None  # fmt: skip
    if choice.checkpoint_sha256 != file_sha256(checkpoint):
        raise StaleChoice(f"{path} was measured on another version of {Path(checkpoint).name} (its SHA-256 "
                          f"differs): ignored; run `vit explain {checkpoint} --tune` again")  # fmt: skip
    return choice


def stored_methods(
    checkpoint: str | Path | None, default: str = "attnlrp"
) -> tuple[list[str], dict[str, dict[str, float]]]:
    """The methods and options to explain ``checkpoint`` with when none is named: its stored choice, else
    ``[default]`` without options (a stale choice, or no checkpoint, counts as none)::

        methods, options = stored_methods("runs/.../last.ckpt")
        explanation = explain(model, images, methods, options=options)
    """
    try:
        choice = None if checkpoint is None else read_choice(checkpoint)
    except StaleChoice:
        choice = None
    if choice is None:
        return [default], {}
    return [choice.method], choice.method_options()


def store_tuning(checkpoint: str | Path, tuning: Any, command: str) -> Path:
    """Store what :func:`~vit.explain.tune_method` chose (a :class:`~vit.explain.MethodTuning`) beside
    ``checkpoint``, with the header of the run that chose (``command``, date, machine, load); returns the path."""
    from ..env import run_header

    choice = MethodChoice(
        tuning.method, tuning.options, tuning.chosen.mean_srg, list(tuning.removals), tuning.num_images,
        file_sha256(checkpoint), [asdict(c) for c in tuning.candidates], run_header(command),
    )  # fmt: skip
    return write_choice(checkpoint, choice)


def stored_line(checkpoint: str | Path, method: str, options: dict[str, dict[str, float]]) -> str:
    """What ``vit explain --tune`` says after choosing: where the choice is, who uses it, and the training callback's
    arguments that use it in a new run."""
    chosen = json.dumps(options.get(method, {})).replace('"', "")
    return (f"chosen: {method}, stored in {choice_path(checkpoint)} (the checkpoint is unchanged): vit explain "
            "without --methods, the report and the training callback resuming or validating this checkpoint use it; "
            f"in a new run: ExplanationLogger's method: {method}, method_options: {{{method}: {chosen}}}")  # fmt: skip


def stored_choice(checkpoint: str | Path, methods: list[str], named: bool) -> tuple[list[str], dict]:
    """``vit explain`` without ``--tune``: the methods and options to explain ``checkpoint`` with. ``methods`` when
    they were ``named`` (with the options stored for them), else the stored choice, else ``methods`` (the default);
    a line on stderr says which stored choice is used, or why one is ignored."""
    try:
        choice = read_choice(checkpoint)
    except StaleChoice as err:
        print(f"method: {err}", file=sys.stderr)
        return methods, {}
    if choice is None:
        return methods, {}
    if named:
        options = choice.method_options(methods)
        if options:
            print(f"options stored by --tune for {', '.join(options)}: {options}", file=sys.stderr)
        return methods, options
    print(f"method: {choice.describe()} (stored by --tune; --methods to choose another)", file=sys.stderr)
    return [choice.method], choice.method_options()
