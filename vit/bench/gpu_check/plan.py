"""The GPU check's steps, in their order: the recipes first, then the benchmarks, the compiled model suite last.

Each step's own limit (``max_s``) and the seconds it leaves for the steps after it (``reserve_s``) are in
:data:`LIMITS`, seconds on a GPU machine (a dry run multiplies them by three); the package's docstring says how they
were set. ``DRY`` holds the tiny settings of a dry run on the CPU, ``GPU`` the real ones.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from .runner import Settings, Step

BUDGETS_S = {"speedrun": 165, "vit_small": 105, "speedrun_lr2x": 40, "vit_small_lr2x": 40, "imagenet_stream": 60}
"""Each recipe's ``trainer.max_time`` on a GPU machine, in seconds (the speedrun's: ``SPEEDRUN_TIME``)."""
START_S = 15
"""Process start and imports (torch with CUDA, Lightning, ``vit.cli``): 8.4-9.7 CPU seconds measured, rounded up."""
DECODE_S = 15
"""The first recipe decodes CIFAR-10's 60,000 JPEGs (about 10 s on 16 cores); the next ones read the cache (~1 s)."""
COMPILE_S = 90
"""``torch.compile`` of the speedrun's training and evaluation graphs: a call whose 80-s speedrun had 170 s ran out."""
END_S = 20
"""The final validation, the explanation callbacks' pass over the validation set, the checkpoint and the test."""
RECIPE_LIMITS = {
    "speedrun": BUDGETS_S["speedrun"] + START_S + DECODE_S + COMPILE_S + END_S,  # 305
    "vit_small": BUDGETS_S["vit_small"] + START_S + END_S,  # 140
    "speedrun_lr2x": BUDGETS_S["speedrun_lr2x"] + START_S + COMPILE_S,  # 145: no validation, no test
    "vit_small_lr2x": BUDGETS_S["vit_small_lr2x"] + START_S,  # 55
    "imagenet_stream": BUDGETS_S["imagenet_stream"] + START_S + END_S,  # 95: nvJPEG and LitData set up
}
BENCH_LIMITS = {  # each suite's time on an H200 in earlier calls, with room for start-up
    "model_eager": 55, "attention": 90, "attribution": 35, "methods": 60, "data": 30, "linear_attention": 45,
    "map_head": 40, "gpu_decode": 40, "model_compiled": 400,
}  # fmt: skip
FIRST_RECIPES = RECIPE_LIMITS["speedrun"] + RECIPE_LIMITS["vit_small"]
"""What the setup steps keep back: the two recipes whose accuracy users read first always get their whole limit."""
LIMITS: dict[str, tuple[int, int]] = {
    "environment": (30, FIRST_RECIPES),
    "cifar_data": (30, FIRST_RECIPES),
    "speedrun": (RECIPE_LIMITS["speedrun"], RECIPE_LIMITS["vit_small"]),
    **{name: (RECIPE_LIMITS[name], 0) for name in ("vit_small", "speedrun_lr2x", "vit_small_lr2x")},
    "prepare_shards": (45, RECIPE_LIMITS["imagenet_stream"]),
    "imagenet_stream": (RECIPE_LIMITS["imagenet_stream"], 0),
    **{  # each benchmark keeps back the limits of those after it, but the compiled suite's, which takes the rest
        name: (limit, sum(list(BENCH_LIMITS.values())[i + 1 : -1]))
        for i, (name, limit) in enumerate(BENCH_LIMITS.items())
    },
}
"""Step name -> (its own limit, the seconds it keeps back for the steps after it), on a GPU machine: a recipe's limit
is its budget plus what it spends outside it (:data:`START_S`, :data:`DECODE_S`, :data:`COMPILE_S`, :data:`END_S`;
``docs/performance.md`` has the measurements). The recipes run in order of priority: the speedrun and ``vit_small``
always get their whole limits, the others what is left of the budget."""

RECIPE_NEEDS = ("lightning", "timm", "torchmetrics", "albumentations", "jsonargparse", "cv2", "simplejpeg", "vit.cli")
STREAM_NEEDS = (*RECIPE_NEEDS, "litdata", "vit.data.streaming", "sklearn")
BENCH_NEEDS = ("timm", "vit.models", "vit.layers")
TINY = '{"depth": 2, "embed_dim": 64, "num_heads": 2}'
TINY_32 = '{"depth": 2, "embed_dim": 32, "num_heads": 2}'
NO_EXTRAS = "--trainer.limit_val_batches 0 --trainer.num_sanity_val_steps 0 --trainer.callbacks '[]'"


