"""``python -m vit.compare``: the same as ``vit compare`` (see ``vit.compare``)."""

from vit.main import console

console(["compare"])
