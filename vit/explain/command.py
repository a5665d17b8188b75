"""``vit explain`` (``scripts/explain.py``): explain images with any registered method, measure which map to believe.

    vit explain CHECKPOINT IMAGE_OR_FOLDER [...] [--methods attnlrp,rollout,...] [--faithfulness] [--json out.json]
                [--html report.html] [--out explanations]
    vit explain CHECKPOINT --split val --limit 500 --methods rollout,attribution,attnlrp,ig --faithfulness
    vit explain --config quickstart --ckpt_path last my_digits/ --html report.html

CHECKPOINT (or ``--ckpt_path``) is a Lightning ``.ckpt`` written by ``vit fit``, a run folder, or ``last`` / ``best``
of the newest run of ``--config`` (model, image size, normalisation and class names come from it), or plain weights
(``.pth``/``.safetensors``, timm's included) with ``--model PRESET`` (ImageNet normalisation, ``--img_size``, class
indices as names). ``--methods`` takes names of ``vit.explain.METHODS``
(default: the method ``--tune`` chose for this checkpoint, stored beside it in ``<checkpoint>.explain.json``, else
AttnLRP, the map measured most faithful among those a plain install has). Per image and method it writes
``<out>/<name>_<method>.png`` (image | overlay with a colour bar, prediction in the caption) plus a grid per method,
and prints the predicted class and its probability (with ``--split val``, the true class, a mark on each mistake and
the accuracy; :mod:`~vit.explain.console`). ``--faithfulness`` measures every method by deletion and
insertion beside a random patch order (Petsiuk et al., "RISE", BMVC 2018) with 95 % bootstrap intervals and the
time per image (:func:`~vit.explain.benchmark_methods`), prints the table and writes it as JSON (``--json``, else
``<out>/faithfulness.json``) with the curves as ``<out>/faithfulness_curves.png``. Bad input (an unknown method, one
that does not apply to the model, a method whose optional extra is missing) is one ``error:`` line and exit status 2,
before anything is written; every file is written to a temporary name and renamed. Results go to stdout, progress to
stderr: a bar per method and phase (maps, curves, overlays) on a terminal, else a plain line every 10 s with the
count and the elapsed time, and one line per finished phase either way: loading (with the thread count:
``--threads``, by default the cores not already busy), predictions, each method's maps and curves, overlays, report.

The parser and the checks of the arguments need only the standard library: ``vit explain --help`` and a bad option
answer at once; torch and the model load when the work starts.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..checkpoints.naming import add_checkpoint_arguments, find_checkpoint
from ..errors import ArgumentParser, InputError, UsageError, VitError, add_switch, error_message, fail
from ..text import plural
from .arguments import explorer_bits, find_images, new_folder, pixel_limit
from .choice import choice_path, stored_choice, stored_line
from .progress import stop_all

MAX_IMAGE_PIXELS = 50_000_000
"""``--max_image_pixels``' default: the limit of ``vit predict`` (:data:`vit.data.datasets.MAX_IMAGE_PIXELS`)."""
LEGACY_METHODS = {"rollout": ["rollout"], "attribution": ["attribution"], "both": ["rollout", "attribution"]}
"""``--method``, the option before ``--methods``: kept as an alias for scripts written against it."""
METHOD_NAMES = ("rollout", "attribution", "attnlrp", "cp_lrp", "ig", "gradcam", "gradxinput", "attention")
"""The names of :data:`vit.explain.METHODS`, for the help text without importing the registry (a test keeps them
equal)."""
METHOD_ALIASES = {"cp": "cp_lrp", "chefer": "attribution", "integrated_gradients": "ig", "grad_cam": "gradcam"}
"""The aliases of :data:`vit.explain.methods.ALIASES` (a test keeps them equal)."""
DEFAULT_METHOD = "attnlrp"
""":data:`vit.explain.DEFAULT_METHOD`, for the help text (a test keeps them equal)."""
REMOVALS = ("mean", "blur", "road", "drop")
"""The removals of :data:`vit.explain.removal.REMOVALS` (a test keeps them equal)."""
TUNE_REMOVALS = ("mean", "road", "drop")
"""What ``--tune`` averages the SRG over without ``--removal`` (drop left out, in one line, where it cannot run)."""
HEAD_FUSIONS = ("mean", "max", "min")
"""The choices of :data:`vit.explain.HeadFusion` (a test keeps them equal)."""


