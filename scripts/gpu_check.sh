#!/usr/bin/env bash
# GPU check, one call of at most 10 minutes on one H100/H200-class GPU without network. Recipes first, in this order:
#   1. the CIFAR-10 speedrun on the real CIFAR-10 JPEGs with a time budget (model.schedule time, 2 min 45 s), then
#      the test accuracy of its final weights;
#   2. vit_small.yaml with a time budget (1 min 45 s) on the same images, then its test accuracy;
#   3. the recipe suite's GPU part: the speedrun and vit_small at twice their learning rate for 40 s each (about 600
#      steps of their step schedules): the loss must stay finite (1x is the runs above);
#   4. vit_small_imagenet.yaml for one minute on shards made from real photographs, decoded on the GPU, beside the
#      model's own training throughput on data already on the GPU (does the GPU wait for data?);
# then, while the budget lasts, the benchmarks: our ViT against timm's, attention patterns, explanation methods, the
# data pipelines and the compiled model suite. Every step runs under its own `timeout`; the whole check stays within
# BUDGET_S (default 570 s) and writes what it measured even when a step fails or times out.
#
#   scripts/gpu_check.sh OUTDIR              # writes OUTDIR/*.json, *.log and summary.txt
#   DRY_RUN=1 scripts/gpu_check.sh OUTDIR    # every step with tiny settings on the CPU: checks the plumbing
#
# Each recipe writes OUTDIR/NAME.json: its arguments, the validation curve (val/acc per validated epoch), the steps and
# epochs its budget bought, the fit's wall time (the whole process's too), images/s, and the test accuracy.
#
# The repository is not pip-installed on the GPU machine: every Python step runs from the repository root
# (`python -m vit.bench`, `python -` reading a script), where Python finds the package `vit` in the current
# directory. A machine without network gets what it lacks beside the repository before the call:
#   data/cifar10-jpeg.tar.gz    the CIFAR-10 JPEGs (train|test/<class>/*.jpg) as one tarball; /data/ is git-ignored
#   .whl/*.whl                  wheels of the packages missing there, installed first with pip --no-index --no-deps;
#                               on a machine with PyTorch, Lightning, timm and OpenCV these were: albumentations,
#                               albucore, simsimd, stringzilla, pydantic, pydantic_core, annotated-types,
#                               typing-inspection, jsonargparse, docstring_parser, typeshed_client, simplejpeg,
#                               litdata, boto3, botocore, s3transfer, jmespath, obstore
# Before the recipes, the check names every module they need that is missing, and skips them at once.
#
# Environment: PYTHON (default: python, else python3), BUDGET_S (default 570), CIFAR_TAR (default
# data/cifar10-jpeg.tar.gz), WHEELS (default .whl), DRY_RUN (1: CPU, tiny settings), ONLY (step names, e.g.
# "speedrun vit_small": run those steps alone).
set -uo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: scripts/gpu_check.sh OUTDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
cd "$(dirname "$0")/.." || exit 2
export WANDB_MODE=offline WANDB_SILENT=true WANDB_DISABLE_GIT=true PYTHONUNBUFFERED=1
PY=${PYTHON:-$(command -v python || command -v python3)}
DRY=${DRY_RUN:-0}
SCALE=$((DRY == 1 ? 3 : 1))  # a dry run on a small shared CPU: every limit three times longer
BUDGET=${BUDGET_S:-$((570 * SCALE))}
CIFAR_TAR=${CIFAR_TAR:-data/cifar10-jpeg.tar.gz}
WHEELS=${WHEELS:-.whl}
ONLY=${ONLY:-}
START=$(date +%s)
SUMMARY="$OUT/summary.txt"
SCRATCH=$(mktemp -d)  # checkpoints, extracted data: never in OUTDIR or the repository
trap 'rm -rf "$SCRATCH"' EXIT
: >"$SUMMARY"

