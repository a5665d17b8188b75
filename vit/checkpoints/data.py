"""The data module of a checkpoint's run, rebuilt from the settings Lightning stored beside its weights."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..data import ImageDataModule


def data_settings(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`~vit.ImageDataModule` arguments of a Lightning checkpoint (``datamodule_hyper_parameters``),
    without Lightning's own ``_class_path``/``_instantiator`` entries."""
    settings = checkpoint.get("datamodule_hyper_parameters") or {}
    return {k: v for k, v in settings.items() if not str(k).startswith("_")}


def rebuild_datamodule(settings: Mapping[str, Any], **overrides: Any) -> ImageDataModule | None:
    """An :class:`~vit.ImageDataModule` of ``settings`` (with ``overrides``), or ``None`` when they do not work on this
    machine (a folder data set whose folder is not here, a download that is off).

    Args:
        settings: Data module arguments (:func:`data_settings`, or the ``data`` section of a parsed config).
        overrides: Arguments that replace those of ``settings``, e.g. ``num_workers=0``.
    """
    from ..data import ImageDataModule

    try:
        return ImageDataModule(**{**settings, **overrides})
    except Exception:  # any reason the data is not here: the caller falls back to the checkpoint's description
        return None