def parse_methods(methods: str | None, legacy: str | None = None) -> list[str]:
    """The methods asked for (``--methods``, or the older ``--method``), registry names in order, each with the
    packages it needs: checked before the checkpoint is read.

    Raises:
        UsageError: On an unknown name, both options at once, or a method whose optional extra is missing.
    """
    if legacy is not None and methods is not None:
        raise UsageError("give --methods or --method, not both (--method is the older name)")
    if legacy is not None:
        return LEGACY_METHODS[legacy]
    names: list[str] = []
    for name in (methods or DEFAULT_METHOD).split(","):
        name = name.strip()
        if name and name not in METHOD_NAMES and name not in METHOD_ALIASES:
            raise UsageError(f"--methods: unknown method {name!r}: choose from {', '.join(METHOD_NAMES)}")
        if name and METHOD_ALIASES.get(name, name) not in names:
            names.append(METHOD_ALIASES.get(name, name))
    if not names:
        raise UsageError(f"--methods is empty: name one or more of {', '.join(METHOD_NAMES)}")
    return names


def require_method_extras(names: Sequence[str]) -> None:
    """Import what each method needs from the ``explain`` extra.

    Raises:
        UsageError: Naming the method and the install command when a package is missing.
    """
    from .loading import first_line
    from .methods import require_extras

    for name in names:
        try:
            require_extras(name)
        except ImportError as err:
            raise UsageError(f"--methods {name}: {first_line(err)}") from None


