#!/usr/bin/env bash
# The GPU check (vit/bench/gpu_check/: its steps, limits and environment variables; `scripts/gpu_check.sh --help`):
#   scripts/gpu_check.sh OUTDIR              # one call on a GPU machine: OUTDIR/*.json, *.log, summary.txt
#   DRY_RUN=1 scripts/gpu_check.sh OUTDIR    # every step with tiny settings on the CPU
# It runs from the repository root, where Python finds `vit` without installing it; OUTDIR is read from here.
here=$PWD
cd "$(dirname "$0")/.." || exit 2
exec "${PYTHON:-$(command -v python || command -v python3)}" -m vit.bench.gpu_check --cwd "$here" "$@"