elapsed() { echo $(($(date +%s) - START)); }
cfg_value() { "$PY" -c "import sys, yaml; print(float(yaml.safe_load(open(sys.argv[1]))['model'][sys.argv[2]]) * float(sys.argv[3]))" "$@"; }
note() { echo "$*" | tee -a "$SUMMARY"; }
importable() { timeout $((60 * SCALE)) "$PY" -c "import $1" >/dev/null 2>&1; }

# step NAME MAX_SECONDS RESERVE_SECONDS CMD...: run CMD with stdout+stderr in OUT/NAME.log under a timeout of at most
# MAX_SECONDS, never eating into the RESERVE_SECONDS that the steps after it need.
step() {
    local name=$1 max=$(($2 * SCALE)) reserve=$(($3 * SCALE))
    shift 3
    if [[ -n $ONLY ]]; then  # ONLY="speedrun vit_small": those steps alone, nothing kept back for the others
        [[ " $ONLY " == *" $name "* ]] || return 0
        reserve=0
    fi
    local left=$((BUDGET - $(elapsed) - reserve))
    local limit=$((max < left ? max : left))
    if ((limit < 10)); then
        note "$name: skipped, ${left}s left of the ${BUDGET}s budget"
        return 0
    fi
    echo "[$(elapsed)s] $name (timeout ${limit}s)" >&2
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    local status="ok"
    ((rc == 124 || rc == 137)) && status="TIMED OUT after ${limit}s (partial JSON kept)"
    ((rc != 0 && rc != 124 && rc != 137)) && status="FAILED rc=$rc (see $name.log)"
    note "$name: $status, done at $(elapsed)s"
    grep -E '^(PASS|FAIL|RESULT)  ' "$OUT/$name.log" >>"$SUMMARY" 2>/dev/null
    return 0
}

BENCH=(-m vit.bench --device cuda --precision bf16)
MODELS=(--models vit_small_patch16_224 vit_base_patch16_224 --batch-sizes 512 256)
ATTN=(--window-sizes 7 8 --sliding-sizes 7 9)  # grids 32..128 on CUDA
DATA=(--data-images 100 --data-samples 150 --data-rounds 2)  # this host's CPU cores: the per-worker targets
ATTRIBUTION=(cuda bf16 vit_base_patch16_224 64 '{}')
METHODS_ARGS=(cuda vit_small_patch16_224 64 '{}')  # every explanation method, fp32, random weights
LINEAR=(--window-sizes --sliding-sizes --linear-maps elu relu)  # linear against global, grids 32..128 on CUDA
MAP_MODELS=(--models vit_small_map_patch16_224 --batch-sizes 512)  # the MAP head against timm's, same weights
# The recipes plan their schedules to end with their budgets (model.schedule time); the step limits leave room for
# start-up, compilation, the last validation and the test.
SPEEDRUN=(--model.schedule time --trainer.max_time "${SPEEDRUN_TIME:-00:00:02:45}")
VIT_SMALL=(--model.schedule time --trainer.max_time 00:00:01:45 --data.download false)
NO_EXTRAS=(--trainer.limit_val_batches 0 --trainer.num_sanity_val_steps 0 --trainer.callbacks "[]")
LR2X=(--model.schedule steps --trainer.max_time 00:00:00:40 "${NO_EXTRAS[@]}")  # the step schedules' first ~40 s
PHOTOS=(10 128 500)  # classes, training photographs per class, width
IMAGENET=(--trainer.max_time 00:00:01:00 --data.decode_device cuda --data.num_workers 8 "${NO_EXTRAS[@]}")
if [[ $DRY == 1 ]]; then
    BENCH=(-m vit.bench --device cpu --precision fp32 --threads 1)
    MODELS=(--models vit_tiny_patch4_32 --batch-sizes 4 --override '{"depth": 2, "embed_dim": 64, "num_heads": 2}'
        --rounds 2 --steps 1 --warmup 1)
    ATTN=(--attn-grids 8 12 --window-sizes 4 --sliding-sizes 3 --attn-dim 64 --attn-heads 2 --attn-tokens 512
        --attn-reps 2)
    DATA=(--data-images 3 --data-samples 4 --data-rounds 1 --jpeg-size 96 128)
    ATTRIBUTION=(cpu fp32 vit_tiny_patch4_32 4 '{"depth": 2, "embed_dim": 32, "num_heads": 2}')
    METHODS_ARGS=(cpu vit_tiny_patch4_32 4 '{"depth": 2, "embed_dim": 32, "num_heads": 2}')
    LINEAR=(--attn-grids 8 12 --window-sizes --sliding-sizes --linear-maps elu --attn-dim 64 --attn-heads 2
        --attn-tokens 512 --attn-reps 2)
    MAP_MODELS=(--models vit_tiny_map_patch4_32 --batch-sizes 4 --override '{"depth": 2, "embed_dim": 64, "num_heads": 2}'
        --rounds 2 --steps 1 --warmup 1)
    TINY_FIT=(--trainer.accelerator cpu --trainer.devices 1 --trainer.precision 32-true --data.batch_size 8
        --data.num_workers 0 --model.model vit_tiny_patch4_32 --model.model_overrides.depth 1
        --model.model_overrides.embed_dim 32 --model.model_overrides.num_heads 2)
    SPEEDRUN=(--model.schedule time --trainer.max_time 00:00:00:20 "${TINY_FIT[@]}" --model.compile false)
    VIT_SMALL=(--model.schedule time --trainer.max_time 00:00:00:15 --data.download false "${TINY_FIT[@]}")
    LR2X=(--model.schedule steps --trainer.max_time 00:00:00:10 "${NO_EXTRAS[@]}" "${TINY_FIT[@]}" --model.compile false)
    PHOTOS=(2 8 64)
    IMAGENET=(--trainer.max_time 00:00:00:10 "${NO_EXTRAS[@]}" "${TINY_FIT[@]}" --data.img_size 32)