def check_options(explainer, *, target: str | None, report_block: int, methods: Sequence[str]) -> int | None:
    """Check the options that depend on the model (before the images are read); returns ``--target``'s class.

    Raises:
        InputError: If ``--target`` or ``--report_block`` does not exist in the model.
        UsageError: If a method does not apply to the model (naming those that do).
    """
    from .loading import parse_target
    from .methods import get_method
    from .pipeline import block_index

    chosen = parse_target(target, explainer)
    try:
        block_index(explainer.model, report_block)
    except ValueError as err:
        raise InputError(f"--report_{err}") from None
    for name in methods:
        try:
            get_method(name, explainer.model)
        except ValueError as err:
            raise UsageError(f"--methods: {err}") from None
    return chosen


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command's options (``scripts/explain.py``)."""
    parser = ArgumentParser(prog=prog or "vit explain", doc=__doc__, renamed={"--no-overlays": "--overlays false"})
    parser.add_argument("inputs", nargs="*", metavar="[CHECKPOINT] IMAGES", help="the checkpoint (unless --ckpt_path "
                        "names it), then image files and/or folders (searched recursively)")  # fmt: skip
    add_checkpoint_arguments(parser, required=False)
    parser.add_argument("--split", choices=("val",), default=None, help="explain the run's validation split instead")
    parser.add_argument("--limit", type=int, default=None, help="with --split: N images evenly spaced over the split")
    parser.add_argument("--model", default=None, help="preset name for plain weights (.pth/.safetensors)")
    parser.add_argument("--img_size", type=int, default=None, help="input size for plain weights (default: preset's)")
    parser.add_argument(
        "--methods", default=None, help=f"comma-separated methods of vit.explain.METHODS ({', '.join(METHOD_NAMES)}); "
        f"default: the one --tune chose for this checkpoint (<checkpoint>.explain.json), else {DEFAULT_METHOD}",
    )  # fmt: skip
    parser.add_argument("--method", choices=tuple(LEGACY_METHODS), default=None, help="older name: --methods rollout, "
                        "attribution or rollout,attribution (both)")  # fmt: skip
    parser.add_argument("--target", default=None, help="class (index or name) to attribute; default: the prediction")
    parser.add_argument(
        "--out", type=Path, default=None, help="overlay folder (default: a new explanations/<checkpoint>-<time>)"
    )
    parser.add_argument(
        "--faithfulness", action="store_true", help="measure every method: deletion / insertion beside random, time"
    )
    parser.add_argument(
        "--sanity", action="store_true", help="randomise the weights from the top block down and compare each method's "
        "maps with the trained model's (Spearman, SSIM; an insensitive method is flagged): <out>/sanity.json",
    )  # fmt: skip
    parser.add_argument(
        "--heads", action="store_true", help="mean-ablate every head: the drop of the target logit and of accuracy "
        "per block and head, most important first: <out>/heads.json",
    )  # fmt: skip
    parser.add_argument(
        "--tune", action="store_true", help="choose the method (among --methods, default: the cheap ones of "
        "vit.explain.tuning.CANDIDATES) and the gamma rule of attnlrp / cp_lrp for this model by the SRG of their "
        "maps of held-out validation images (never the ones explained), averaged over --removal's removals (default: "
        "mean, road, drop); store the choice beside the checkpoint in <checkpoint>.explain.json (the checkpoint is "
        "not changed) and explain with it: <out>/tuning.json",
    )  # fmt: skip
    parser.add_argument(
        "--tune_images", type=int, default=100, help="with --tune: held-out validation images measured (default: 100)"
    )
    parser.add_argument("--mistakes", type=int, default=16, help="with --split val: the N most confident errors, "
                        "maps of predicted and true class: <out>/mistakes.png, the report; 0: none "
                        "(default: 16)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=16, help="perturbation steps of --faithfulness (default: 16)")
    parser.add_argument(
        "--removal", default=None, help="with --faithfulness: how a patch is removed, comma-separated, a table each: "
        f"{', '.join(REMOVALS)} (default: mean; drop is skipped, with a line saying why, on window or sliding blocks)",
    )  # fmt: skip
    parser.add_argument("--baseline", choices=("mean", "blur"), default=None, help="older name of --removal, one only")
    parser.add_argument(
        "--json", type=Path, default=None, help="--faithfulness JSON here (default: <out>/faithfulness.json)"
    )
    parser.add_argument("--html", type=Path, default=None, help="write a self-contained HTML report here")
    parser.add_argument("--report_block", type=int, default=-1, help="block whose per-head maps the report shows")
    parser.add_argument(
        "--explorer_bits",
        type=explorer_bits,
        choices=("auto", *range(2, 9)),
        metavar="{auto,2..8}",
        default="auto",
        help="bits per attention code in the report's explorer (default: auto, the finest of 6 to 3 that fits 4 MB)",
    )
    parser.add_argument("--head_fusion", choices=HEAD_FUSIONS, default="mean", help="rollout: fuse heads by")
    parser.add_argument("--discard_ratio", type=float, default=0.0, help="rollout: drop this fraction of weak links")
    parser.add_argument("--alpha", type=float, default=0.6, help="heatmap opacity in [0, 1]")
    parser.add_argument("--batch_size", type=int, default=64, help="images per forward pass (default: 64)")
    add_switch(parser, "--overlays", default=True, help="false: write no per-image PNGs (grids and report only)")
    parser.add_argument(
        "--max_image_pixels", type=pixel_limit, default=MAX_IMAGE_PIXELS, metavar="{N,none}",
        help="refuse image files whose header claims more pixels (width x height), before decoding them; none: no "
        "limit (default: 50000000, as vit predict's --data.max_image_pixels)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: the cores this process may use minus "
        "those other processes keep busy now, from /proc/stat over 0.25 s, at least 1: one thread per core, "
        "PyTorch's default, makes every parallel step wait for a core another process holds; measured 8x slower "
        "beside one busy process on 2 cores)",
    )  # fmt: skip
    return parser


def set_threads(requested: int | None) -> str:
    """Set torch's intra-op threads to ``requested``, or to :func:`~vit.env.default_threads` of this machine's cores
    and the cores other processes keep busy now; returns the words saying which, for the first progress line."""
    import torch

    from ..env import available_cores, busy_cores, default_threads

    cores, busy = available_cores(), busy_cores()
    threads = requested or default_threads(cores, busy)
    torch.set_num_threads(threads)
    how = "--threads" if requested else "the cores not busy with other processes; --threads N to choose"
    return f"{threads} thread{'s' * (threads > 1)} of {cores} cores, {busy:.1f} busy now ({how})"


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject option values that cannot work (argparse's usage error, exit 2); ``args.checkpoint`` is what
    ``--ckpt_path`` or the first positional argument names, ``args.images`` the rest."""
    if args.ckpt_path is None and not args.inputs:
        parser.error("name the checkpoint: --ckpt_path CKPT or CKPT first (a .ckpt, a run folder, last or best)")
    args.checkpoint = args.ckpt_path or args.inputs[0]
    args.images = args.inputs if args.ckpt_path else args.inputs[1:]
    if not 0.0 <= args.discard_ratio < 1.0:
        parser.error(f"--discard_ratio must be in [0, 1), got {args.discard_ratio}")
    if not 0.0 <= args.alpha <= 1.0:
        parser.error(f"--alpha must be in [0, 1], got {args.alpha}")
    if args.removal is not None and args.baseline is not None:
        parser.error("give --removal or --baseline, not both (--baseline is the older name)")
    removals = [r.strip() for r in (args.removal or args.baseline or "mean").split(",") if r.strip()]
    unknown = [r for r in removals if r not in REMOVALS]
    if unknown or not removals or len(set(removals)) != len(removals):
        parser.error(f"--removal takes distinct names of {', '.join(REMOVALS)}, got {args.removal!r}")
    if args.removal is not None and not (args.faithfulness or args.tune):
        parser.error("--removal chooses how --faithfulness or --tune removes a patch: add one of them")
    if args.tune_images < 1:
        parser.error(f"--tune_images must be positive, got {args.tune_images}")
    if args.mistakes < 0:
        parser.error(f"--mistakes must be 0 or more, got {args.mistakes}")
    args.removals = removals
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch_size must be positive")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be positive, got {args.threads}")
    if bool(args.images) == bool(args.split):
        parser.error("give image files or folders, or --split val (not both)")
    if args.json is not None and not args.faithfulness:
        parser.error("--json writes the faithfulness benchmark: add --faithfulness")
    for option, path in (("--json", args.json), ("--html", args.html)):
        if path is not None and path.is_dir():
            parser.error(f"{option} {path} is a folder: give a file name")


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run the command; returns 0.

    Raises:
        SystemExit: On bad input, after one ``error:`` line on stderr (:func:`vit.errors.fail`, the progress bars
            closed first), with the error's exit status (2).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    stem = Path(args.checkpoint).stem
    out = args.out or new_folder(Path("explanations") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    start = time.perf_counter()
    try:
        methods = parse_methods(args.methods, args.method)
        files = find_images(args.images) if args.images else []
        args.checkpoint = Path(find_checkpoint(args.checkpoint, config=args.config, runs_dir=args.runs_dir))
        named = args.methods is not None or args.method is not None
        methods, options = (methods, {}) if args.tune else stored_choice(args.checkpoint, methods, named)
        require_method_extras(methods)
        command = f"{parser.prog} {shlex.join(argv)}"
        explanation, files, tuning, mistakes = run(args, methods, files, out, command, options, named)
    except VitError as err:
        stop_all()
        fail(error_message(err), err.exit_status)
    except OSError as err:  # an unwritable --out, --json or --html
        stop_all()
        fail(f"cannot write the outputs: {err}")
    finally:
        stop_all()
    from .console import measurement_text, prediction_lines

    print("\n".join(prediction_lines(explanation, files)))
    tables, measured = measurement_text(explanation, out, args.json)
    if tables:
        print(tables)
    written = [f"{'overlays' if args.overlays else 'grids'} of {', '.join(methods)} in {out}/", *measured]
    for gamma in explanation.tuning.values():
        print(f"\n{gamma.method}'s gamma rule, by SRG on {gamma.num_images} held-out validation images "
              f"({', '.join(gamma.removals)}):\n{gamma.table()}")  # fmt: skip
        print(f"chosen: gamma {gamma.gamma:g}, embed_gamma {gamma.embed_gamma:g}")
    if tuning is not None:
        print(f"\nthe method, by mean SRG on {tuning.num_images} held-out validation images "
              f"({', '.join(tuning.removals)}):\n{tuning.table()}")  # fmt: skip
        print(stored_line(args.checkpoint, tuning.method, tuning.options))
        written += [f"tuning {out / 'tuning.json'}", f"choice {choice_path(args.checkpoint)}"]
    written += [f"mistakes {out / 'mistakes.png'}"] if mistakes is not None and len(mistakes) else []
    written += [f"report {args.html}"] if args.html else []
    seconds = time.perf_counter() - start
    print(f"explained {plural(len(files), 'image')} in {seconds:.1f} s: {', '.join(written)}", file=sys.stderr)
    return 0


def run(
    args: argparse.Namespace, methods: list[str], files: list[Path], out: Path, command: str, options: dict, named: bool
):
    """Load, (tune,) explain and write, with progress on stderr; returns the explanation, the files explained (those
    of ``--split val`` when it was given), the method tuning of ``--tune`` (or ``None``) and the mistakes (or
    ``None``)."""
    from .estimate import estimated
    from .loading import load_explainer, load_images, load_split
    from .mistakes import worst_mistakes
    from .outputs import benchmark_report, report_header, write_outputs
    from .pipeline import explain
    from .progress import Progress

    long = ", ".join(f"--{option}" for option in ("faithfulness", "sanity", "heads") if getattr(args, option))
    explain = estimated(explain, long)  # the time of the first images, scaled to all, said before the run

    threads = set_threads(args.threads)
    progress = Progress("load", args.limit or len(files), enabled=True)
    explainer = load_explainer(args.checkpoint, args.model, args.img_size)
    target = check_options(explainer, target=args.target, report_block=args.report_block, methods=methods)
    labels = None
    if args.split:
        files, pixels, labels = load_split(explainer, args.limit)
    else:
        pixels = load_images(explainer, files, args.max_image_pixels)
    progress.close(f"checkpoint and {plural(len(files), 'image')} in {progress.seconds:.1f} s; {threads}")
    removals = removals_for(explainer.model, args.removals)  # without --removal: mean, which every model has
    tuning = tune(explainer, methods if named else None, args, removals if args.removal else TUNE_REMOVALS, command)
    if tuning is not None:
        methods = methods if named else [tuning.method]
        options = {name: value for name, value in tuning.options.items() if name in methods}
    explanation = explain(
        explainer.model, pixels, methods, mean=explainer.mean, std=explainer.std, labels=labels,
        class_names=explainer.class_names, target=target, block=args.report_block, faithfulness=args.faithfulness,
        steps=args.steps, removals=removals if args.faithfulness else ("mean",), batch_size=args.batch_size,
        head_fusion=args.head_fusion, discard_ratio=args.discard_ratio, sanity=args.sanity, heads=args.heads,
        options=options, show_progress=True,
    )  # fmt: skip
    explanation.tuning = {} if tuning is None else tuning.gamma
    mistakes = None if labels is None or not args.mistakes else worst_mistakes(
        explainer.model, pixels, labels, num=args.mistakes, method=methods[0], options=options.get(methods[0]),
        mean=explainer.mean, std=explainer.std, class_names=explainer.class_names, probs=explanation.probs,
    )  # fmt: skip
    model = explainer.model_name or type(explainer.model).__name__
    images = f"--split val, {plural(len(files), 'image')}" if args.split else plural(len(files), "image file")
    header = report_header(model=model, checkpoint=args.checkpoint, images=images, methods=methods, command=command)
    if options:
        header["options"] = options
    report = None if explanation.benchmark is None else benchmark_report(explanation.benchmarks, header)
    extra = {"sanity.json": explanation.sanity, "heads.json": explanation.heads}
    measured = {name: {**header, **value.to_dict()} for name, value in extra.items() if value is not None}
    if tuning is not None:
        measured["tuning.json"] = {**header, **{name: value.to_dict() for name, value in tuning.gamma.items()}}
        measured["method.json"] = {**header, **tuning.to_dict()}
    if mistakes is not None:
        measured["mistakes.json"] = {**header, **mistakes.to_dict([str(f) for f in files])}
    write_outputs(
        explanation, files=files, out=out, alpha=args.alpha, overlays=args.overlays, json_path=args.json,
        curves_title=f"{model}: {images}", report=report, measured=measured, html_path=args.html,
        html_title=f"{args.checkpoint.name}: {plural(len(files), 'image')}", model=explainer.model, pixels=pixels,
        mean=explainer.mean, std=explainer.std, bits=args.explorer_bits, mistakes=mistakes,
    )  # fmt: skip
    return explanation, files, tuning, mistakes


def tune(explainer, methods: Sequence[str] | None, args: argparse.Namespace, removals: Sequence[str], command: str):
    """``--tune``: :func:`~vit.explain.tune_method` among ``methods`` (``None``: the cheap candidates) on
    ``--tune_images`` validation images that are not among those explained (by index, with ``--split val``), evenly
    spaced over the rest of the split, the choice stored beside the checkpoint; ``None`` without ``--tune``.

    Raises:
        InputError: Without a run checkpoint whose validation split can be read, or without held-out images left.
    """
    if not args.tune:
        return None
    from .choice import store_tuning
    from .loading import load_split, split_indices
    from .pipeline import model_inputs
    from .tuning import tune_method

    if explainer.data is None:
        raise InputError("--tune measures on the run's validation images: it needs a checkpoint of `vit fit` whose "
                         "data settings work here")  # fmt: skip
    _, pixels, labels = load_split(explainer)
    shown = set(split_indices(len(pixels), args.limit).tolist()) if args.split else set()
    rest = [i for i in range(len(pixels)) if i not in shown]
    if not rest:
        raise InputError("--tune needs validation images that are not explained: lower --limit")
    chosen = [rest[i] for i in split_indices(len(rest), min(args.tune_images, len(rest))).tolist()]
    images = model_inputs(explainer.model, pixels[chosen], explainer.mean, explainer.std)
    tuning = tune_method(explainer.model, images, labels[chosen], methods=methods, steps=args.steps,
                         removals=removals_for(explainer.model, removals), batch_size=args.batch_size,
                         show_progress=True)  # fmt: skip
    store_tuning(args.checkpoint, tuning, command)
    return tuning


def removals_for(model, removals: Sequence[str]) -> list[str]:
    """``removals`` less token drop when the model cannot drop tokens, said in one line on stderr.

    Raises:
        InputError: If token drop was the only removal asked for.
    """
    from .removal import drop_reason

    reason = drop_reason(model) if "drop" in removals else None
    if reason is None:
        return list(removals)
    kept = [r for r in removals if r != "drop"]
    if not kept:
        raise InputError(f"--removal drop does not apply to this model ({reason}): use mean or road")
    print(f"drop: skipped, this model cannot drop tokens ({reason}); {', '.join(kept)} measured", file=sys.stderr)
    return kept
