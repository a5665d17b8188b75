#!/usr/bin/env bash
# GPU check: our ViT against timm's (bf16, eager and compiled), global vs window attention, and, where the training
# stack is installed, a 2-minute training run on synthetic data and the data pipelines on one of the host's CPU cores.
# For one H100/H200-class GPU without network; it installs nothing and finishes in at most 8 minutes (every step runs
# under its own `timeout`).
#
#   scripts/gpu_check.sh OUTDIR              # writes OUTDIR/*.json, *.log and summary.txt
#   DRY_RUN=1 scripts/gpu_check.sh OUTDIR    # tiny settings on the CPU: checks the plumbing in about two minutes
#
# Environment: PYTHON (default: python, else python3), BUDGET_S (default 470: the whole check, in seconds).
set -uo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: scripts/gpu_check.sh OUTDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
cd "$(dirname "$0")/.." || exit 2
# The repository is not pip-installed there: every Python step runs from the repository root (`python -m vit.bench`,
# `python -` reading a script), where the interpreter finds the package `vit` in the current directory.
export WANDB_MODE=offline WANDB_SILENT=true WANDB_DISABLE_GIT=true
PY=${PYTHON:-$(command -v python || command -v python3)}
BUDGET=${BUDGET_S:-470}
DRY=${DRY_RUN:-0}
START=$(date +%s)
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

elapsed() { echo $(($(date +%s) - START)); }

# step NAME MAX_SECONDS RESERVE_SECONDS CMD...: run CMD with stdout+stderr in OUT/NAME.log under a timeout of at most
# MAX_SECONDS, never eating into the RESERVE_SECONDS that the steps after it need.
step() {
    local name=$1 max=$2 reserve=$3
    shift 3
    local left=$((BUDGET - $(elapsed) - reserve))
    local limit=$((max < left ? max : left))
    if ((limit < 10)); then
        echo "$name: skipped, ${left}s left of the ${BUDGET}s budget" | tee -a "$SUMMARY"
        return 0
    fi
    echo "[$(elapsed)s] $name (timeout ${limit}s)" >&2
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    local status="ok"
    ((rc == 124 || rc == 137)) && status="TIMED OUT after ${limit}s (partial JSON kept)"
    ((rc != 0 && rc != 124 && rc != 137)) && status="FAILED rc=$rc (see $name.log)"
    echo "$name: $status, done at $(elapsed)s" | tee -a "$SUMMARY"
    grep -E '^(PASS|FAIL)  ' "$OUT/$name.log" >>"$SUMMARY" 2>/dev/null
    return 0
}

BENCH=(-m vit.bench --device cuda --precision bf16)
MODELS=(--models vit_small_patch16_224 vit_base_patch16_224 --batch-sizes 512 256)
ATTN=()
DATA=(--data-images 100 --data-samples 150 --data-rounds 2)  # this host's CPU cores: the per-worker JPEG target
FIT_TIME=00:00:02:00
FIT_ARGS=(--data.synthetic_size 65536)  # epochs of seconds: RunSummary measures whole epochs
if [[ $DRY == 1 ]]; then
    BENCH=(-m vit.bench --device cpu --precision fp32 --threads 1)
    MODELS=(--models vit_tiny_patch4_32 --batch-sizes 4 --override '{"depth": 2, "embed_dim": 64, "num_heads": 2}'
        --rounds 2 --steps 1 --warmup 1)
    ATTN=(--attn-grids 8 12 --window-sizes 4 --attn-dim 64 --attn-heads 2 --attn-tokens 512 --attn-reps 2)
    DATA=(--data-images 3 --data-samples 4 --data-rounds 1 --jpeg-size 96 128)
    FIT_TIME=00:00:00:20
    FIT_ARGS=(--trainer.accelerator cpu --trainer.precision 32-true --data.img_size 32 --data.batch_size 8
        --data.num_workers 0 --data.synthetic_size 64 --model.model vit_tiny_patch4_32)
fi

# 1. Where we are: GPU, driver, versions (no network, nothing installed).
step environment 30 440 bash -c "
    nvidia-smi || echo 'nvidia-smi: not available'
    $PY - <<'EOF'
