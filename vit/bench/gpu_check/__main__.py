"""``python -m vit.bench.gpu_check OUTDIR``: the GPU check (see :mod:`vit.bench.gpu_check`)."""

from vit.bench.gpu_check import main

raise SystemExit(main())
