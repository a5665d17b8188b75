"""Benchmarks: our ViT against timm's, global against window attention, and the data pipelines.

Suites (``--suite model|attention|data|all``), each printing a table and writing one JSON report (``--json``)
with the date, versions, device name, thread count and every setting:

- ``model``: training-step (forward, backward, AdamW step) and inference throughput of a preset against timm's
  ``VisionTransformer`` built from the same configuration and loaded with the same weights, measured alternately
  (ours then timm, then timm then ours, ...) for several rounds after warm-up; per-round ratios (ours / timm, above
  1 means we are faster) and their median; peak tensor memory; FLOPs per image and, on CUDA, MFU.
- ``attention``: forward + backward time and peak memory per token of ``vit.layers.Attention`` against
  ``vit.layers.WindowAttention`` (block windows) and ``vit.layers.NeighborhoodAttention`` (sliding windows) as the
  patch grid grows, for several window and kernel sizes.
- ``data``: images/s of one worker (one core, main process) for our albumentations pipelines and torchvision v2
  equivalents: the CIFAR preset on 32×32 images, and JPEG decode -> random-resized crop 224 -> flip -> normalise,
  with the normalisation in the worker or, as ``ImageDataModule`` does it, on the device after the copy.

Every suite runs with glibc's malloc keeping freed memory for reuse (:mod:`vit.allocator`), as ``vit`` commands do;
``--no-keep-freed-memory`` measures with the C library's defaults.

The ``model`` and ``attention`` suites import only torch, timm and ``vit``'s model code; albumentations, OpenCV,
torchvision and ``vit.data`` are imported by the ``data`` suite only.

One module per concern: ``harness`` (timing, spread, tables, the report), ``memory`` (peak tensor bytes),
``model_suite``, ``attention_suite``, ``data_suite``, ``photos`` (synthetic photographs) and ``cli`` (arguments).

Examples::

    python -m vit.bench --suite model --models vit_small_patch16_224 vit_small_patch4_32 --batch-sizes 8 64
    python -m vit.bench --suite attention --json runs/attention.json
    python -m vit.bench --suite model --device cuda --precision bf16 --compile --batch-sizes 512

``scripts/benchmark.py`` is the same command, with cifar10-mini's pictures for the data suite when they are found.
"""

from vit.bench.cli import BenchError, build_parser, main, parse_args, run

__all__ = ["BenchError", "build_parser", "main", "parse_args", "run"]