fi

# 0. Carried wheels (albumentations, jsonargparse, ...) into this machine's Python; nothing is fetched.
if [[ $DRY != 1 ]] && compgen -G "$WHEELS/*.whl" >/dev/null; then
    step wheels 40 520 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$WHEELS"/*.whl
fi

# 1. Where we are: GPU, driver, versions (no network).
step environment 30 490 bash -c "
    nvidia-smi || echo 'nvidia-smi: not available'
    $PY - <<'EOF'
import json, os, platform, torch
info = {'python': platform.python_version(), 'torch': torch.__version__, 'cuda': torch.version.cuda,
        'cuda_available': torch.cuda.is_available(), 'cpu_count': os.cpu_count(),
        'device': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
for name in ('timm', 'lightning', 'albumentations', 'jsonargparse', 'wandb', 'torchvision', 'cv2'):
    try:
        info[name] = __import__(name).__version__
    except Exception as err:  # noqa: BLE001 - report whatever is missing
        info[name] = f'missing ({type(err).__name__})'
print(json.dumps(info, indent=2))
json.dump(info, open('$OUT/environment.json', 'w'), indent=2)
EOF"

# 2. Recipes. FIT_SCRIPT fits a config (LightningCLI arguments after the first three), then tests the final weights when
#    asked; it writes the arguments, the validation curve, what the time budget bought, wall time, img/s and accuracy.
FIT_SCRIPT=$(
    cat <<'EOF'
"""Fit a config (LightningCLI arguments after the first three) and, with "test", test the final weights; write JSON."""
import json
import math
import sys
import time

import torch

from vit.callbacks import RunSummary, TimeBudget, training_throughput
from vit.cli import cli_main

out, root, test = sys.argv[1], sys.argv[2], sys.argv[3] == "test"
args = ["fit", *sys.argv[4:], "--trainer.logger", "false", "--trainer.default_root_dir", root]
start = time.perf_counter()
try:
    cli = cli_main(args)
except SystemExit as stop:  # a refused config or a non-finite stop: say so in the JSON too
    json.dump({"args": args, "exit": stop.code, "fit_wall_s": time.perf_counter() - start}, open(out, "w"), indent=2)
    print(f"RESULT  {out.rsplit('/', 1)[-1]}: exit {stop.code} after {time.perf_counter() - start:.0f} s")
    raise
wall = time.perf_counter() - start
trainer, module = cli.trainer, cli.model
throughput = training_throughput(trainer)
metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
summary = next((cb for cb in trainer.callbacks if isinstance(cb, RunSummary)), None)
budget = next((cb for cb in trainer.callbacks if isinstance(cb, TimeBudget) and cb.budget), None)
result = {
    "args": args, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    "fit_wall_s": wall, "global_step": trainer.global_step, "epochs_completed": trainer.current_epoch,
    "batch_size": cli.datamodule.batch_size, "precision": str(trainer.precision),
    "images_per_s": throughput if throughput == throughput else None,  # mean train/img_per_sec (nan: no callback)
    "images_per_s_incl_overheads": trainer.global_step * cli.datamodule.batch_size / wall,
    "budget": budget.summary(trainer) if budget else None,
    "val_curve": sorted(summary.val_acc.items()) if summary else None,  # [epoch, val/acc]
    "val_acc": metrics.get("val/acc"), "train_loss": metrics.get("train/loss_epoch"),
    "finite": all(math.isfinite(v) for v in metrics.values()),
}
if test:
    tested = trainer.test(module, datamodule=cli.datamodule, verbose=False, ckpt_path=None)
    result["test_acc"] = tested[0].get("test/acc") if tested else None
    result["total_wall_s"] = time.perf_counter() - start
print(json.dumps(result, indent=2))
bought = f", {result['budget']['steps']} steps = {result['budget']['epochs']:.1f} epochs bought" if budget else ""
tested = f"test/acc {result['test_acc'] or float('nan'):.4f}, {result['total_wall_s']:.0f} s with the test, " if test else ""
print(f"RESULT  {out.rsplit('/', 1)[-1][:-5]}: {tested}fit {wall:.0f} s, {result['images_per_s'] or 0:.0f} img/s, "
      f"val/acc {result['val_acc']}, {trainer.global_step} steps{bought}, finite {result['finite']}")
json.dump(result, open(out, "w"), indent=2)
EOF
)
# fit NAME MAX RESERVE test|no-test ARGS...: FIT_SCRIPT under step, with the whole process's wall time in the summary.
fit() {
    local name=$1 max=$2 reserve=$3 test=$4
    shift 4
    local t0=$(date +%s)
    step "$name" "$max" "$reserve" "$PY" - "$OUT/$name.json" "$SCRATCH/$name" "$test" "$@" <<<"$FIT_SCRIPT"
    note "$name: the whole command (Python start-up included) took $(($(date +%s) - t0)) s"
}

CIFAR_DIR="$SCRATCH/cifar10"
MISSING=$(
    "$PY" - <<'EOF'
import importlib
missing = []
for name in ("lightning", "timm", "torchmetrics", "albumentations", "jsonargparse", "cv2", "simplejpeg", "litdata",
             "vit.cli", "vit.data", "vit.data.streaming"):
    try:
        importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - name whatever is missing
        missing.append(f"{name} ({type(err).__name__}: {err})")
print("; ".join(missing))
EOF
)
if [[ -n $MISSING ]]; then
    note "recipes: skipped, not importable: $MISSING"
else
    mkdir -p "$CIFAR_DIR"
    if [[ $DRY == 1 && ! -f $CIFAR_TAR ]]; then  # a tarball of the same layout: train|test/<class>/*.jpg
        CIFAR_TAR="$SCRATCH/cifar10-tiny.tar.gz"
        "$PY" - "$SCRATCH/tiny" "$CIFAR_TAR" <<'EOF'
import sys, tarfile
from pathlib import Path
import numpy as np
from PIL import Image
root, rng = Path(sys.argv[1]), np.random.default_rng(0)
for split in ("train", "test"):
    for label in ("airplane", "cat"):
        (root / split / label).mkdir(parents=True)
        for i in range(16):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / split / label / f"{i}.jpg")
