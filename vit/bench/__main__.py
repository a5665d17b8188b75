"""``python -m vit.bench``: the same as ``vit bench`` (see ``vit.bench``)."""

from vit.main import console

console(["bench"])
