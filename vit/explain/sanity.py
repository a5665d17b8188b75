"""Sanity check of explanation methods: do the maps change when the model's weights are randomised?

Adebayo, Gilmer, Muelly, Goodfellow, Hardt & Kim, "Sanity Checks for Saliency Maps" (NeurIPS 2018): a map that stays
the same while the model it explains is destroyed says more about the image than about the model. Cascading
randomisation draws the weights again from the top down, one stage at a time, keeping the stages above randomised:
first the classifier head (``head``, with ``fc_norm`` and an attention-pooling head), then the blocks from the last
to the first, then the patch embedding. "Drawn again" is the model's own initialisation: every linear and
convolution weight from a truncated normal of σ 0.02, biases zero; normalisation layers keep their weights. At each
stage every method explains the same images and the same classes (the trained model's predictions), and its maps
are compared with the trained model's: Spearman's rank correlation over the patches and the structural similarity
(SSIM, 3x3 uniform window, on maps scaled to [0, 1] per image), each the mean over the images with a 95 % bootstrap
interval. A method whose maps still correlate above :data:`INSENSITIVE` once the whole model is random is flagged as
insensitive to it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..layers.utils import eval_mode
from .methods import explain_map, get_method

INSENSITIVE = 0.5
"""Mean Spearman correlation with the trained model's maps, once the whole model is random, above which a method is
flagged as insensitive to the model."""


@dataclass
class SanityStage:
    """One method's maps at one stage of the randomisation, against the trained model's.

    Attributes:
        stage: What is random so far: ``"head"``, then ``"block 5"``, ``"block 4"``, ... (cumulative).
        spearman: Mean Spearman rank correlation over the patches (1: the same ranking).
        spearman_ci: Its 95 % bootstrap interval over the images.
        ssim: Mean structural similarity of the maps scaled to [0, 1] (1: the same map).
        ssim_ci: Its 95 % bootstrap interval.
    """

    stage: str
    spearman: float
    spearman_ci: tuple[float, float]
    ssim: float
    ssim_ci: tuple[float, float]


@dataclass
class SanityReport:
    """The cascading randomisation of every method.

    Attributes:
        stages: Method name to its :class:`SanityStage` per stage, in the order randomised.
        insensitive: Methods whose maps still correlate above :data:`INSENSITIVE` with every block random.
        num_images: Images explained.
        seed: Seed of the random weights and of the bootstrap.
    """

    stages: dict[str, list[SanityStage]]
    insensitive: list[str]
    num_images: int
    seed: int
    threshold: float = INSENSITIVE
    maps: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable (the maps left out)."""
        stages = {name: [asdict(stage) for stage in stages] for name, stages in self.stages.items()}
        return {"stages": stages, "insensitive": self.insensitive, "num_images": self.num_images, "seed": self.seed,
                "threshold": self.threshold}  # fmt: skip

    def table(self) -> str:
        """A plain-text table: per method and stage, Spearman and SSIM with their intervals."""
        lines = [f"{'method':<12} {'randomised up to':<18} {'Spearman (95% CI)':<26} SSIM (95% CI)"]
        for name, stages in self.stages.items():
            for s in stages:
                spearman = f"{s.spearman:+.3f} [{s.spearman_ci[0]:+.3f}, {s.spearman_ci[1]:+.3f}]"
                ssim = f"{s.ssim:+.3f} [{s.ssim_ci[0]:+.3f}, {s.ssim_ci[1]:+.3f}]"
                lines.append(f"{name:<12} {s.stage:<18} {spearman:<26} {ssim}")
            if name in self.insensitive:
                lines.append(f"{'':<12} insensitive: its maps barely change when the whole model is random")
        return "\n".join(lines)


def randomise(module: nn.Module, generator: torch.Generator) -> None:
    """Draw every linear and convolution weight of ``module`` again (truncated normal, σ 0.02; biases zero)."""
    for child in module.modules():
        if isinstance(child, (nn.Linear, nn.Conv2d)):
            with torch.no_grad():
                weight = torch.empty_like(child.weight, device="cpu")
                nn.init.trunc_normal_(weight, std=0.02, a=-2.0, b=2.0, generator=generator)  # timm's ViT init
                child.weight.copy_(weight)
                if child.bias is not None:
                    child.bias.zero_()