with tarfile.open(sys.argv[2], "w:gz") as tar:
    for split in ("train", "test"):
        tar.add(root / split, arcname=split)
EOF
    fi
    if [[ -f $CIFAR_TAR ]] && tar -xzf "$CIFAR_TAR" -C "$CIFAR_DIR"; then
        CIFAR=(--data.dataset imagefolder --data.data_dir "$CIFAR_DIR" --data.decode_once true)
        # 2a. The speedrun in its time budget, then its test accuracy.
        fit speedrun 280 250 test --config configs/cifar10_speedrun.yaml "${CIFAR[@]}" "${SPEEDRUN[@]}"
        # 2b. vit_small.yaml in its time budget, then its test accuracy.
        fit vit_small 150 140 test --config configs/vit_small.yaml "${CIFAR[@]}" "${VIT_SMALL[@]}"
        # 2c. The recipe suite's GPU part: twice the learning rate for 40 s (about 600 steps) of each config's step
        #     schedule (the speedrun's over 100 epochs): the loss must stay finite. 1x is the runs above.
        fit speedrun_lr2x 60 90 no-test --config configs/cifar10_speedrun.yaml "${CIFAR[@]}" "${LR2X[@]}" \
            --trainer.max_epochs 100 --model.lr "$(cfg_value configs/cifar10_speedrun.yaml lr 2)"
        fit vit_small_lr2x 60 40 no-test --config configs/vit_small.yaml "${CIFAR[@]}" "${LR2X[@]}" \
            --model.lr "$(cfg_value configs/vit_small.yaml lr 2)"
    else
        note "recipes: skipped, $CIFAR_TAR not found or unreadable (copy it into the repository's data/)"
    fi
    # 2d. vit_small_imagenet.yaml on shards of real photographs (crops of scikit-learn's two), decoded on the GPU.
    SHARD_SRC="$SCRATCH/photos" SHARDS="$SCRATCH/shards"
    if "$PY" - "$SHARD_SRC" "${PHOTOS[@]}" <<'EOF'
