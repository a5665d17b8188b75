"""``python -m vit fit|validate|test|predict ...``: the same command line as the ``vit`` console script."""

from vit.cli import cli_main

if __name__ == "__main__":
    cli_main()
