"""Choose LRP's gamma rule for a model by measurement, not by looking at heatmaps.

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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from ..layers.utils import eval_mode
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
        header = f"{'gamma':>7} {'embed':>7}  " + "".join(f"{'SRG ' + r:>10}" for r in self.removals)
        lines = [f"{header}{'mean SRG':>10}  ms/img"]
        for c in self.candidates:
            mark = "  <- chosen" if c is self.chosen else ""
            srg = "".join(f"{c.srg[r]:>+10.3f}" for r in self.removals)
            lines.append(f"{c.gamma:>7g} {c.embed_gamma:>7g}  {srg}{c.mean_srg:>+10.3f}  {c.ms_per_image:.1f}{mark}")
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
                   f"candidates on {len(images)} images, in {progress.seconds:.1f} s")  # fmt: skip
    return GammaTuning(method, winner.gamma, winner.embed_gamma, list(removals), len(images), steps, first + second)