import sys
from pathlib import Path
from vit.bench.photos import real_photos
root, classes, per_class, size = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for split, count in (("train", per_class), ("val", max(2, per_class // 8))):
    for c in range(classes):
        (root / split / f"n{c:08d}").mkdir(parents=True)
        real_photos(root / split / f"n{c:08d}", count, (size * 3 // 4, size), seed=c + (1000 if split == "val" else 0))
EOF
    then
        step prepare_shards 40 40 "$PY" -m vit data prepare --data.dataset imagefolder --data.data_dir "$SHARD_SRC" \
            --out "$SHARDS" --workers 8
        fit imagenet_stream 70 0 no-test --config configs/vit_small_imagenet.yaml --data.dataset streaming \
            --data.data_dir "$SHARDS" "${IMAGENET[@]}"
    else
        note "imagenet_stream: skipped, the photographs could not be written"
    fi
fi

# 3. Throughput against timm, eager: ViT-S/16 batch 512 and ViT-B/16 batch 256 in bf16 autocast.
step model_eager 55 435 "$PY" "${BENCH[@]}" --suite model "${MODELS[@]}" --json "$OUT/model_eager.json"

# 4. Global vs window vs sliding-window attention (sliding rows: k = 7 and 9) from 32x32 to 128x128; the
#    sliding layers compile their FlexAttention kernel once per grid, hence the longer limit.
if importable "vit.layers.neighborhood_attention"; then
    step attention 90 345 "$PY" "${BENCH[@]}" --suite attention "${ATTN[@]}" --json "$OUT/attention.json"
else
    step attention 90 345 "$PY" "${BENCH[@]}" --suite attention "${ATTN[@]}" --sliding-sizes --json "$OUT/attention.json"
    note "attention: no sliding rows, vit.layers.NeighborhoodAttention is not importable"
fi

# 5. Attribution (Chefer et al. 2021) on a ViT-B/16 batch of 64 in bf16 autocast: seconds per batch.
if importable "vit.explain.attribution"; then
    step attribution 35 310 "$PY" - "$OUT/attribution.json" "${ATTRIBUTION[@]}" <<'EOF'
"""Time vit.explain.attribution.attention_attribution on one batch: warm-up, then the median of 3 timed calls."""
import json
import statistics
import sys
import time

import torch

from vit.explain.attribution import attention_attribution
from vit.models import create_model

out, device, precision, name, batch, overrides = sys.argv[1:7]
device, batch = torch.device(device), int(batch)
torch.manual_seed(0)
model = create_model(name, **json.loads(overrides)).to(device).eval()
images = torch.randn(batch, 3, *model.patch_embed.img_size, device=device)
dtype = torch.bfloat16 if precision == "bf16" else None


def call(fn):
    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        return fn()


def timed(fn, reps=3):
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = call(fn)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


maps = call(lambda: attention_attribution(model, images))  # warm-up
if device.type == "cuda":
    torch.cuda.reset_peak_memory_stats()
seconds, maps = timed(lambda: attention_attribution(model, images))
with torch.inference_mode():
    forward, _ = timed(lambda: model(images))
result = {
    "model": name, "batch": batch, "precision": precision, "device": str(device),
    "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
    "seconds_per_batch": seconds, "images_per_s": batch / seconds, "forward_seconds_per_batch": forward,
    "attribution_over_forward": seconds / forward, "map_shape": list(maps.shape),
    "finite": bool(torch.isfinite(maps).all()),
    "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
}
print(json.dumps(result, indent=2))
print(f"RESULT  attribution {name} batch {batch} {precision}: {seconds * 1e3:.0f} ms/batch, "
      f"{batch / seconds:.0f} img/s, {seconds / forward:.1f}x one forward pass, finite maps {result['finite']}")
json.dump(result, open(out, "w"), indent=2)
EOF
else
    note "attribution: skipped, vit.explain.attribution is not importable"
fi

# 5b. Every explanation method of vit.explain.METHODS (rollout, attribution, AttnLRP, CP-LRP, and integrated
#     gradients / Grad-CAM where the `explain` extra is installed) on ViT-S/16, batch 64, fp32, random weights: the
#     median of 3 timed calls per method after a warm-up, in ms per batch and per image, and AttnLRP's cost over one
#     attribution call (goal: at most 2x).
if importable "vit.explain.methods"; then
    step methods 60 250 "$PY" - "$OUT/methods.json" "${METHODS_ARGS[@]}" <<'EOF'
"""Time vit.explain.explain_map for every registered method on one batch (a method whose extra is missing is
reported as skipped)."""
import json
import statistics
import sys
import time

import torch

from vit.explain import METHODS, explain_map
from vit.models import create_model

out, device, name, batch, overrides = sys.argv[1:6]
device, batch = torch.device(device), int(batch)
torch.manual_seed(0)
model = create_model(name, **json.loads(overrides)).to(device).eval()
images = torch.randn(batch, 3, *model.patch_embed.img_size, device=device)


def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()


result = {"model": name, "batch": batch, "precision": "fp32", "device": str(device),
          "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "methods": {}}
for method in METHODS:
    try:
        explain_map(model, images, method)  # warm-up (and the import of an optional extra)
    except ImportError as err:
        result["methods"][method] = {"skipped": str(err)}
        print(f"RESULT  method {method}: skipped ({err})")
        continue
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(3):
        sync()
        start = time.perf_counter()
        patches = explain_map(model, images, method).patches
        sync()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    result["methods"][method] = {
        "seconds_per_batch": seconds, "ms_per_image": 1e3 * seconds / batch,
        "finite": bool(torch.isfinite(patches).all()),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
    }
    print(f"RESULT  method {method} {name} batch {batch}: {seconds * 1e3:.0f} ms/batch, "
          f"{1e3 * seconds / batch:.2f} ms/img, finite {result['methods'][method]['finite']}")
timed = result["methods"]
if "seconds_per_batch" in timed.get("attnlrp", {}) and "seconds_per_batch" in timed.get("attribution", {}):
    ratio = timed["attnlrp"]["seconds_per_batch"] / timed["attribution"]["seconds_per_batch"]
    result["attnlrp_over_attribution"] = ratio
    print(f"{'PASS' if ratio <= 2 else 'FAIL'}  AttnLRP costs {ratio:.2f}x one attribution call (goal <= 2x)")
print(json.dumps(result, indent=2))
json.dump(result, open(out, "w"), indent=2)
EOF
else
    note "methods: skipped, vit.explain.methods is not importable"
fi

# 6. The data pipelines on one of this host's CPU cores, where albumentations and OpenCV are importable.
if importable "albumentations, cv2"; then
    step data 30 0 "$PY" -m vit.bench --suite data "${DATA[@]}" --json "$OUT/data.json"
else
    note "data: skipped, albumentations or OpenCV is not importable"
fi

# 6b. Linear attention against global from 32x32 to 128x128 (per-token time flat, >= 5x at 64x64), and the MAP head
#     (global_pool="map") against timm's, eager. Guarded: run only where the layers and the --linear-maps option exist.
if importable "vit.layers.linear_attention, vit.layers.cross_attention"; then
    if "$PY" -m vit.bench --help 2>/dev/null | grep -q -- "--linear-maps"; then
        step linear_attention 45 160 "$PY" "${BENCH[@]}" --suite attention "${LINEAR[@]}" \
            --json "$OUT/linear_attention.json"
    else
        note "linear_attention: skipped, vit.bench has no --linear-maps option"
    fi
    step map_head 40 120 "$PY" "${BENCH[@]}" --suite model "${MAP_MODELS[@]}" --json "$OUT/map_head.json"
else
    note "linear_attention, map_head: skipped, vit.layers has no LinearAttention / AttentionPoolLatent"
fi

# 6c. JPEG decode on the GPU (--data.decode_device cuda): nvJPEG on batches of shard bytes, then random-resized crop
#     224 + flip there; images/s and GPU ms per batch of 256 real photographs (rescaled crops of scikit-learn's two).
DECODE_SCRIPT='
import tempfile, time
from pathlib import Path

import numpy as np
import torch

from vit.bench.photos import real_photos
from vit.data.jpeg import decode, decode_batch_cuda, encode_jpeg, shrink

with tempfile.TemporaryDirectory() as tmp:
    files = real_photos(Path(tmp), 256, (375, 500))
    datas = [encode_jpeg(shrink(decode(p.read_bytes()), 256)) for p in files]
rng = np.random.default_rng(0)
for _ in range(3):
    decode_batch_cuda(datas, 224, True, rng)
torch.cuda.synchronize()
start, n = time.perf_counter(), 20
for _ in range(n):
    decode_batch_cuda(datas, 224, True, rng)
torch.cuda.synchronize()
dt = (time.perf_counter() - start) / n
print(f"RESULT  GPU JPEG decode + RRC 224 + flip (shards, batch 256): {256 / dt:.0f} images/s, {dt * 1e3:.1f} ms per batch")
'
if [[ $DRY == 1 ]]; then
    note "gpu_decode: skipped in a dry run (needs CUDA)"
else
    step gpu_decode 40 100 "$PY" -c "$DECODE_SCRIPT"
fi

# 7. The model comparison compiled (torch.compile of both models): last, since compilation time varies most. The
#    JSON is rewritten after each model, so a timeout still keeps ViT-S.
step model_compiled 400 0 "$PY" "${BENCH[@]}" --suite model "${MODELS[@]}" --compile --json "$OUT/model_compiled.json"

note "total $(elapsed)s of ${BUDGET}s; results in $OUT"