@dataclass(frozen=True)
class Sizes:
    """The arguments that differ between a GPU run and a dry run (each a tuple of command-line words)."""

    bench: tuple[str, ...]
    models: tuple[str, ...]
    map_models: tuple[str, ...]
    attention: tuple[str, ...]
    linear: tuple[str, ...]
    data: tuple[str, ...]
    attribution: tuple[str, ...]
    methods: tuple[str, ...]
    fit: tuple[str, ...]  # added to every recipe
    speedrun: tuple[str, ...]
    vit_small: tuple[str, ...]
    lr2x: tuple[str, ...]
    photos: tuple[str, ...]  # classes, photographs per class, width
    imagenet: tuple[str, ...]


def words(line: str) -> tuple[str, ...]:
    """A command line's words, as the shell splits them."""
    return tuple(shlex.split(line))


GPU = Sizes(
    bench=words("--device cuda --precision bf16"),
    models=words("--models vit_small_patch16_224 vit_base_patch16_224 --batch_sizes 512 256"),
    map_models=words("--models vit_small_map_patch16_224 --batch_sizes 512"),
    attention=words("--window_sizes 7 8 --sliding_sizes 7 9"),  # grids 32..128 on CUDA
    linear=words("--window_sizes --sliding_sizes --linear_maps elu relu"),
    data=words("--data_images 100 --data_samples 150 --data_rounds 2"),  # this host's CPU cores
    attribution=words("cuda bf16 vit_base_patch16_224 64 {}"),
    methods=words("cuda vit_small_patch16_224 64 {}"),  # every explanation method, fp32, random weights
    fit=(),
    speedrun=words("--model.schedule time"),  # its --trainer.max_time: SPEEDRUN_TIME
    vit_small=words("--model.schedule time --trainer.max_time 00:00:01:45 --data.download false"),
    lr2x=words(f"--model.schedule steps --trainer.max_time 00:00:00:40 {NO_EXTRAS}"),  # the step schedules' ~40 s
    photos=words("10 128 500"),
    imagenet=words(f"--trainer.max_time 00:00:01:00 --data.decode_device cuda --data.num_workers 8 {NO_EXTRAS}"),
)
TINY_FIT = (
    "--trainer.accelerator cpu --trainer.devices 1 --trainer.precision 32-true --data.batch_size 8 "
    "--data.num_workers 0 --model.model vit_tiny_patch4_32 --model.model_overrides.depth 1 "
    "--model.model_overrides.embed_dim 32 --model.model_overrides.num_heads 2 --trainer.limit_test_batches 20"
)
# 20 of CIFAR-10's 1,250 validation batches of 8; no explanation callbacks (their last validation reads every image)
DRY_VALIDATION = "--trainer.limit_val_batches 20 --trainer.callbacks '[]'"
TINY_MODEL = f"--batch_sizes 4 --override '{TINY}' --rounds 2 --steps 1 --warmup 1"
TINY_ATTENTION = "--attn_grids 8 12 --attn_dim 64 --attn_heads 2 --attn_tokens 512 --attn_reps 2"
DRY = Sizes(
    bench=words("--device cpu --precision fp32 --threads 1"),
    models=words(f"--models vit_tiny_patch4_32 {TINY_MODEL}"),
    map_models=words(f"--models vit_tiny_map_patch4_32 {TINY_MODEL}"),
    attention=words(f"{TINY_ATTENTION} --window_sizes 4 --sliding_sizes 3"),
    linear=words(f"{TINY_ATTENTION} --window_sizes --sliding_sizes --linear_maps elu"),
    data=words("--data_images 3 --data_samples 4 --data_rounds 1 --jpeg_size 96 128"),
    attribution=words(f"cpu fp32 vit_tiny_patch4_32 4 '{TINY_32}'"),
    methods=words(f"cpu vit_tiny_patch4_32 4 '{TINY_32}'"),
    fit=words(TINY_FIT),
    speedrun=words(f"--model.schedule time --model.compile false {DRY_VALIDATION}"),
    vit_small=words(f"--model.schedule time --trainer.max_time 00:00:00:15 --data.download false {DRY_VALIDATION}"),
    lr2x=words(f"--model.schedule steps --trainer.max_time 00:00:00:10 {NO_EXTRAS} --model.compile false"),
    photos=words("2 8 64"),
    imagenet=words(f"--trainer.max_time 00:00:00:10 {NO_EXTRAS} --data.img_size 32"),
)


