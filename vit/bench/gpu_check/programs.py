"""The programs the GPU check's steps run, each in a process of its own:
``python -m vit.bench.gpu_check.programs NAME ...`` (``--help`` lists them).

Each imports what it needs inside its function (``environment`` and ``modules`` must answer where only torch is),
writes its JSON when it ends and prints the ``RESULT``/``PASS``/``FAIL`` lines that the summary collects.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from importlib import import_module
from pathlib import Path
from typing import Any

from vit.atomic import write_text
from vit.errors import ArgumentParser

START = time.perf_counter()  # the program's first moment after the interpreter and this module


def since_start() -> float:
    return round(time.perf_counter() - START, 2)


def write_json(path: str | Path, result: dict[str, Any]) -> None:
    write_text(path, json.dumps(result, indent=2, default=str) + "\n")


def environment(out: str) -> None:
    """GPU, driver and versions; ``nvidia-smi``'s table where there is one."""
    if shutil.which("nvidia-smi"):
        print(subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout)
    else:
        print("nvidia-smi: not available")
    import os
    import platform

    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cpu_count": os.cpu_count(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    for name in ("timm", "lightning", "albumentations", "jsonargparse", "wandb", "torchvision", "cv2", "litdata"):
        try:
            info[name] = import_module(name).__version__
        except Exception as err:  # noqa: BLE001 - report whatever is missing
            info[name] = f"missing ({type(err).__name__})"
    print(json.dumps(info, indent=2))
    write_json(out, info)


def modules(out: str, names: Sequence[str]) -> None:
    """Import every module in ``names``; the JSON maps each one that fails to why."""
    missing: dict[str, str] = {}
    for name in names:
        try:
            import_module(name)
        except Exception as err:  # noqa: BLE001 - name whatever is missing, whatever the reason
            missing[name] = f"{type(err).__name__}: {err}"
    print(
        f"RESULT  modules: {len(names) - len(missing)} of {len(names)} import"
        + "".join(f"; missing {name} ({why})" for name, why in missing.items())
    )
    write_json(out, {"checked": list(names), "missing": missing, "seconds": since_start()})


def cifar(tar: str, dest: str, tiny: bool) -> None:
    """Extract the CIFAR-10 tarball (``train|test/<class>/*.jpg``) into ``dest``; with ``tiny`` and no tarball, write
    a small one of random JPEGs in the same layout first (a dry run without the real images)."""
    path, dest_path = Path(tar), Path(dest)
    if tiny and not path.is_file():
        import numpy as np
        from PIL import Image

        rng = np.random.default_rng(0)
        for split in ("train", "test"):
            for label in ("airplane", "cat"):
                (dest_path / split / label).mkdir(parents=True)
                for i in range(16):
                    pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                    Image.fromarray(pixels).save(dest_path / split / label / f"{i}.jpg")
        print(f"RESULT  cifar: {tar} not found; wrote 64 random 32x32 JPEGs instead")
        return
    if not path.is_file():
        sys.exit(f"error: {tar} not found: copy the CIFAR-10 JPEGs (train|test/<class>/*.jpg) there or set CIFAR_TAR")
    dest_path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["tar", "-xzf", str(path), "-C", str(dest_path)], check=True
    )  # 2 s for CIFAR-10 where tarfile takes 50
    count = sum(1 for _ in dest_path.rglob("*.jpg"))
    print(f"RESULT  cifar: {count} JPEGs extracted from {tar} in {since_start():.1f} s")


