"""The experiment files of ``configs/``: a bare ``--config NAME`` looked up there, and which of them are made for a
CPU (named when a GPU recipe is refused on a machine without a GPU).

Standard library and PyYAML only: ``vit.cli`` resolves the names before LightningCLI parses the command line.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from .errors import fail, suggest

CONFIG_DIRS = (Path("configs"), Path(__file__).resolve().parents[1] / "configs")
"""Where a bare ``--config`` name is looked up: ``./configs`` first, then the repository's ``configs/``."""


def resolve_config_args(args: list[str]) -> list[str]:
    """Replace each ``--config NAME`` (also ``-c NAME``, ``--config=NAME``) that is not a file by the file
    ``configs/NAME`` or ``configs/NAME.yaml`` (of the working folder, else of the repository), or by ``NAME`` from the
    repository's root (``configs/cifar10_cpu.yaml``, as its sweep files write it); and each ``--key=None`` by
    ``--key=null`` (:func:`none_as_null`).

    Args:
        args: Command-line arguments, without the program name.

    Raises:
        SystemExit: (status 2, message on stderr) if ``NAME`` is neither a file nor a config name.
    """
    out = none_as_null(args)
    for i, arg in enumerate(out):
        if arg in ("--config", "-c") and i + 1 < len(out):
            out[i + 1] = _find_config(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + _find_config(arg.split("=", 1)[1])
    return out


def none_as_null(args: list[str]) -> list[str]:
    """``args`` with each ``--key=None`` written ``--key=null``. W&B's agent writes a sweep's ``null`` value with
    Python's ``str`` (``--model.ema_decay=None``), and the parser reads values as YAML, where ``None`` is a string
    that an optional number refuses."""
    return [a.removesuffix("None") + "null" if a.startswith("--") and a.endswith("=None") else a for a in args]


def _find_config(name: str) -> str:
    if Path(name).is_file() or name.lstrip().startswith("{"):  # a path, or inline YAML/JSON
        return name
    for folder in CONFIG_DIRS:  # a path from the repository's root, as its sweep files write them, found anywhere
        for candidate in (folder / name, folder / f"{name}.yaml", folder.parent / name):
            if candidate.is_file():
                return str(candidate)
    known = sorted({p.name for folder in CONFIG_DIRS if folder.is_dir() for p in folder.glob("*.yaml")})
    meant = suggest(name.removesuffix(".yaml"), [Path(k).stem for k in known])
    fail(
        f"config file {name!r} not found{meant}: it is not a path, nor a file in configs/. "
        f"Known configs: {', '.join(known) or 'none'}"
    )


def cpu_config_names() -> list[str]:
    """The configs of ``configs/`` that train a ViT on a CPU (their trainer's ``accelerator`` is ``cpu``; a ``timm:``
    model, such as the CNN teacher's, is not offered in place of a ViT recipe)."""
    from .network import timm_name  # here: resolving a config name loads no torch

    names = []
    for path in sorted({p.name: p for d in reversed(CONFIG_DIRS) if d.is_dir() for p in d.glob("*.yaml")}.values()):
        try:
            config = yaml.safe_load(path.read_text()) or {}
            trainer, model = config.get("trainer") or {}, (config.get("model") or {}).get("model")
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        if isinstance(trainer, dict) and trainer.get("accelerator") == "cpu" and timm_name(model) is None:
            names.append(path.stem)
    return names
