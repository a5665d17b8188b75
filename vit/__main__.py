"""``python -m vit SUBCOMMAND ...``: the same command line as the ``vit`` console script (:mod:`vit.main`)."""

from vit.main import console

if __name__ == "__main__":
    console()
