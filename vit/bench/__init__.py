"""Benchmarks: our ViT against timm's, global against local attention, the data pipelines and the attention explorer.

One module per concern: ``cli`` (the arguments and the loop over the suites; its docstring, the text of
``vit bench --help``, describes every suite), ``harness`` (timing, spread, tables, the report), ``memory`` (peak
tensor bytes), ``model_suite``, ``attention_suite``, ``data_suite``, ``explorer_suite`` and ``photos`` (synthetic
photographs).

Example::

    python -m vit.bench --suite model --models vit_small_patch16_224 --batch-sizes 8
"""

from vit.bench.cli import BenchError, build_parser, main, parse_args, run

__all__ = ["BenchError", "build_parser", "main", "parse_args", "run"]
