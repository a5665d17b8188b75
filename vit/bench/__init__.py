"""Benchmarks: our ViT against timm's, global against local attention, the data pipelines and the attention explorer.

One module per concern: ``cli`` (the command: the arguments, and each chosen suite called with its settings as
keywords; its docstring, the text of ``vit bench --help``, describes every suite), ``defaults`` (the defaults the
options show), ``harness`` (timing, spread, tables, the report), ``memory`` (peak tensor bytes), ``model_suite``,
``attention_suite``, ``data_suite``, ``explorer_suite``, ``recipe_suite`` and ``photos`` (synthetic photographs).
The report's header (date, machine, versions, threads, load) is :func:`vit.env.run_header`. Importing the package
and ``cli`` loads no torch: each suite imports it when it runs.

Example::

    python -m vit.bench --suite model --models vit_small_patch16_224 --batch-sizes 8
"""

from vit.bench.cli import BenchError, build_parser, main, parse_args, run

__all__ = ["BenchError", "build_parser", "main", "parse_args", "run"]
