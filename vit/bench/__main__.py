"""``python -m vit.bench``: see ``vit.bench``."""

from vit.bench.cli import main

main()
