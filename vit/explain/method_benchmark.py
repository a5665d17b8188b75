"""Which map to believe: every explanation method measured by deletion and insertion on the same images.

Deletion and insertion (Petsiuk et al., "RISE", BMVC 2018), least-relevant-first and the symmetric relevance gain
(SRG, Blücher et al. 2024) from :func:`~vit.explain.faithfulness`, beside the random patch order, under one or more
ways of removing a patch (:mod:`vit.explain.removal`: mean, blur, ROAD, token drop; :func:`benchmark_removals`);
95 % confidence intervals by the percentile bootstrap over images (Efron & Tibshirani, "An Introduction to the
Bootstrap", 1993), paired with the random order for the ratios; and the time each method takes per image::

    bench = benchmark_methods(model, images, methods=["rollout", "attribution", "attnlrp"])
    bench.to_dict()  # JSON-serialisable
    bench.plot("curves.png")
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from time import perf_counter
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from ..atomic import write_bytes
from ..layers.utils import eval_mode
from ..text import plural
from .attribution import resolve_target
from .faithfulness import RANDOM, Baseline, faithfulness
from .methods import METHODS, check_image_size, explain_map, get_method, require_extras
from .progress import Progress
from .removal import check_removals

DEFAULT_METHODS: tuple[str, ...] = tuple(METHODS)


@dataclass
class MethodScore:
    """One method's (or the random order's) faithfulness over the benchmark's images.

    Attributes:
        deletion_auc: Mean area under the deletion curve (lower is better).
        insertion_auc: Mean area under the insertion curve (higher is better).
        deletion_ci: 95 % bootstrap interval of ``deletion_auc``.
        insertion_ci: 95 % bootstrap interval of ``insertion_auc``.
        deletion_ratio: ``deletion_auc`` over the random order's (below 1 beats random).
        insertion_ratio: ``insertion_auc`` over the random order's (above 1 beats random).
        deletion_ratio_ci: 95 % bootstrap interval of ``deletion_ratio`` (images resampled jointly with random).
        insertion_ratio_ci: Same for ``insertion_ratio``.
        seconds_per_image: Wall time of the map per image (``None`` for the random order).
        deletion_curve: Mean probability of the target at each fraction removed.
        insertion_curve: Mean probability at each fraction revealed.
        lerf_auc: Mean area under the least-relevant-first curve (higher is better).
        lerf_ci: 95 % bootstrap interval of ``lerf_auc``.
        lerf_ratio: ``lerf_auc`` over the random order's (above 1 beats random).
        lerf_ratio_ci: 95 % bootstrap interval of ``lerf_ratio``.
        srg: Symmetric relevance gain, ``lerf_auc - deletion_auc`` (higher is better; about 0 for random).
        srg_ci: 95 % bootstrap interval of ``srg``.
        lerf_curve: Mean probability at each fraction removed, least relevant first.
    """

    deletion_auc: float
    insertion_auc: float
    deletion_ci: tuple[float, float]
    insertion_ci: tuple[float, float]
    deletion_ratio: float
    insertion_ratio: float
    deletion_ratio_ci: tuple[float, float]
    insertion_ratio_ci: tuple[float, float]
    seconds_per_image: float | None
    deletion_curve: list[float] = field(repr=False)
    insertion_curve: list[float] = field(repr=False)
    lerf_auc: float = math.nan
    lerf_ci: tuple[float, float] = (math.nan, math.nan)
    lerf_ratio: float = math.nan
    lerf_ratio_ci: tuple[float, float] = (math.nan, math.nan)
    srg: float = math.nan
    srg_ci: tuple[float, float] = (math.nan, math.nan)
    lerf_curve: list[float] = field(default_factory=list, repr=False)


@dataclass
class MethodBenchmark:
    """The scores of every method and of the random order, and how they were measured.

    Attributes:
        scores: Method name to :class:`MethodScore`, ``"random"`` included.
        fractions: Fraction of patches removed at each curve point.
        num_images: Images measured.
        steps: Equal fractions of the curves.
        baseline: How a patch is removed (``"mean"``, ``"blur"``, ``"road"`` or ``"drop"``).
        num_random: Seeds averaged for the random order.
        bootstrap: Bootstrap resamples of the confidence intervals.
        seed: Seed of the bootstrap.
        target: ``"prediction"`` or ``"label"``: the class explained and measured.
        accuracy: Accuracy on these images when labels were given, else ``None``.
        maps: Method name to its ``(B, grid_h, grid_w)`` patch maps on the CPU, as measured (not in
            :meth:`to_dict`).
    """

    scores: dict[str, MethodScore]
    fractions: list[float]
    num_images: int
    steps: int
    baseline: str
    num_random: int
    bootstrap: int
    seed: int
    target: str
    accuracy: float | None = None
    maps: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dictionary (tuples become lists; the maps are left out)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("scores", "maps")}
        return {"scores": {name: asdict(score) for name, score in self.scores.items()}, **out}

    def table(self) -> str:
        """A plain-text table: AUCs with intervals, ratios to random, SRG, time per image."""
        header = (f"{'deletion (95% CI)':<24} {'x random':<8} {'insertion (95% CI)':<24} {'x random':<8} "
                  f"{'SRG (95% CI)':<26} ms/img")  # fmt: skip
        lines = [f"{'method':<12} {header}"]
        for name, s in self.scores.items():
            ms = "" if s.seconds_per_image is None else f"{1000 * s.seconds_per_image:.1f}"
            deletion = f"{s.deletion_auc:.3f} [{s.deletion_ci[0]:.3f}, {s.deletion_ci[1]:.3f}]"
            insertion = f"{s.insertion_auc:.3f} [{s.insertion_ci[0]:.3f}, {s.insertion_ci[1]:.3f}]"
            srg = f"{s.srg:+.3f} [{s.srg_ci[0]:+.3f}, {s.srg_ci[1]:+.3f}]"
            lines.append(f"{name:<12} {deletion:<24} {s.deletion_ratio:<8.2f} {insertion:<24} "
                         f"{s.insertion_ratio:<8.2f} {srg:<26} {ms}")  # fmt: skip
        return "\n".join(lines)

    def plot(self, path: str | Path, title: str | None = None) -> Path:
        """Deletion, least-relevant-first and insertion curves of every method (random dashed) as a PNG, written
        whole (:func:`vit.atomic.write_bytes`); returns the path."""
        return plot_benchmarks({self.baseline: self}, path, title)


CURVE_TITLES = {
    "deletion": ("deletion, most relevant first", "removed", "lower"),
    "lerf": ("deletion, least relevant first", "removed", "higher"),
    "insertion": ("insertion, most relevant first", "revealed", "higher"),
}


def plot_benchmarks(benchmarks: Mapping[str, MethodBenchmark], path: str | Path, title: str | None = None) -> Path:
    """The curves of every benchmark, a row per removal (deletion, least-relevant-first, insertion; random
    dashed), as one PNG written whole; returns the path."""
    import io

    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = len(benchmarks)
    fig, axes = plt.subplots(rows, 3, figsize=(14, 3.8 * rows), constrained_layout=True, squeeze=False)
    for row, (removal, bench) in zip(axes, benchmarks.items(), strict=True):
        for ax, (kind, (what, done, better)) in zip(row, CURVE_TITLES.items(), strict=True):
            for name, s in bench.scores.items():
                curve, auc = getattr(s, f"{kind}_curve"), getattr(s, f"{kind}_auc")
                if not curve:  # a score read back from a file written before this curve existed
                    continue
                style = dict(color="black", linestyle="--") if name == RANDOM else {}
                ax.plot(bench.fractions, curve, label=f"{name} ({auc:.3f})", **style)
            ax.set(xlabel=f"fraction of patches {done}", ylabel="probability of the target class",
                   title=f"{removal} · {what}\n(area: {better} is better)")  # fmt: skip
            ax.title.set_fontsize(10)
            ax.set_xlim(0, 1)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    first = next(iter(benchmarks.values()))
    fig.suptitle(title or f"{plural(first.num_images, 'image')}, {first.steps} steps")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    path = Path(path)
    write_bytes(path, buffer.getvalue())
    return path


def bootstrap_interval(
    values: np.ndarray, reference: np.ndarray | None, resamples: np.ndarray
) -> tuple[tuple[float, float], tuple[float, float] | None]:
    """95 % percentile intervals of the mean of ``values`` and of ``mean(values) / mean(reference)``.

    Args:
        values: Per-image values ``(B,)``.
        reference: Per-image values of the reference ``(B,)`` (resampled with the same images), or ``None``.
        resamples: ``(R, B)`` image indices, one bootstrap resample per row.
    """
    means = values[resamples].mean(axis=1)
    interval = tuple(float(q) for q in np.percentile(means, [2.5, 97.5]))
    if reference is None:
        return interval, None
    ratios = means / reference[resamples].mean(axis=1)
    return interval, tuple(float(q) for q in np.percentile(ratios, [2.5, 97.5]))


def benchmark_methods(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor | None = None,
    methods: Sequence[str] = DEFAULT_METHODS,
    baseline: Baseline = "mean",
    steps: int = 16,
    seed: int = 0,
    *,
    target: Literal["prediction", "label"] = "prediction",
    num_random: int = 5,
    bootstrap: int = 1000,
    batch_size: int = 32,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    show_progress: bool = False,
) -> MethodBenchmark:
    """Measure every method's deletion and insertion on ``images`` beside the random patch order.

    Each method explains the images in batches of ``batch_size`` (timed after one untimed warm-up image:
    ``seconds_per_image`` is the wall time over the number of images); :func:`~vit.explain.faithfulness` then draws
    the curves of all maps at once, in batches of ``batch_size`` too.

    Args:
        model: The classifier.
        images: ``(B, C, H, W)`` normalised as the model expects.
        labels: ``(B,)`` true classes, for ``accuracy`` and for ``target="label"``; optional.
        methods: Names in :data:`~vit.explain.METHODS`, checked against the model before anything runs.
        baseline: How a patch is removed: ``"mean"``, ``"blur"``, ``"road"`` or ``"drop"``
            (:mod:`vit.explain.removal`; :func:`benchmark_removals` measures several on the same maps).
        steps: Equal fractions of the curves.
        seed: Seed of the bootstrap resamples.
        target: Explain and measure the predicted class (``"prediction"``) or the label (``"label"``).
        num_random: Seeds of the random order.
        bootstrap: Bootstrap resamples.
        batch_size: Images per explanation call and per forward pass of the curves.
        options: Per-method options, e.g. ``{"ig": {"n_steps": 32}}``.
        show_progress: Report on stderr each method's maps, then the curves of each method and of the random order:
            a bar updated in place on a terminal, one line per finished phase
            (:class:`~vit.explain.progress.Progress`).

    Returns:
        A :class:`MethodBenchmark`.

    Raises:
        ValueError: On an unknown or inapplicable method, ``target="label"`` without labels, or bad settings.
        ImportError: If a chosen method needs the ``explain`` extra and it is missing (before anything runs).
    """
    return benchmark_removals(
        model, images, labels, methods, (baseline,), steps, seed, target=target, num_random=num_random,
        bootstrap=bootstrap, batch_size=batch_size, options=options, show_progress=show_progress,
    )[baseline]  # fmt: skip


def benchmark_removals(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor | None = None,
    methods: Sequence[str] = DEFAULT_METHODS,
    removals: Sequence[Baseline] = ("mean", "road", "drop"),
    steps: int = 16,
    seed: int = 0,
    *,
    target: Literal["prediction", "label"] = "prediction",
    num_random: int = 5,
    bootstrap: int = 1000,
    batch_size: int = 32,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    show_progress: bool = False,
) -> dict[str, MethodBenchmark]:
    """:func:`benchmark_methods` under each of ``removals``, the maps computed (and timed) once: removal name to its
    :class:`MethodBenchmark`, in the order given.

    Raises:
        ValueError: As :func:`benchmark_methods`, and on an unknown or repeated removal, or ``"drop"`` for a model
            that cannot drop tokens (:func:`~vit.explain.removal.drop_reason`), before anything runs.
    """
    names = [get_method(name, model).name for name in methods]  # fail before anything runs
    for name in names:
        require_extras(name)
        check_image_size(name, model, images)
    if len(set(names)) != len(names):
        raise ValueError(f"methods must be distinct, got {list(methods)}")
    check_removals(model, removals)
    if target not in ("prediction", "label"):
        raise ValueError(f"target must be 'prediction' or 'label', got {target!r}")
    if target == "label" and labels is None:
        raise ValueError("target='label' needs labels")
    if bootstrap < 1 or num_random < 1:
        raise ValueError(f"bootstrap and num_random must be >= 1, got {bootstrap} and {num_random}")
    param = next(model.parameters(), None)
    if param is not None:
        images = images.to(param.device)
    with eval_mode(model), torch.no_grad():
        logits = torch.cat([model.forward(chunk) for chunk in images.split(batch_size)])
    accuracy = None
    if labels is not None:
        labels = labels.to(logits.device)
        accuracy = float((logits.argmax(1) == labels).float().mean())
    classes = resolve_target(labels if target == "label" else None, logits)
    maps, seconds = timed_maps(model, images, classes, names, batch_size, options or {}, show_progress)
    kept = {name: value.cpu() for name, value in maps.items()}
    settings = dict(num_images=len(images), steps=steps, num_random=num_random, bootstrap=bootstrap, seed=seed,
                    target=target, accuracy=accuracy, maps=kept)  # fmt: skip
    benchmarks = {}
    for removal in removals:
        result = faithfulness(
            model, images, maps, target=classes, steps=steps, baseline=removal, num_random=num_random,
            batch_size=batch_size, show_progress=show_progress,
        )  # fmt: skip
        scores = _scores(result, [*names, RANDOM], seconds, seed, bootstrap)
        benchmarks[removal] = MethodBenchmark(scores=scores, fractions=result["fractions"], baseline=removal,
                                              **settings)  # fmt: skip
    return benchmarks


def _scores(
    result: Mapping[str, Any], names: Sequence[str], seconds: Mapping[str, float], seed: int, bootstrap: int
) -> dict[str, MethodScore]:
    """Each map's (and the random order's) areas, ratios to random, SRG and their bootstrap intervals, from the
    per-image areas of :func:`~vit.explain.faithfulness`."""
    per_image = {kind: {n: np.asarray(v) for n, v in result["per_image"][f"{kind}_auc"].items()}
                 for kind in ("deletion", "lerf", "insertion")}  # fmt: skip
    srg = {n: np.asarray(v) for n, v in result["per_image"]["srg"].items()}
    count = len(srg[RANDOM])
    resamples = np.random.default_rng(seed).integers(0, count, size=(bootstrap, count))
    scores = {}
    for name in names:
        fields: dict[str, Any] = {}
        for kind in ("deletion", "lerf", "insertion"):
            values, reference = per_image[kind][name], per_image[kind][RANDOM]
            interval, ratio_interval = bootstrap_interval(values, reference, resamples)
            fields[f"{kind}_auc"] = float(values.mean())
            fields[f"{kind}_ci"] = interval
            fields[f"{kind}_ratio"] = float(values.mean() / reference.mean())
            fields[f"{kind}_ratio_ci"] = ratio_interval
            fields[f"{kind}_curve"] = result[f"{kind}_curve"][name]
        fields["srg"], fields["srg_ci"] = float(srg[name].mean()), bootstrap_interval(srg[name], None, resamples)[0]
        scores[name] = MethodScore(seconds_per_image=seconds.get(name), **fields)
    return scores


def timed_maps(
    model: nn.Module,
    images: torch.Tensor,
    classes: torch.Tensor | None,
    names: Sequence[str],
    batch_size: int,
    options: Mapping[str, Mapping[str, Any]],
    show_progress: bool = False,
    warm_up: bool = True,
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Each method's patch maps of ``images`` (in chunks of ``batch_size``) and its seconds per image.

    ``classes`` are the ``(B,)`` classes explained, or ``None`` for each image's prediction. One untimed image first
    per method (unless ``warm_up`` is false: the maps without a fair time), so that no method pays for lazy imports,
    kernel selection or caches; on CUDA the timed region starts
    and ends synchronised, so it measures the computation, not its launch. With ``show_progress``, one
    :class:`~vit.explain.progress.Progress` per method (its bar updated between chunks).
    """
    cuda = images.is_cuda
    chunks = images.split(batch_size)
    targets = [None] * len(chunks) if classes is None else classes.split(batch_size)
    maps, seconds = {}, {}
    for name in names:
        kwargs = options.get(name, {})
        progress = Progress(name, len(images), show_progress)
        if warm_up:
            explain_map(model, images[:1], name, None if classes is None else classes[:1], **kwargs)
        if cuda:
            torch.cuda.synchronize(images.device)
        start = perf_counter()
        parts = []
        for chunk, t in zip(chunks, targets, strict=True):
            parts.append(explain_map(model, chunk, name, t, **kwargs).patches)
            progress.update(len(chunk))
        if cuda:
            torch.cuda.synchronize(images.device)
        seconds[name] = (perf_counter() - start) / len(images)
        maps[name] = torch.cat(parts).float()
        elapsed = seconds[name] * len(images)
        progress.close(f"maps of {plural(len(images), 'image')} in {elapsed:.1f} s ({1000 * seconds[name]:.1f} ms/img)")
    return maps, seconds
