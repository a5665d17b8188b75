"""Choose the explanation method, and LRP's gamma rule, for a model by measurement, not by looking at heatmaps.

The gamma rule (:mod:`vit.explain.lrp`) has two values: ``gamma`` on the linear layers and ``embed_gamma`` on the
convolutions of the patch embedding and stem. lxt's examples set them by eye; :func:`tune_gamma` measures instead.
Each candidate explains the same held-out images, and its maps are scored by the symmetric relevance gain
(SRG = AUC(least relevant first) - AUC(most relevant first), Blücher et al. 2024) under each way of removing a patch
(:mod:`vit.explain.removal`); the candidate with the highest SRG averaged over the removals wins. The search is by
coordinates: ``gamma`` over :data:`GAMMAS` with the convolutions at 0, then ``embed_gamma`` over
:data:`EMBED_GAMMAS` with the best ``gamma``; ``(0, 0)``, the rules of the papers, is always a candidate, so the
choice is never worse than the default on the images it was measured on.

Measure on images you will not then report (``vit explain --tune`` takes validation images the explanation does not
show): a value chosen on the reported images would flatter them::

    tuning = tune_gamma(model, held_out_images, removals=("mean", "road"))
    explanation = explain(model, images, ["attnlrp"], options={"attnlrp": tuning.options()})

No method is best for every model (on the global-attention quickstart model AttnLRP leads under token drop and
integrated gradients under the mean fill), so :func:`tune_method` chooses the method the same way: every candidate
of :data:`CANDIDATES` (the LRP ones with their gamma rule tuned first) explains the held-out images, and the highest
SRG averaged over the removals wins::

    choice = tune_method(model, held_out_images)
    explanation = explain(model, images, [choice.method], options=choice.options)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from ..layers.utils import eval_mode
from ..text import plural
from .attribution import resolve_target
from .faithfulness import faithfulness
from .method_benchmark import timed_maps
from .methods import get_method
from .progress import Progress
from .removal import check_removals

GAMMAS: tuple[float, ...] = (0.0, 0.01, 0.05, 0.1, 0.25, 1.0)
"""Values of ``gamma`` (linear layers) tried first, the convolutions at 0."""
EMBED_GAMMAS: tuple[float, ...] = (0.0, 0.1, 0.25, 1.0, 100.0)
"""Values of ``embed_gamma`` (convolutions) tried with the best ``gamma``; 100 is close to the z⁺ rule."""
TUNABLE = ("attnlrp", "cp_lrp")
TOLERANCE = 1e-3
"""Mean SRG by which a candidate must beat the best one tried before it (smaller values) to replace it: differences
in the fourth decimal are noise, and the gamma rule costs time."""


@dataclass
class GammaCandidate:
    """One measured pair of values.

    Attributes:
        gamma: On the linear layers.
        embed_gamma: On the convolutions.
        srg: Removal name to the mean SRG over the images.
        mean_srg: The mean of ``srg`` over the removals: what is compared.
        ms_per_image: Wall time of the maps per image.
    """

    gamma: float
    embed_gamma: float
    srg: dict[str, float]
    mean_srg: float
    ms_per_image: float


@dataclass
class GammaTuning:
    """The gamma chosen for one method and model, and every candidate measured.

    Attributes:
        method: ``"attnlrp"`` or ``"cp_lrp"``.
        gamma: The chosen ``gamma``.
        embed_gamma: The chosen ``embed_gamma``.
        removals: The removals whose SRG was averaged.
        num_images: Held-out images measured.
        steps: Fractions of the deletion and least-relevant-first curves.
        candidates: Every pair measured, in the order tried.
    """

    method: str
    gamma: float
    embed_gamma: float
    removals: list[str]
    num_images: int
    steps: int
    candidates: list[GammaCandidate] = field(default_factory=list)

    def options(self) -> dict[str, float]:
        """The method's options with the chosen values: ``explain(..., options={method: tuning.options()})``."""
        return {"gamma": self.gamma, "embed_gamma": self.embed_gamma}

    @property
    def default(self) -> GammaCandidate:
        """The candidate ``(0, 0)``: the rules without the gamma rule."""
        return next(c for c in self.candidates if c.gamma == 0 and c.embed_gamma == 0)

    @property
    def chosen(self) -> GammaCandidate:
        """The chosen candidate."""
        return next(c for c in self.candidates if (c.gamma, c.embed_gamma) == (self.gamma, self.embed_gamma))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dictionary."""
        return asdict(self)

    def table(self) -> str:
        """One line per candidate: the values, SRG per removal and averaged, ms per image; the choice marked."""
        rows = [(f"{c.gamma:>7g} {c.embed_gamma:>7g}  ", c, c is self.chosen, "") for c in self.candidates]
        return _srg_table(f"{'gamma':>7} {'embed':>7}  ", self.removals, rows)


def _srg_table(head: str, removals: Sequence[str], rows: Sequence[tuple[str, Any, bool, str]]) -> str:
    """The table of a tuning: ``head`` then SRG per removal, averaged, and ms per image; one line per ``(label,
    candidate, chosen, note)``, the chosen one marked."""
    lines = [head + "".join(f"{'SRG ' + r:>10}" for r in removals) + f"{'mean SRG':>10}  ms/img"]
    for label, c, chosen, note in rows:
        srg = "".join(f"{c.srg[r]:>+10.3f}" for r in removals)
        mark = "  <- chosen" if chosen else ""
        lines.append(f"{label}{srg}{c.mean_srg:>+10.3f}  {c.ms_per_image:.1f}{mark}{note}")
    return "\n".join(lines)


def tune_gamma(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    method: str = "attnlrp",
    removals: Sequence[str] = ("mean", "road", "drop"),
    gammas: Sequence[float] = GAMMAS,
    embed_gammas: Sequence[float] = EMBED_GAMMAS,
    steps: int = 16,
    target: Literal["prediction", "label"] = "prediction",
    batch_size: int = 32,
    show_progress: bool = False,
) -> GammaTuning:
    """Choose ``gamma`` and ``embed_gamma`` of ``method`` for ``model`` by the SRG of its maps of ``images``.

    Args:
        model: The classifier.
        images: ``(B, C, H, W)`` held-out images, normalised as the model expects: not the images to be reported.
        labels: ``(B,)`` true classes, for ``target="label"``.
        method: ``"attnlrp"`` or ``"cp_lrp"``.
        removals: How a patch is removed (:mod:`vit.explain.removal`); their SRGs are averaged.
        gammas: Values of ``gamma`` tried (with ``embed_gamma`` 0); 0 is added if missing.
        embed_gammas: Values of ``embed_gamma`` tried with the best ``gamma``; a model without convolutions
            tries none.
        steps: Fractions of the curves.
        target: Explain and measure the predicted class or the label.
        batch_size: Images per explanation call and per forward pass of the curves.
        show_progress: Report the candidates measured on stderr (:class:`~vit.explain.progress.Progress`), and the
            choice in one line.

    Returns:
        A :class:`GammaTuning`; a candidate wins over the smaller values tried before it only by more than
        :data:`TOLERANCE`.

    Raises:
        ValueError: On a method that has no gamma, a negative value, an unknown removal, token drop on a model that
            cannot drop tokens, or ``target="label"`` without labels.
    """
    method = get_method(method, model).name
    if method not in TUNABLE:
        raise ValueError(f"only {' and '.join(TUNABLE)} have a gamma rule to tune, got {method!r}")
    check_removals(model, removals)
    if any(not 0 <= g < float("inf") for g in (*gammas, *embed_gammas)):
        raise ValueError(f"gamma values must be finite and >= 0, got {list(gammas)} and {list(embed_gammas)}")
    if target == "label" and labels is None:
        raise ValueError("target='label' needs labels")
    param = next(model.parameters(), None)
    images = images.to(param.device) if param is not None else images
    with eval_mode(model), torch.no_grad():
        logits = torch.cat([model.forward(chunk) for chunk in images.split(batch_size)])
    classes = resolve_target(labels.to(logits.device) if target == "label" else None, logits)

    has_convolutions = any(isinstance(m, nn.Conv2d) for m in model.modules())
    first_pairs = [(float(g), 0.0) for g in dict.fromkeys((0.0, *gammas))]
    second_values = [float(e) for e in dict.fromkeys(embed_gammas) if e != 0] if has_convolutions else []
    progress = Progress(f"tune {method}", len(first_pairs) + len(second_values), show_progress, unit="candidates")

    def measure(gamma: float, embed_gamma: float) -> GammaCandidate:
        options = {method: {"gamma": gamma, "embed_gamma": embed_gamma}}
        maps, seconds = timed_maps(model, images, classes, [method], batch_size, options)
        srg = {
            removal: float(faithfulness(model, images, maps, target=classes, steps=steps, baseline=removal,
                                        num_random=0, batch_size=batch_size)["srg"][method])
            for removal in removals
        }  # fmt: skip
        progress.update(1)
        return GammaCandidate(gamma, embed_gamma, srg, sum(srg.values()) / len(srg), 1000 * seconds[method])

    def best(candidates: list[GammaCandidate]) -> GammaCandidate:
        winner = candidates[0]
        for candidate in candidates[1:]:  # in the order tried: larger values must win by more than TOLERANCE
            if candidate.mean_srg > winner.mean_srg + TOLERANCE:
                winner = candidate
        return winner

    try:
        first = [measure(gamma, embed_gamma) for gamma, embed_gamma in first_pairs]
        winner = best(first)
        second = [measure(winner.gamma, embed_gamma) for embed_gamma in second_values]
        winner = best([winner, *second])
    finally:
        progress.stop()
    progress.close(f"gamma {winner.gamma:g}, embed_gamma {winner.embed_gamma:g}, the best of {progress.done} "
                   f"candidates on {plural(len(images), 'image')}, in {progress.seconds:.1f} s")  # fmt: skip
    return GammaTuning(method, winner.gamma, winner.embed_gamma, list(removals), len(images), steps, first + second)


CANDIDATES: tuple[str, ...] = ("attnlrp", "cp_lrp", "attribution", "gradxinput", "rollout", "attention")
"""The methods :func:`tune_method` chooses among by default: those a plain install has (the training callback and the
report run without the ``explain`` extra) that cost one forward and at most one backward pass per image, 0.4-4 ms
per image on the quickstart and ``cifar10_cpu`` models (``docs/results/faithfulness.json``; 9 ms with a tuned gamma
rule). Left out: integrated gradients, 16 forward and backward passes per image (12-16x AttnLRP's time there) and
captum; Grad-CAM, as cheap but from the ``grad-cam`` package. Pass ``methods=`` to measure them too."""


@dataclass
class MethodCandidate:
    """One method measured on the held-out images.

    Attributes:
        method: Its name in :data:`~vit.explain.METHODS`.
        options: The options it was measured with (a tuned gamma rule), possibly empty.
        srg: Removal name to the mean SRG over the images.
        mean_srg: The mean of ``srg`` over the removals: what is compared.
        ms_per_image: Wall time of its maps per image.
    """

    method: str
    options: dict[str, float]
    srg: dict[str, float]
    mean_srg: float
    ms_per_image: float


@dataclass
class MethodTuning:
    """The method chosen for a model, every candidate measured, and the gamma rules tuned on the way.

    Attributes:
        method: The chosen method: the highest ``mean_srg`` (the first in ``candidates`` on a tie).
        removals: The removals whose SRG was averaged.
        num_images: Held-out images measured.
        steps: Fractions of the deletion and least-relevant-first curves.
        candidates: Every method measured, in the order given.
        gamma: Method name to its :class:`GammaTuning`, for the LRP methods whose gamma rule was tuned.
    """

    method: str
    removals: list[str]
    num_images: int
    steps: int
    candidates: list[MethodCandidate] = field(default_factory=list)
    gamma: dict[str, GammaTuning] = field(default_factory=dict)

    @property
    def chosen(self) -> MethodCandidate:
        """The chosen candidate."""
        return next(c for c in self.candidates if c.method == self.method)

    @property
    def options(self) -> dict[str, dict[str, float]]:
        """Every measured method's options (the tuned gamma rules), as :func:`~vit.explain.explain` takes them."""
        return {c.method: dict(c.options) for c in self.candidates if c.options}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dictionary."""
        return asdict(self)

    def table(self) -> str:
        """One line per method: SRG per removal and averaged, ms per image; the choice marked."""
        rows = []
        for c in self.candidates:
            options = ", ".join(f"{k} {v:g}" for k, v in c.options.items()) if any(c.options.values()) else ""
            rows.append((f"{c.method:<12}", c, c.method == self.method, f" ({options})" if options else ""))
        return _srg_table(f"{'method':<12}", self.removals, rows)


def tune_method(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    methods: Sequence[str] | None = None,
    removals: Sequence[str] = ("mean", "road", "drop"),
    steps: int = 16,
    target: Literal["prediction", "label"] = "prediction",
    batch_size: int = 32,
    tune_gammas: bool = True,
    show_progress: bool = False,
) -> MethodTuning:
    """Choose the explanation method for ``model``: the highest SRG averaged over ``removals`` on ``images``.

    Each LRP method first gets its gamma rule (:func:`tune_gamma`, on the same images and removals; its chosen
    candidate is its score); every other method is measured once, each in its own
    :func:`~vit.explain.faithfulness` call per removal, as :func:`tune_gamma` measures a candidate.

    Args:
        model: The classifier.
        images: ``(B, C, H, W)`` held-out images, normalised as the model expects: not the images to be reported.
        labels: ``(B,)`` true classes, for ``target="label"``.
        methods: Names of :data:`~vit.explain.METHODS` to choose among; default: those of :data:`CANDIDATES` that
            apply to the model.
        removals: How a patch is removed (:mod:`vit.explain.removal`); their SRGs are averaged.
        steps: Fractions of the curves.
        target: Explain and measure the predicted class or the label.
        batch_size: Images per explanation call and per forward pass of the curves.
        tune_gammas: Tune the gamma rule of ``attnlrp`` and ``cp_lrp`` (else they are measured without it).
        show_progress: Report each method measured on stderr, and the choice in one line.

    Raises:
        ValueError: On an unknown method or one that does not apply to the model, no method, an unknown removal,
            token drop on a model that cannot drop tokens, or ``target="label"`` without labels.
    """
    from .methods import applicable_methods

    if methods is None:
        methods = [name for name in CANDIDATES if name in applicable_methods(model)]
    names = list(dict.fromkeys(get_method(name, model).name for name in methods))
    if not names:
        raise ValueError("no method to choose among")
    check_removals(model, removals)
    if target == "label" and labels is None:
        raise ValueError("target='label' needs labels")
    param = next(model.parameters(), None)
    images = images.to(param.device) if param is not None else images
    with eval_mode(model), torch.no_grad():
        logits = torch.cat([model.forward(chunk) for chunk in images.split(batch_size)])
    classes = resolve_target(labels.to(logits.device) if target == "label" else None, logits)
    gamma = {
        name: tune_gamma(model, images, labels, method=name, removals=removals, steps=steps, target=target,
                         batch_size=batch_size, show_progress=show_progress)
        for name in names if name in TUNABLE and tune_gammas
    }  # fmt: skip
    progress = Progress("choose method", len(names) - len(gamma), show_progress, unit="methods")
    candidates = []
    try:
        for name in names:
            if name in gamma:
                tuned = gamma[name].chosen
                candidates.append(MethodCandidate(name, gamma[name].options(), tuned.srg, tuned.mean_srg,
                                                  tuned.ms_per_image))  # fmt: skip
                continue
            maps, seconds = timed_maps(model, images, classes, [name], batch_size, {})
            srg = {
                removal: float(faithfulness(model, images, maps, target=classes, steps=steps, baseline=removal,
                                            num_random=0, batch_size=batch_size)["srg"][name])
                for removal in removals
            }  # fmt: skip
            candidates.append(MethodCandidate(name, {}, srg, sum(srg.values()) / len(srg), 1000 * seconds[name]))
            progress.update(1)
    finally:
        progress.stop()
    winner = max(candidates, key=lambda c: c.mean_srg)  # the first of equal ones
    progress.close(f"{winner.method}, mean SRG {winner.mean_srg:+.3f}, the best of {len(candidates)} methods on "
                   f"{plural(len(images), 'image')}")  # fmt: skip
    return MethodTuning(winner.method, list(removals), len(images), steps, candidates, gamma)
