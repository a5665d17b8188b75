"""What ``vit explain`` reads from its command line: argument types, the images named, the output folder.

Standard library only (the image folder walk is imported when a folder is given): the command answers a bad argument
or a missing image before torch loads.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ..errors import InputError


def pixel_limit(value: str) -> int | None:
    """``--max_image_pixels``: a positive number of pixels, or ``none``."""
    if value.lower() == "none":
        return None
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is neither a positive number of pixels nor none")
    return limit


def explorer_bits(value: str) -> int | str:
    """``--explorer_bits``: ``"auto"`` or a number of bits (argparse checks it against the choices)."""
    return value if value == "auto" else int(value)


def new_folder(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... : the first that does not exist yet (not created here)."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def find_images(inputs: Sequence[str]) -> list[Path]:
    """Image files named on the command line, and those anywhere inside named folders, sorted per folder.

    Raises:
        InputError: For a name that is neither a file nor a folder, a folder without images, or no image at all.
    """
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            from ..data import DataError, list_predict_files  # the folder walk of `vit predict --data.predict_dir`

            try:
                files += [Path(found) for found, _ in list_predict_files(path)]
            except DataError as err:
                raise InputError(str(err)) from None
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"{path}: no such image file or folder; pass image files or folders after the checkpoint")
    if not files:
        raise InputError("no images given: pass image files or folders after the checkpoint")
    return files