import json, platform, torch
info = {'python': platform.python_version(), 'torch': torch.__version__, 'cuda': torch.version.cuda,
        'cuda_available': torch.cuda.is_available(),
        'device': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
for name in ('timm', 'lightning', 'albumentations', 'wandb', 'torchvision'):
    try:
        info[name] = __import__(name).__version__
    except Exception as err:  # noqa: BLE001 - report whatever is missing
        info[name] = f'missing ({type(err).__name__})'
print(json.dumps(info, indent=2))
json.dump(info, open('$OUT/environment.json', 'w'), indent=2)
EOF"

# 2. Throughput against timm, eager: ViT-S/16 batch 512 and ViT-B/16 batch 256 in bf16 autocast.
step model_eager 100 330 "$PY" "${BENCH[@]}" --suite model "${MODELS[@]}" --json "$OUT/model_eager.json"

# 3. Global vs window attention from a 32x32 to a 128x128 patch grid.
step attention 70 260 "$PY" "${BENCH[@]}" --suite attention "${ATTN[@]}" --json "$OUT/attention.json"

# 4. Two minutes of real training (Lightning, albumentations, W&B off) on synthetic data, where installed.
if timeout 90 "$PY" -c "import lightning, albumentations, wandb" >/dev/null 2>&1; then
    if [[ -f configs/vit_small.yaml ]]; then
        FIT_DIR=$(mktemp -d)  # checkpoints stay out of OUTDIR
        step fit 160 100 "$PY" - "$OUT/fit.json" "$FIT_DIR" "$FIT_TIME" "${FIT_ARGS[@]}" <<'EOF'
"""Train vit_small.yaml on synthetic data for a fixed time and report training images/s."""
import json
import sys
import time

from vit.callbacks import RunSummary
from vit.cli import cli_main

out, root, max_time, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
args = ["fit", "--config", "vit_small.yaml", "--data.dataset", "synthetic", "--trainer.logger", "false",
        "--trainer.max_time", max_time, "--trainer.default_root_dir", root, "--checkpoint.dirpath", root,
        "--trainer.callbacks+=vit.callbacks.RunSummary", *extra]
start = time.perf_counter()
cli = cli_main(args)
wall = time.perf_counter() - start
trainer = cli.trainer
summary = next(cb for cb in trainer.callbacks if isinstance(cb, RunSummary))
batch = cli.datamodule.batch_size
result = {
    "args": args,
    "wall_s": wall,
    "global_step": trainer.global_step,
    "batch_size": batch,
    "epochs_completed": trainer.current_epoch,
    "images_per_s": summary.throughput,  # complete epochs only, first batches and validation excluded
    "images_per_s_incl_overheads": trainer.global_step * batch / wall,  # start-up, validation and compile included
    "precision": str(trainer.precision),
}
print(json.dumps(result, indent=2))
json.dump(result, open(out, "w"), indent=2)
EOF
    else
        echo "fit: skipped, configs/vit_small.yaml not found" | tee -a "$SUMMARY"
    fi
else
    echo "fit: skipped, the training stack (lightning, albumentations, wandb) is not importable" | tee -a "$SUMMARY"
fi

# 5. The data pipelines on one of this host's CPU cores (server cores, unlike the 2-vCPU VM of the README's
#    table), where albumentations and OpenCV are importable.
if timeout 60 "$PY" -c "import albumentations, cv2" >/dev/null 2>&1; then
    step data 45 70 "$PY" -m vit.bench --suite data "${DATA[@]}" --json "$OUT/data.json"
else
    echo "data: skipped, albumentations or OpenCV is not importable" | tee -a "$SUMMARY"
fi

# 6. The same comparison compiled (torch.compile of both models): last, since compilation time varies most. The
#    JSON is rewritten after each model, so a timeout still keeps ViT-S.
step model_compiled 400 0 "$PY" "${BENCH[@]}" --suite model "${MODELS[@]}" --compile --json "$OUT/model_compiled.json"

echo "total $(elapsed)s of ${BUDGET}s; results in $OUT" | tee -a "$SUMMARY"