def fit(out: str, root: str, test: bool, lr_scale: float, args: Sequence[str]) -> None:
    """Fit a config (LightningCLI arguments ``args``), test its final weights with ``test``; write the JSON: the
    arguments, the validation curve, what the time budget bought, wall times, img/s, test accuracy, and the phases
    (:class:`~vit.bench.gpu_check.phases.Phases`) that show the time spent outside the budget."""
    args = list(args)
    if lr_scale != 1.0:
        args += ["--model.lr", str(config_lr(args) * lr_scale)]
    imports = time.perf_counter()
    import torch

    from vit.callbacks import RunSummary, TimeBudget, training_throughput
    from vit.cli import cli_main

    from .phases import Phases

    args = [
        "fit",
        *args,
        "--trainer.logger",
        "false",
        "--trainer.default_root_dir",
        root,
        "--trainer.callbacks+=vit.bench.gpu_check.phases.Phases",
    ]
    phases: dict[str, Any] = {"imports_s": round(time.perf_counter() - imports, 2), "fit_start_s": since_start()}
    start = time.perf_counter()
    name = Path(out).stem
    try:
        cli = cli_main(args)
    except SystemExit as stop:  # a refused config, a non-finite stop or SIGTERM at the limit: the JSON says so
        write_json(
            out,
            {"args": args, "exit": stop.code, "fit_wall_s": time.perf_counter() - start, "process_s": since_start()},
        )
        print(f"RESULT  {name}: exit {stop.code} after {time.perf_counter() - start:.0f} s")
        raise
    wall = time.perf_counter() - start
    trainer, module = cli.trainer, cli.model
    clock = next(cb for cb in trainer.callbacks if isinstance(cb, Phases))
    summary = next((cb for cb in trainer.callbacks if isinstance(cb, RunSummary)), None)
    budget = next((cb for cb in trainer.callbacks if isinstance(cb, TimeBudget) and cb.budget), None)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    throughput = training_throughput(trainer)
    result: dict[str, Any] = {
        "args": args,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "fit_wall_s": wall,
        "global_step": trainer.global_step,
        "epochs_completed": trainer.current_epoch,
        "batch_size": cli.datamodule.batch_size,
        "precision": str(trainer.precision),
        "images_per_s": throughput if throughput == throughput else None,  # mean train/img_per_sec (nan: none)
        "images_per_s_incl_overheads": trainer.global_step * cli.datamodule.batch_size / wall,
        "budget": budget.summary(trainer) if budget else None,
        "val_curve": sorted(summary.val_acc.items()) if summary else None,  # [epoch, val/acc]
        "val_acc": metrics.get("val/acc"),
        "train_loss": metrics.get("train/loss_epoch"),
        "finite": all(v == v and abs(v) != float("inf") for v in metrics.values()),
    }
    if test:
        tested = trainer.test(module, datamodule=cli.datamodule, verbose=False, ckpt_path=None)
        result["test_acc"] = tested[0].get("test/acc") if tested else None
        result["total_wall_s"] = time.perf_counter() - start
    result["phases"] = {**phases, **clock.report(START), "process_s": since_start()}
    write_json(out, result)
    bought = f", {result['budget']['steps']} steps = {result['budget']['epochs']:.1f} epochs bought" if budget else ""
    tested = ""
    if test:
        accuracy = result["test_acc"] if result["test_acc"] is not None else float("nan")
        tested = f"test/acc {accuracy:.4f}, {result['total_wall_s']:.0f} s with the test, "
    print(
        f"RESULT  {name}: {tested}fit {wall:.0f} s, {result['images_per_s'] or 0:.0f} img/s, "
        f"val/acc {result['val_acc']}, {trainer.global_step} steps{bought}, finite {result['finite']}"
    )


def config_lr(args: Sequence[str]) -> float:
    """``model.lr`` of the ``--config`` file among ``args``."""
    import yaml

    config = args[list(args).index("--config") + 1]
    with open(config, encoding="utf-8") as f:
        return float(yaml.safe_load(f)["model"]["lr"])


