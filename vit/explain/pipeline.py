"""The one explanation entry: :func:`explain` runs a model over images and returns an :class:`Explanation`.

Predictions, every block's attention and its statistics come from one eval-mode forward pass per batch
(:func:`~vit.explain.record_attention`); every map, attention rollout (Abnar & Zuidema, ACL 2020) included, comes
from the method registry (:func:`~vit.explain.explain_map`), and with ``faithfulness=True`` from the method benchmark
(:func:`~vit.explain.benchmark_methods`), which also measures them. Entropy and mean attention distance per head
follow Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021, Fig. 7). ``vit explain``, the training
callback, the explorer and the report all call :func:`explain`::

    explanation = explain(model, pixels, ["attnlrp", "rollout"], mean=mean, std=std, faithfulness=True)
    explanation.maps["attnlrp"], explanation.preds, explanation.entropy, explanation.benchmark.table()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..normalize import normalize
from ..text import plural
from .capture import eval_mode, record_attention
from .choice import stored_methods
from .explanation import Explanation, display_pixels
from .faithfulness import Baseline
from .methods import DEFAULT_METHOD, METHODS, get_method, require_extras
from .progress import Progress
from .rollout import HeadFusion, head_pool
from .stats import CollapseReport, attention_statistics, detect_collapse, row_entropy


def model_inputs(
    model: nn.Module, images: torch.Tensor, mean: Sequence[float] | None, std: Sequence[float] | None
) -> torch.Tensor:
    """``images`` as the model takes them, on its device and in its dtype: uint8 pixels normalised with ``mean`` /
    ``std`` (once, here), float images taken as already normalised.

    Raises:
        ValueError: If uint8 images come without ``mean`` / ``std``.
    """
    if not images.is_floating_point() and (mean is None or std is None):
        raise ValueError(f"{images.dtype} images need the mean and std to normalise them for the model")
    param = next(model.parameters(), None)
    inputs = images.to(param.device) if param is not None else images
    if not inputs.is_floating_point():
        inputs = normalize(inputs, mean, std)
    return inputs.to(param.dtype) if param is not None else inputs


def block_index(model: nn.Module, block: int) -> int:
    """``block`` as a non-negative index into ``model.blocks`` (``-1`` is the last).

    Raises:
        ValueError: If the model has no such block.
    """
    depth = len(model.blocks)
    index = block if block >= 0 else depth + block
    if not 0 <= index < depth:
        raise ValueError(f"block {block} out of range: the model has {depth} blocks")
    return index


def head_maps(attn: torch.Tensor, num_prefix_tokens: int, pooled_by_token: bool, grid: tuple[int, int]):
    """Per-head maps ``(B, heads, rows, cols)`` of one block: the class-token row, or the patch rows' mean."""
    P = num_prefix_tokens
    rows = attn[:, :, 0, P:] if pooled_by_token else attn[:, :, P:, P:].mean(dim=2)
    return rows.reshape(*rows.shape[:2], *grid)


@torch.no_grad()
def forward(
    model: nn.Module,
    images: torch.Tensor,
    *,
    labels: torch.Tensor | None,
    class_names: Sequence[str] | None,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    statistics: bool = True,
    block: int | None = None,
    keep_attentions: bool = True,
    uniform_threshold: float = 0.98,
    one_hot_threshold: float = 0.05,
    recorded: Mapping[str, Mapping[str, Any]] | None = None,
) -> Explanation:
    """One batch through the model, once, in eval mode without gradients: probabilities, every block's attention
    (recorded on the way by :func:`~vit.explain.record_attention`), the statistics, ``block``'s per-head maps and the
    maps of the methods in ``recorded`` (name -> options) that read the recorded attention
    (:attr:`Method.from_record <vit.explain.Method>`); :func:`explain` adds the others. The model is left as it was
    (``training`` flags, no hooks, no gradients)."""
    inputs = model_inputs(model, images, mean, std)
    with eval_mode(model), record_attention(model) as attentions:
        # ``forward`` rather than ``__call__``: after ``model.compile()`` the call is compiled, and the recording
        # hooks must run eagerly.
        logits = model.forward(inputs)
    probs = logits.float().softmax(dim=-1)
    entropy = distance = pool_entropy = None
    pool_attention = attentions.pool
    collapse: dict[int, CollapseReport] = {}
    if statistics:
        stats = attention_statistics(
            attentions, model.patch_embed.grid_size, model.patch_embed.patch_size, model.num_prefix_tokens
        )
        entropy, distance = stats["entropy"].cpu(), stats["distance"].cpu()
        collapse = {
            i: detect_collapse(attn, uniform_threshold=uniform_threshold, one_hot_threshold=one_hot_threshold)
            for i, attn in enumerate(attentions)
        }
        if pool_attention is not None:
            pool_entropy = row_entropy(pool_attention).mean(dim=(0, 2)).cpu()  # (heads,)
    maps = {name: METHODS[name].from_record(model, attentions, **options).float().cpu()
            for name, options in (recorded or {}).items()}  # fmt: skip
    heads = None
    if block is not None:
        pooled_by_token = head_pool(model, class_head=True) == "token"  # the class head's rows, for display
        grid = tuple(model.patch_embed.grid_size)
        heads = head_maps(attentions[block], model.num_prefix_tokens, pooled_by_token, grid).float().cpu()
    return Explanation(
        images=display_pixels(images, mean, std),
        labels=labels,
        probs=probs.cpu(),
        preds=probs.argmax(dim=-1).cpu(),
        attentions=[attn.float().cpu() for attn in attentions] if keep_attentions else [],
        entropy=entropy,
        distance=distance,
        collapse=collapse,
        class_names=list(class_names) if class_names is not None else None,
        pool_attention=pool_attention.float().cpu() if pool_attention is not None else None,
        pool_entropy=pool_entropy,
        maps=maps,
        head_maps=heads,
        block=block,
    )