def plan_steps(settings: Settings, scratch: Path) -> list[Step]:
    """Every step of the check in its order (the ``wheels`` and ``modules`` steps come before these).

    Args:
        settings: The check's settings (a dry run takes :data:`DRY`, else :data:`GPU`).
        scratch: A folder for checkpoints and extracted data, removed after the check.
    """
    sizes = DRY if settings.dry else GPU
    program = (settings.python, "-m", "vit.bench.gpu_check.programs")
    cifar, photos, shards = (str(scratch / name) for name in ("cifar10", "photos", "shards"))

    def step(name: str, *command: str, needs: tuple[str, ...] = (), requires: tuple[str, ...] = ()) -> Step:
        return Step(name, *LIMITS[name], command=command, needs=needs, requires=requires)

    def report(name: str) -> str:
        return str(settings.out / f"{name}.json")

    def suite(name: str, suite: str, *args: str, needs: tuple[str, ...] = ()) -> Step:
        """``python -m vit.bench --suite SUITE``, its report in ``NAME.json``."""
        bench = sizes.bench if suite != "data" else ()  # the data suite: this host's CPU, its own defaults
        command = (settings.python, "-m", "vit.bench", *bench, "--suite", suite, *args, "--json", report(name))
        return step(name, *command, needs=(*BENCH_NEEDS, *needs))

    def fit(name: str, config: str, *args: str, test: bool = False, lr_scale: float = 1.0, stream: bool = False):
        """A recipe: ``configs/CONFIG.yaml`` on the CIFAR-10 JPEGs (or the photographs' shards), then its test."""
        data = ("streaming", shards, "prepare_shards") if stream else ("imagefolder", cifar, "cifar_data")
        command = (*program, "fit", *(("--test",) if test else ()), "--lr-scale", str(lr_scale), report(name),
                   str(scratch / name), "--", "--config", f"configs/{config}.yaml",
                   "--data.dataset", data[0], "--data.data_dir", data[1], *args, *sizes.fit)  # fmt: skip
        return step(name, *command, needs=STREAM_NEEDS if stream else RECIPE_NEEDS, requires=(data[2],))

    decoded = ("--data.decode_once", "true")
    speedrun_time = "00:00:00:20" if settings.dry else settings.speedrun_time
    steps = [
        step("environment", *program, "environment", report("environment")),
        step("cifar_data", *program, "cifar", str(settings.cifar_tar), cifar, *(("--tiny",) if settings.dry else ())),
        fit("speedrun", "cifar10_speedrun", *decoded, *sizes.speedrun, "--trainer.max_time", speedrun_time, test=True),
        fit("vit_small", "vit_small", *decoded, *sizes.vit_small, test=True),
        fit("speedrun_lr2x", "cifar10_speedrun", *decoded, *sizes.lr2x, "--trainer.max_epochs", "100", lr_scale=2),
        fit("vit_small_lr2x", "vit_small", *decoded, *sizes.lr2x, lr_scale=2),
        step("prepare_shards", *program, "shards", photos, shards, *sizes.photos, "--workers", "8", needs=STREAM_NEEDS),
        fit("imagenet_stream", "vit_small_imagenet", *sizes.imagenet, stream=True),
        suite("model_eager", "model", *sizes.models),
        suite("attention", "attention", *sizes.attention, needs=("vit.layers.neighborhood_attention",)),
        step(
            "attribution",
            *program,
            "attribution",
            report("attribution"),
            *sizes.attribution,
            needs=(*BENCH_NEEDS, "vit.explain.attribution"),
        ),  # fmt: skip
        step(
            "methods",
            *program,
            "methods",
            report("methods"),
            *sizes.methods,
            needs=(*BENCH_NEEDS, "vit.explain.methods"),
        ),  # fmt: skip
        suite("data", "data", *sizes.data, needs=("albumentations", "cv2", "simplejpeg", "vit.data.transforms")),
        suite("linear_attention", "attention", *sizes.linear, needs=("vit.layers.linear_attention",)),
        suite("map_head", "model", *sizes.map_models, needs=("vit.layers.cross_attention",)),
        step("gpu_decode", *program, "gpu_decode", report("gpu_decode"), needs=("cv2", "vit.data.jpeg")),
        suite("model_compiled", "model", *sizes.models, "--compile"),
    ]
    if settings.dry:  # nvJPEG needs CUDA
        steps = [s for s in steps if s.name != "gpu_decode"]
    return steps


def wheels_step(settings: Settings) -> Step | None:
    """``pip install --no-index --no-deps`` of every wheel in ``WHEELS`` (nothing is fetched); ``None`` without any."""
    wheels = sorted(str(path) for path in settings.wheels.glob("*.whl")) if settings.wheels.is_dir() else []
    if not wheels:
        return None
    pip = ("-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir")
    return Step("wheels", 40, FIRST_RECIPES, (settings.python, *pip, *wheels))


def needed_modules(steps: list[Step]) -> list[str]:
    """Every module some step needs, each once, in the order they are first named."""
    return list(dict.fromkeys(name for step in steps for name in step.needs))
