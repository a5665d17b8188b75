"""The shard format of ``vit data prepare``: the ``vit-shards.json`` file that marks a finished shard folder.

``DEST/<split>/`` (``train``, ``val``) holds LitData shards; ``DEST/vit-shards.json`` holds the class names,
per-channel statistics, image counts and skipped files, written last and atomically. The writer
(:mod:`vit.data.prepare`) and the readers (:mod:`vit.data.specs`, :mod:`vit.data.datamodule`,
:mod:`vit.data.streaming`) share this module, and only this module, between them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vit.atomic import write_text
from vit.data.datasets import DataError

META = "vit-shards.json"
FORMAT = "vit-shards/1"
SPLITS = ("train", "val")


def meta_path(dest: str | os.PathLike) -> str | Path:
    """Where ``vit-shards.json`` of ``dest`` lives: a URL stays a string (``Path`` would mangle ``s3://``).

    Args:
        dest: The shard folder or its URL.
    """
    return f"{str(dest).rstrip('/')}/{META}" if "://" in str(dest) else Path(dest).expanduser() / META


def _read_text(path: str | Path) -> str:
    """A local file's text, or a URL's through fsspec (``s3://``, ``gs://``, ...), as LitData reads the shards."""
    if isinstance(path, Path):
        return path.read_text()
    import fsspec

    with fsspec.open(path, "r") as file:
        return file.read()


def read_meta(dest: str | os.PathLike) -> dict[str, Any]:
    """The metadata of a finished shard folder.

    Args:
        dest: The shard folder or its URL.

    Raises:
        DataError: ``dest`` is not a finished ``vit data prepare`` folder.
    """
    path = meta_path(dest)
    try:
        meta = json.loads(_read_text(path))
    except ImportError as err:  # fsspec knows the URL's scheme but its package (s3fs, gcsfs, adlfs) is absent
        raise DataError(f"reading {path} needs a package that is not installed: {err}") from None
    except (OSError, ValueError):
        raise DataError(
            f"--data.data_dir {dest} is not a finished shard folder (no readable {META}); "
            "write one with `vit data prepare --data.dataset NAME --data.data_dir SRC --out DEST`"
        ) from None
    if meta.get("format") != FORMAT:
        raise DataError(f"{path} is not a vit-shards file")
    return meta


def write_meta(dest: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Write ``meta`` (stamped with :data:`FORMAT`) as ``dest/vit-shards.json``, atomically: the folder is then
    finished. Returns what was written.

    Args:
        dest: The local shard folder.
        meta: Dataset name, classes, statistics, image counts, skipped files.
    """
    meta = {"format": FORMAT, **meta}
    write_text(dest / META, json.dumps(meta, indent=2) + "\n")
    return meta
