"""``python -m vit.bench``: the same as ``vit bench`` (see ``vit.bench``)."""

from vit.bench.cli import main

main()