def shards(src: str, dest: str, classes: int, per_class: int, size: int, workers: int) -> None:
    """Real photographs (crops of scikit-learn's two) as ``train|val/<wnid>/*.jpg`` in ``src``, then written as
    streaming shards into ``dest`` by ``vit data prepare``."""
    from vit.bench.photos import real_photos
    from vit.data.prepare import main as prepare

    root = Path(src)
    for split, count in (("train", per_class), ("val", max(2, per_class // 8))):
        for c in range(classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True)
            real_photos(folder, count, (size * 3 // 4, size), seed=c + (1000 if split == "val" else 0))
    photos = since_start()
    prepare(["--data.dataset", "imagefolder", "--data.data_dir", src, "--out", dest, "--workers", str(workers)])
    print(
        f"RESULT  prepare_shards: {classes} classes x {per_class} photos written in {photos:.0f} s, shards in "
        f"{since_start() - photos:.0f} s"
    )


def median_seconds(fn: Callable[[], Any], device: Any, reps: int = 3) -> tuple[float, Any]:
    """The median wall time of ``reps`` calls of ``fn`` (the device synchronised around each), and its last result."""
    from vit.bench.harness import synchronize

    times, result = [], None
    for _ in range(reps):
        synchronize(device)
        start = time.perf_counter()
        result = fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def tiny_model(device: str, name: str, batch: int, overrides: str) -> tuple[Any, Any, Any]:
    """A model of ``name`` with random weights (seed 0), in eval mode, and a batch of random images for it."""
    import torch

    from vit.models import create_model

    torch.manual_seed(0)
    dev = torch.device(device)
    model = create_model(name, **json.loads(overrides)).to(dev).eval()
    return dev, model, torch.randn(batch, 3, *model.patch_embed.img_size, device=dev)


def attribution(out: str, device: str, precision: str, name: str, batch: int, overrides: str) -> None:
    """Time :func:`vit.explain.attribution.attention_attribution` on one batch: a warm-up, then the median of 3."""
    import torch

    from vit.bench.harness import autocast
    from vit.explain.attribution import attention_attribution

    dev, model, images = tiny_model(device, name, batch, overrides)

    def call() -> Any:
        with autocast(dev, precision):
            return attention_attribution(model, images)

    call()  # warm-up
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds, maps = median_seconds(call, dev)
    with torch.inference_mode(), autocast(dev, precision):
        forward, _ = median_seconds(lambda: model(images), dev)
    result = {
        "model": name,
        "batch": batch,
        "precision": precision,
        "device": str(dev),
        "device_name": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "seconds_per_batch": seconds,
        "images_per_s": batch / seconds,
        "forward_seconds_per_batch": forward,
        "attribution_over_forward": seconds / forward,
        "map_shape": list(maps.shape),
        "finite": bool(torch.isfinite(maps).all()),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None,
    }
    print(json.dumps(result, indent=2))
    print(
        f"RESULT  attribution {name} batch {batch} {precision}: {seconds * 1e3:.0f} ms/batch, "
        f"{batch / seconds:.0f} img/s, {seconds / forward:.1f}x one forward pass, finite maps {result['finite']}"
    )
    write_json(out, result)


def methods(out: str, device: str, name: str, batch: int, overrides: str) -> None:
    """Time :func:`vit.explain.explain_map` for every method of ``vit.explain.METHODS`` on one batch, fp32 (a method
    whose extra is missing is reported as skipped); AttnLRP's cost over one attribution call (goal: at most 2x)."""
    import torch

    from vit.explain import METHODS, explain_map

    dev, model, images = tiny_model(device, name, batch, overrides)
    result: dict[str, Any] = {
        "model": name,
        "batch": batch,
        "precision": "fp32",
        "device": str(dev),
        "device_name": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "methods": {},
    }
    for method in METHODS:
        try:
            explain_map(model, images, method)  # warm-up (and the import of an optional extra)
        except ImportError as err:
            result["methods"][method] = {"skipped": str(err)}
            print(f"RESULT  method {method}: skipped ({err})")
            continue
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        seconds, explained = median_seconds(lambda method=method: explain_map(model, images, method), dev)
        finite = bool(torch.isfinite(explained.patches).all())
        result["methods"][method] = {
            "seconds_per_batch": seconds,
            "ms_per_image": 1e3 * seconds / batch,
            "finite": finite,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None,
        }
        print(
            f"RESULT  method {method} {name} batch {batch}: {seconds * 1e3:.0f} ms/batch, "
            f"{1e3 * seconds / batch:.2f} ms/img, finite {finite}"
        )
    timed = result["methods"]
    if "seconds_per_batch" in timed.get("attnlrp", {}) and "seconds_per_batch" in timed.get("attribution", {}):
        ratio = timed["attnlrp"]["seconds_per_batch"] / timed["attribution"]["seconds_per_batch"]
        result["attnlrp_over_attribution"] = ratio
        print(f"{'PASS' if ratio <= 2 else 'FAIL'}  AttnLRP costs {ratio:.2f}x one attribution call (goal <= 2x)")
    write_json(out, result)


def gpu_decode(out: str) -> None:
    """JPEG decode on the GPU (nvJPEG) + random-resized crop 224 + flip, batches of 256 real photographs."""
    import tempfile

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
    seconds = (time.perf_counter() - start) / n
    write_json(out, {"batch": 256, "images_per_s": 256 / seconds, "ms_per_batch": seconds * 1e3})
    print(
        f"RESULT  GPU JPEG decode + RRC 224 + flip (shards, batch 256): {256 / seconds:.0f} images/s, "
        f"{seconds * 1e3:.1f} ms per batch"
    )


def build_parser(prog: str = "python -m vit.bench.gpu_check.programs") -> argparse.ArgumentParser:
    """One subcommand per program, its positional arguments those of the function it runs."""
    parser = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="program", required=True)

    def program(run: Callable[..., None], *names: str, **options: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(run.__name__, help=" ".join((run.__doc__ or "").split("\n\n")[0].split()))
        p.set_defaults(run=run)
        for name in names:
            kind = int if name in ("batch", "classes", "per_class", "size") else str
            p.add_argument(name, type=kind)
        for name, default in options.items():
            p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
        return p

    program(environment, "out")
    program(modules, "out").add_argument("names", nargs="*")
    program(cifar, "tar", "dest").add_argument("--tiny", action="store_true")
    fitting = program(fit, "out", "root", lr_scale=1.0)
    fitting.add_argument("--test", action="store_true")
    fitting.add_argument("args", nargs=argparse.REMAINDER, help="LightningCLI's, after --")
    program(shards, "src", "dest", "classes", "per_class", "size", workers=1)
    program(attribution, "out", "device", "precision", "name", "batch", "overrides")
    program(methods, "out", "device", "name", "batch", "overrides")
    program(gpu_decode, "out")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = vars(build_parser().parse_args(argv))
    args.pop("program")
    if args.get("args", [None])[:1] == ["--"]:
        args["args"] = args["args"][1:]
    args.pop("run")(**args)


if __name__ == "__main__":
    main()
