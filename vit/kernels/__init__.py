"""Compiled CPU kernels of the package's own ops: C++ sources in ``csrc/``, each built on the first call that needs it.

* :mod:`vit.kernels.neighborhood`: exact, fused, trainable sliding-window attention (the CPU fp32 path of
  :class:`~vit.layers.NeighborhoodAttention`).
"""
