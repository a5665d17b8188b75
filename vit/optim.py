"""The optimiser's side of training: AdamW parameter groups (weight decay, layer-wise learning-rate decay), when
its fused CUDA kernel may run, and Muon for the blocks' weight matrices.

The groups come from timm (``param_groups_weight_decay``, ``param_groups_layer_decay``, as its training script uses
them); :class:`~vit.ImageClassifier` builds ``torch.optim.AdamW`` over them (or :class:`MuonWithAdamW`), and the
learning-rate schedule is :mod:`vit.schedule`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.plugins.precision import MixedPrecision
from timm.optim import param_groups_layer_decay, param_groups_weight_decay
from torch import nn

from .errors import ConfigError, IncompatibleCheckpointError

OptimizerName = Literal["adamw", "muon"]
"""``model.optimizer``: AdamW for every parameter, or Muon for the blocks' weight matrices and AdamW for the rest."""


def param_groups(
    model: nn.Module, lr: float, *, weight_decay: float, layer_decay: float | None = None
) -> list[dict[str, Any]]:
    """AdamW parameter groups: no decay on 1-D parameters, biases and ``model.no_weight_decay()``; with
    ``layer_decay`` one group per depth carrying its ``lr_scale``; every group's ``lr`` is already scaled.

    Args:
        model: The network (a :class:`~vit.VisionTransformer`, whose ``group_matcher`` orders the layers).
        lr: Peak learning rate of the last layer (the head).
        weight_decay: AdamW's decoupled weight decay of the decayed groups.
        layer_decay: Each layer's learning rate is this times the next one's (BEiT's layer-wise decay); ``None``:
            one learning rate.
    """
    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    if layer_decay is not None:
        groups = param_groups_layer_decay(model, weight_decay, no_weight_decay_list=skip, layer_decay=layer_decay)
    else:
        groups = param_groups_weight_decay(model, weight_decay, no_weight_decay_list=skip)
    for group in groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    return groups


def fused_adamw(device: torch.device, trainer: Trainer | None) -> bool:
    """Whether AdamW runs its fused kernel: on CUDA, unless Lightning's mixed precision clips the gradients. Its AMP
    plugin (``bf16-mixed``, ``16-mixed``) refuses to clip for an optimiser that unscales gradients inside its own step,
    as the fused one does, and stops the first training step; there the ``foreach`` implementation runs instead."""
    if device.type != "cuda":
        return False
    clips = trainer is not None and bool(trainer.gradient_clip_val)
    return not (clips and isinstance(trainer.precision_plugin, MixedPrecision))


def muon_matrices(model: nn.Module) -> set[int]:
    """``id`` of each weight Muon updates: those of the ``nn.Linear`` layers inside the transformer blocks (the
    attention's ``qkv`` and ``proj``, the MLP's ``fc1`` and ``fc2``). The stem, the patch embedding, the head, position
    embeddings and bias tables, norms and biases stay with AdamW, as Muon's authors leave the input and output layers
    and every vector to it."""
    linear = (m for name, m in model.named_modules() if isinstance(m, nn.Linear) and name.startswith("blocks."))
    return {id(m.weight) for m in linear}


def muon_groups(model: nn.Module, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``groups`` (of :func:`param_groups`) with each one's block matrices moved to a twin group marked
    ``muon: True``; every group keeps its ``lr``, ``weight_decay`` and ``lr_scale``."""
    chosen = muon_matrices(model)
    split = []
    for group in groups:
        params = list(group["params"])
        for muon in (False, True):
            part = [p for p in params if (id(p) in chosen) == muon]
            if part:
                split.append({**group, "params": part, "muon": muon})
    return split


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon (Jordan et al., 2024; ``torch.optim.Muon``) on the groups marked ``muon``, AdamW on the others, as one
    optimiser: one learning-rate schedule scales both and one state dict holds both.

    Muon orthogonalises each matrix's momentum with five Newton-Schulz iterations. Its step is scaled by
    ``0.2 * sqrt(max(fan_out, fan_in))`` (Moonshot's ``match_rms_adamw``, Liu et al., "Muon is Scalable for LLM
    Training", 2025), so the update has AdamW's RMS and the recipe's learning rate and weight decay carry over.

    Args:
        groups: Parameter groups, each with a ``muon`` flag (:func:`muon_groups`); a group without one is AdamW's.
        lr: Default peak learning rate of both.
        betas: AdamW's betas.
        eps: AdamW's epsilon.
        momentum: Muon's (Nesterov) momentum.
    """

    def __init__(
        self, groups: list[dict[str, Any]], lr: float, betas: Sequence[float], eps: float, momentum: float = 0.95
    ) -> None:
        defaults = {"lr": lr, "weight_decay": 0.0, "muon": False}
        super().__init__(groups, {**defaults, "adamw_betas": tuple(betas), "adamw_eps": eps, "muon_momentum": momentum})
        self._build()

    def _build(self) -> None:
        """Make the inner optimisers over this one's groups and state, the same dicts (the schedule's ``lr`` and a
        loaded state reach them): at the start, and after ``load_state_dict``, unpickling or ``add_param_group``."""
        d, self._inner = self.defaults, []
        if muon := [g for g in self.param_groups if g["muon"]]:
            self._inner.append(
                torch.optim.Muon(muon, lr=d["lr"], momentum=d["muon_momentum"], adjust_lr_fn="match_rms_adamw")
            )
        if adamw := [g for g in self.param_groups if not g["muon"]]:
            self._inner.append(torch.optim.AdamW(adamw, lr=d["lr"], betas=d["adamw_betas"], eps=d["adamw_eps"]))
        for inner in self._inner:
            inner.state = self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)  # new group dicts and a new state
        self._build()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # a copy or an unpickled optimiser: its groups and state only
        self._build()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if hasattr(self, "_inner"):  # not while __init__ adds the first groups
            self._build()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for inner in self._inner:
            inner.step()
        return loss


def check_resumed_optimizer(checkpoint: dict[str, Any], optimizer: OptimizerName, source: Any) -> None:
    """Refuse to resume a fit whose checkpoint holds another optimiser's state than ``optimizer``.

    Raises:
        IncompatibleCheckpointError: Naming the checkpoint's optimiser and the option that resumes it.
    """
    saved = (checkpoint.get("hyper_parameters") or {}).get("optimizer", "adamw")
    if checkpoint.get("optimizer_states") and saved != optimizer:
        raise IncompatibleCheckpointError(
            f"{source or 'the checkpoint'} was trained with model.optimizer {saved}, and this run asks for "
            f"{optimizer}: resume it with --model.optimizer {saved}, or start a new run"
        )


def make_optimizer(
    model: nn.Module,
    name: OptimizerName,
    lr: float,
    *,
    weight_decay: float,
    layer_decay: float | None,
    betas: Sequence[float],
    eps: float,
    fused: bool,
) -> torch.optim.Optimizer:
    """The optimiser ``name`` over ``model``'s :func:`param_groups` at peak learning rate ``lr``."""
    groups = param_groups(model, lr, weight_decay=weight_decay, layer_decay=layer_decay)
    if name == "muon":
        groups = muon_groups(model, groups)
        if not any(g["muon"] for g in groups):
            raise ConfigError(
                "model.optimizer muon needs a network with linear layers in transformer blocks (blocks.*), and this "
                "one has none: use model.optimizer adamw"
            )
        return MuonWithAdamW(groups, lr=lr, betas=betas, eps=eps)
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused)