def stages(model: nn.Module) -> list[tuple[str, list[nn.Module]]]:
    """The randomisation stages, top down: the head, each block from the last to the first, the patch embedding."""
    top = (getattr(model, name, None) for name in ("head", "fc_norm", "attn_pool"))
    head = [module for module in top if isinstance(module, nn.Module)]
    blocks = [(f"block {i}", [block]) for i, block in reversed(list(enumerate(model.blocks)))]
    return [("head", head), *blocks, ("patch embedding", [model.patch_embed])]


def spearman(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman's rank correlation of each row of ``a`` with the same row of ``b`` ``(B, N)`` (average ranks for
    ties; 0 where a row is constant), torchmetrics' with the rows as its outputs."""
    from torchmetrics.functional import spearman_corrcoef

    return spearman_corrcoef(a.double().T, b.double().T).double()


def ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Structural similarity per image of two ``(B, rows, cols)`` maps, each scaled to [0, 1] per image, with a 3x3
    uniform window (torchmetrics)."""
    from torchmetrics.functional.image import structural_similarity_index_measure

    def scaled(m: torch.Tensor) -> torch.Tensor:
        flat = m.flatten(1).double()
        low, high = flat.min(1, keepdim=True).values, flat.max(1, keepdim=True).values
        return ((flat - low) / (high - low).clamp_min(1e-12)).view(m.shape)[:, None]

    return structural_similarity_index_measure(scaled(a), scaled(b), gaussian_kernel=False, kernel_size=3,
                                               data_range=1.0, reduction="none")  # fmt: skip


def _interval(values: torch.Tensor, generator: np.random.Generator, bootstrap: int = 1000) -> tuple[float, float]:
    array = values.double().numpy()
    means = array[generator.integers(0, len(array), size=(bootstrap, len(array)))].mean(axis=1)
    return tuple(float(q) for q in np.percentile(means, [2.5, 97.5]))


def sanity_check(
    model: nn.Module,
    images: torch.Tensor,
    methods: Sequence[str],
    *,
    batch_size: int = 64,
    options: dict[str, dict[str, Any]] | None = None,
    seed: int = 0,
) -> SanityReport:
    """Cascading randomisation of ``model`` (a copy; the model itself is untouched), each method's maps compared with
    the trained model's at every stage (see the module docstring).

    Args:
        model: A :class:`~vit.VisionTransformer`.
        images: ``(B, C, H, W)`` normalised as the model expects (at least 2 images).
        methods: Names of :data:`~vit.explain.METHODS`.
        batch_size: Images per explanation call.
        options: Per-method options, as for :func:`~vit.explain.explain`.
        seed: Seed of the random weights and of the bootstrap.

    Raises:
        ValueError: On an unknown method or one that cannot explain the model, or fewer than 2 images.
    """
    names = [get_method(name, model).name for name in methods]
    if len(images) < 2:
        raise ValueError(f"the sanity check needs at least 2 images for its intervals, got {len(images)}")
    options = options or {}
    randomised = copy.deepcopy(model).eval()
    device = next(model.parameters()).device
    images = images.to(device)
    with eval_mode(model), torch.no_grad():
        target = torch.cat([model.forward(chunk).argmax(-1) for chunk in images.split(batch_size)])

    def maps_of(network: nn.Module, name: str) -> torch.Tensor:
        parts = [explain_map(network, chunk, name, t, **options.get(name, {})).patches.float().cpu()
                 for chunk, t in zip(images.split(batch_size), target.split(batch_size), strict=True)]  # fmt: skip
        return torch.cat(parts)

    with torch.inference_mode(False), torch.enable_grad():
        trained = {name: maps_of(model, name) for name in names}
        weights = torch.Generator().manual_seed(seed)
        rng = np.random.default_rng(seed)
        report: dict[str, list[SanityStage]] = {name: [] for name in names}
        kept: dict[str, dict[str, torch.Tensor]] = {name: {"trained": trained[name]} for name in names}
        copies = dict(randomised.named_modules())
        originals = {id(module): name for name, module in model.named_modules()}
        for stage, modules in stages(model):
            for module in modules:
                randomise(copies[originals[id(module)]], weights)
            for name in names:
                current = maps_of(randomised, name)
                kept[name][stage] = current
                rho = spearman(trained[name].flatten(1), current.flatten(1))
                similarity = ssim(trained[name], current)
                report[name].append(SanityStage(stage, float(rho.mean()), _interval(rho, rng),
                                                float(similarity.mean()), _interval(similarity, rng)))  # fmt: skip
    insensitive = [name for name, result in report.items() if result[-1].spearman > INSENSITIVE]
    return SanityReport(report, insensitive, len(images), seed, maps=kept)