def explain(
    model: nn.Module,
    images: torch.Tensor,
    methods: Sequence[str] | None = None,
    *,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    labels: torch.Tensor | Sequence[int] | None = None,
    class_names: Sequence[str] | None = None,
    target: int | None = None,
    statistics: bool = True,
    block: int | None = -1,
    keep_attentions: bool = False,
    faithfulness: bool = False,
    steps: int = 16,
    removals: Sequence[Baseline] = ("mean",),
    sanity: bool = False,
    heads: bool = False,
    batch_size: int = 64,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    uniform_threshold: float = 0.98,
    one_hot_threshold: float = 0.05,
    show_progress: bool = False,
    checkpoint: str | Path | None = None,
) -> Explanation:
    """Explain ``images`` with ``methods``: predictions, attention statistics, per-head maps, every method's maps
    and, with ``faithfulness``, how faithful each map is.

    Batches of ``batch_size`` go through the model once each (:func:`forward`); then every method's maps come from
    the registry (:func:`~vit.explain.explain_map`), or with ``faithfulness`` from
    :func:`~vit.explain.benchmark_methods`, which also times them and draws the deletion and insertion curves beside
    a random order. Gradients are taken even inside a caller's ``torch.no_grad()`` or inference mode (a validation
    loop); the model is left as it was.

    Args:
        model: A :class:`~vit.VisionTransformer` in any mode.
        images: ``(B, C, H, W)`` uint8 pixels (normalised here, once, with ``mean`` / ``std``) or float images
            already normalised as the model expects (un-normalised with ``mean`` / ``std`` for display, stretched to
            ``[0, 1]`` without them).
        methods: Names of :data:`~vit.explain.METHODS` (or aliases), in the order :attr:`Explanation.maps` keeps;
            ``None``: the method ``vit explain --tune`` stored beside ``checkpoint`` (:mod:`vit.explain.choice`,
            with its options), else AttnLRP (:data:`~vit.explain.DEFAULT_METHOD`).
        mean: Per-channel mean in ``[0, 1]`` of the normalisation (needed for uint8 images).
        std: Per-channel standard deviation.
        labels: ``(B,)`` true classes (``-1`` = unknown), for the captions and the benchmark's accuracy; optional.
        class_names: Name of every class, or ``None``.
        target: The class the class-specific methods explain; ``None``: each image's prediction.
        statistics: Also compute entropy, mean attention distance and a collapse report per block.
        block: The block whose per-head maps are kept (``-1``: the last); ``None`` keeps none.
        keep_attentions: Keep every block's attention of every image (the explorer needs them; memory grows as
            images x blocks x heads x tokens²).
        faithfulness: Measure every map (:func:`~vit.explain.benchmark_removals`): :attr:`Explanation.benchmarks`.
        steps: Fractions of the faithfulness curves.
        removals: How a patch is removed in the curves, one benchmark each (:mod:`vit.explain.removal`: ``"mean"``,
            ``"blur"``, ``"road"``, ``"drop"``).
        sanity: Also randomise the model's weights from the top down and compare each method's maps with the trained
            model's (:func:`~vit.explain.sanity.sanity_check`): :attr:`Explanation.sanity`.
        heads: Also measure each head's importance by mean ablation (:func:`~vit.explain.heads.head_importance`):
            :attr:`Explanation.heads`.
        batch_size: Images per forward pass and per explanation call.
        options: Per-method options, e.g. ``{"ig": {"n_steps": 32}}``; ``head_fusion`` and ``discard_ratio`` are
            the rollout's.
        head_fusion: How the rollout fuses a block's heads (:func:`~vit.explain.attention_rollout`).
        discard_ratio: Fraction in ``[0, 1)`` of the weakest links the rollout drops per block.
        uniform_threshold: Normalised entropy at or above which a head counts as near-uniform
            (:func:`~vit.explain.detect_collapse`).
        one_hot_threshold: Normalised entropy at or below which a head counts as near-one-hot.
        show_progress: Report each method's maps and curves on stderr (:class:`~vit.explain.progress.Progress`).
        checkpoint: The file the model was loaded from, whose stored method choice ``methods=None`` takes.

    Returns:
        The :class:`Explanation`, every tensor on the CPU.

    Raises:
        ValueError: On an unknown method or one that cannot explain the model (naming those that can), a ``target``
            or ``block`` the model does not have, images that are not a ``(B, C, H, W)`` batch, uint8 images
            without ``mean`` / ``std``, or labels of another length.
        ImportError: If a method needs the ``explain`` extra and it is missing (before anything runs).
    """
    from .method_benchmark import benchmark_removals, timed_maps  # the benchmark imports the registry, as we do

    if methods is None:
        methods, stored = stored_methods(checkpoint, DEFAULT_METHOD)
        options = {**stored, **(options or {})}
    names = list(dict.fromkeys(get_method(name, model).name for name in methods))  # aliases resolved, in order
    for name in names:
        require_extras(name)
    if target is not None and not 0 <= target < model.num_classes:
        raise ValueError(f"target {target} out of range: the model has {model.num_classes} classes")
    index = None if block is None else block_index(model, block)
    if images.ndim != 4:
        raise ValueError(f"images must be a (B, C, H, W) batch, got shape {tuple(images.shape)}")
    if labels is not None:
        labels = torch.as_tensor(labels).detach().cpu().long().reshape(-1)
        if len(labels) != len(images):
            raise ValueError(f"got {len(labels)} labels for {len(images)} images: pass one label per image")
    options = {"rollout": {"head_fusion": head_fusion, "discard_ratio": discard_ratio}, **(options or {})}
    # Maps read from the forward pass's own attention; the benchmark computes (and times) every map itself.
    recorded = {} if faithfulness else {n: options.get(n, {}) for n in names if METHODS[n].from_record is not None}
    settings = dict(class_names=class_names, mean=mean, std=std, statistics=statistics, block=index,
                    keep_attentions=keep_attentions, uniform_threshold=uniform_threshold,
                    one_hot_threshold=one_hot_threshold, recorded=recorded)  # fmt: skip
    chunks = list(range(0, len(images), batch_size))
    progress = Progress("predictions", len(images), show_progress)
    parts = [
        forward(
            model, images[i : i + batch_size], labels=None if labels is None else labels[i : i + batch_size], **settings
        )  # fmt: skip
        for i in chunks
    ]
    explanation = parts[0] if len(parts) == 1 else Explanation.concat(parts)
    what = ", ".join(["classes", *recorded])
    progress.close(f"{what} and attention statistics of {plural(len(images), 'image')} in {progress.seconds:.1f} s")
    classes = None if target is None else torch.full((len(images),), target)
    with torch.inference_mode(False), torch.enable_grad():  # gradients, also inside a validation loop
        inputs = model_inputs(model, images, mean, std)
        if faithfulness:
            benchmarks = benchmark_removals(
                model, inputs, classes, names, removals, steps=steps, batch_size=batch_size,
                target="prediction" if target is None else "label", options=options, show_progress=show_progress,
            )  # fmt: skip
            for bench in benchmarks.values():
                if target is not None:  # the benchmark's "labels" were the target class: say so, score the labels
                    bench.target = f"class {explanation.class_name(target)}"
                bench.accuracy = None if labels is None else float((explanation.preds == labels).float().mean())
            maps = next(iter(benchmarks.values())).maps
            explanation.benchmarks = benchmarks
        else:
            others = [name for name in names if name not in recorded]
            maps, _ = timed_maps(model, inputs, classes, others, batch_size, options, show_progress, warm_up=False)
            maps.update(explanation.maps)
        if sanity:
            from .sanity import sanity_check

            progress = Progress("sanity", len(images), show_progress)
            explanation.sanity = report = sanity_check(model, inputs, names, batch_size=batch_size, options=options)
            count = len(next(iter(report.stages.values())))
            progress.close(f"{count} randomisation stages of {len(names)} methods in {progress.seconds:.1f} s")
        if heads:
            from .heads import head_importance

            progress = Progress("heads", len(images), show_progress)
            known = labels if labels is not None and bool((labels >= 0).all()) else None
            explanation.heads = importance = head_importance(model, inputs, known, target, batch_size=batch_size)
            progress.close(f"mean ablation of {importance.logit_drop.numel()} heads in {progress.seconds:.1f} s")
    explanation.maps = {name: maps[name].float().cpu() for name in names}
    explanation.target = target
    return explanation


def explain_images(
    model: nn.Module,
    images: torch.Tensor,
    *,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    **kwargs: Any,
) -> Explanation:
    """One batch with every block's attention kept and its attention rollout: :func:`explain` with
    ``methods=["rollout"]`` and ``keep_attentions=True`` (``kwargs``: ``labels``, ``class_names``, ``statistics``,
    the collapse thresholds)."""
    return explain(
        model, images, ["rollout"], mean=mean, std=std, head_fusion=head_fusion, discard_ratio=discard_ratio,
        keep_attentions=True, block=None, batch_size=max(1, len(images)), **kwargs,
    )  # fmt: skip
