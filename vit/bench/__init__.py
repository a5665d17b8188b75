"""Benchmarks: our ViT against timm's, global against local attention, the data pipelines and the attention explorer.

One module per concern: ``cli`` (the command: the options, and ``SUITES``, one entry per suite: its function, its
option group and the keywords it takes; its docstring, the text of ``vit bench --help``, describes every suite),
``defaults`` (the defaults the options show), ``harness`` (timing, alternation, spread, tables, the report),
``memory`` (peak tensor bytes), ``flops`` (FLOPs per image, GPU peaks for MFU), one module per suite (each a
measurement and its report: ``model_suite``, ``attention_suite``, ``data_suite`` with its pipelines in
``data_pipelines``, ``explorer_suite``, ``recipe_suite`` with its proxy's data and probes in ``recipe_proxy``,
``corruption_suite``), ``photos`` (synthetic photographs), and ``gpu_check``, the one call on a GPU machine
(``scripts/gpu_check.sh``).
The report's header (date, machine, versions, threads, load) is :func:`vit.env.run_header`. Importing the package
and ``cli`` loads no torch: each suite imports it when it runs.

Example::

    python -m vit.bench --suite model --models vit_small_patch16_224 --batch_sizes 8
"""

from vit.bench.cli import BenchError, build_parser, main, parse_args, run

__all__ = ["BenchError", "build_parser", "main", "parse_args", "run"]
