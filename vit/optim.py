"""The optimiser's side of training: AdamW parameter groups (weight decay, layer-wise learning-rate decay), when
its fused CUDA kernel may run, and Muon for the blocks' weight matrices.

The groups come from timm (``param_groups_weight_decay``, ``param_groups_layer_decay``, as its training script uses
them); :class:`~vit.ImageClassifier` builds ``torch.optim.AdamW`` over them (or :class:`MuonWithAdamW`), and the
learning-rate schedule is :mod:`vit.schedule`'s.
"""

from __future__ import annotations

import math
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


NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
"""The quintic Newton-Schulz iteration's coefficients (Jordan et al., as ``torch.optim.Muon`` uses them)."""


def orthogonalize(updates: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """Muon's approximate orthogonalisation of a batch of same-shaped matrices ``[k, rows, cols]``:
    ``torch.optim.Muon``'s Newton-Schulz iteration in bfloat16 (bit for bit on the CPU recipe's shapes; batched and
    single products may round differently elsewhere), run as one batched product per iteration rather than one a
    matrix (the CPU recipe's 24 small matrices take about half the time this way)."""
    x = updates.bfloat16()
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)  # spectral norm at most 1
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon (Jordan et al., 2024) on the groups marked ``muon``, AdamW on the others, as one optimiser: one
    learning-rate schedule scales both and one state dict holds both.

    Muon keeps a Nesterov momentum of each matrix's gradient and orthogonalises it with five Newton-Schulz
    iterations before the step, as ``torch.optim.Muon`` does, with its arithmetic, but every matrix of one shape at
    once (:func:`orthogonalize`). Every process of a DDP run orthogonalises every matrix: sharing them out and gathering
    the results over gloo cost more than it saved on two CPU cores (17 ms against 12.5 ms an optimiser step).
    Its step is scaled by ``0.2 * sqrt(max(fan_out, fan_in))`` (Moonshot's ``match_rms_adamw``, Liu et al., "Muon is
    Scalable for LLM Training", 2025), so the update has AdamW's RMS and the recipe's learning rate and weight decay
    carry over. The AdamW half is ``torch.optim.AdamW``.

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
        """Make the AdamW half over this one's groups and state, the same dicts (the schedule's ``lr`` and a loaded
        state reach it): at the start, and after ``load_state_dict``, unpickling or ``add_param_group``."""
        d, self._adamw = self.defaults, None
        if adamw := [g for g in self.param_groups if not g["muon"]]:
            self._adamw = torch.optim.AdamW(adamw, lr=d["lr"], betas=d["adamw_betas"], eps=d["adamw_eps"])
            self._adamw.state = self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)  # new group dicts and a new state
        self._build()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # a copy or an unpickled optimiser: its groups and state only
        self._build()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if hasattr(self, "_adamw"):  # not while __init__ adds the first groups
            self._build()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._muon_step()
        if self._adamw is not None:
            self._adamw.step()
        return loss

    def _muon_step(self) -> None:
        """One Muon step of every ``muon`` group: momentum, then the matrices orthogonalised a shape at a time, then
        decoupled weight decay and the RMS-matched step."""
        params = [(p, g) for g in self.param_groups if g["muon"] for p in g["params"] if p.grad is not None]
        if not params:
            return
        momentum = self.defaults["muon_momentum"]
        grads = [p.grad for p, _ in params]
        for p, _ in params:
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p)
        bufs = [self.state[p]["momentum_buffer"] for p, _ in params]
        torch._foreach_lerp_(bufs, grads, 1 - momentum)
        updates = torch._foreach_lerp(grads, bufs, momentum)  # Nesterov
        by_shape: dict[torch.Size, list[int]] = {}
        for i, update in enumerate(updates):
            by_shape.setdefault(update.shape, []).append(i)
        for shape, index in by_shape.items():
            ortho = orthogonalize(torch.stack([updates[i] for i in index]))
            for i, update in zip(index, ortho.unbind(), strict=True):
                p, group = params[i]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"] * (0.2 * math.sqrt(max(shape))))


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
