"""Layer-wise relevance propagation for Vision Transformers, in its efficient gradient x input form.

AttnLRP: Achtibat et al., "AttnLRP: Attention-Aware Layer-wise Relevance Propagation for Transformers" (ICML 2024).
CP-LRP: Ali et al., "XAI for Transformers: Better Explanations through Conservative Propagation" (ICML 2022).

Both are computed as gradient x input through a model whose backward pass is modified, rule by rule; the forward
values are the model's own (every replacement below is exact in value and changes the gradient only):

* **LayerNorm** (the blocks', the final and ``fc_norm``, and the per-head ``q_norm`` / ``k_norm``) and RMSNorm: the
  standard deviation is a constant (detached), so the norm is linear in its input: the identity rule.
* **Element-wise non-linearities** (GELU, SiLU, ELU, tanh, ..., linear attention's ``elu + 1``): the identity rule,
  relevance passes unchanged, i.e. the gradient is ``∂y · (f(x) - f(0)) / x`` (0 where ``x = 0``). A constant
  ``f(0)`` (the ``+ 1`` of ``elu + 1``) is a bias: it absorbs its share of relevance, and the ratio stays bounded
  (``(elu(x) + 1) / x`` is not). ReLU needs no rule: its gradient already is ``f(x) / x``.
* **Softmax attention** (global, window, sliding in every path, and the attention-pooling head's cross-attention):
  AttnLRP applies the uniform rule to the two products ``q kᵀ`` and ``A v`` (each factor of a product gets half of
  its relevance), which in gradient form halves the gradient reaching the attention output's two factors and halves
  again the one reaching ``q`` and ``k``: ``q`` and ``k`` get ``1/4``, ``v`` ``1/2``. The softmax itself is
  differentiated as is. CP-LRP detaches ``q`` and ``k`` (the attention weights are constants), ``v`` gets its full
  gradient.
* **Linear attention**, ``out_i = Σ_j (φ(q_i)·φ(k_j)) v_j / D_i`` with ``D_i = φ(q_i)·Σ_j φ(k_j) + eps``: the
  normaliser ``D`` is a constant (as LayerNorm's std). What remains is one product of three factors, trilinear in
  ``(φ(q), φ(k), v)``; by Euler's theorem each factor's gradient x input sums to the output, so the uniform rule
  gives each ``1/3`` of it: the gradient reaching the attention output is divided by 3. Unlike a split into two
  products, this does not depend on the order the code multiplies in (``φ(q) (φ(k)ᵀ v)``). CP-LRP detaches ``q``
  and ``k`` (so ``φ`` and ``D`` too), ``v`` gets its full gradient.
* **Sequence pooling** (CCT's ``"seqpool"``): the pooled vector ``Σ_i a_i x_i`` is a product of the weights
  ``a = softmax(score(x))`` and the tokens. AttnLRP's uniform rule gives each factor half: the gradient reaching the
  pool's output is halved (the score is linear in the tokens, so nothing more splits). CP-LRP detaches the weights
  (the score's input), the tokens get their full gradient.
* **Gated MLPs** (timm's ``GluMlp``, ``SwiGLUPacked``, ``SwiGLU``, ``GatedMlp``, as ``Block(mlp_layer=...)``)
  multiply two branches, a product with no rule here: :func:`relevance_rules` refuses a model holding one rather
  than give it plain autograd silently.
* **Linear layers and convolutions** (every ``nn.Linear``: ``qkv``, ``proj``, the MLP and the head; every
  ``nn.Conv2d``: the patch projection and the convolutional stem) take the LRP-0 rule (plain autograd) at
  ``gamma=0``, or the generalised gamma rule (Montavon et al., "Layer-wise relevance propagation: an overview",
  2019; Andéol et al. 2021, as zennit's ``Gamma``) at ``gamma > 0``: for an output ``y_j > 0`` each input's share is
  its contribution ``x_i w_ij`` plus ``gamma`` times its positive part (negative parts for ``y_j < 0``), over the same
  sum (with the bias and its part): contributions that agree with the output gain relevance, those that oppose it
  lose some, and the map becomes less noisy as ``gamma`` grows. ``gamma`` is one value for the linear layers and
  ``embed_gamma`` one for the convolutions, the two values lxt's examples set by hand and
  :func:`~vit.explain.tune_gamma` chooses by measurement.
* Everything else (the stem's BatchNorm in eval mode and ReLU, residual sums, pooling, position embeddings, class
  and register tokens) is plain autograd, with biases, position embeddings and prefix tokens absorbing their share.

The rules are temporary forward hooks on the model's module instances, removed when :func:`lrp` returns (also on an
error); the gradient scaling sits on each attention's ``proj`` input and on its ``q_norm`` / ``k_norm`` outputs
(which every attention path calls: scaling commutes with the norm once its std is detached). No class is patched,
no ``.grad`` is written, ``training`` flags are restored: two models (or threads on different models) can be
explained at once.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from timm.layers import GatedMlp, GluMlp, SwiGLU
from torch import nn

from ..layers import Attention, CrossAttention, LinearAttention, SequencePool
from ..layers.linear_attention import EluPlusOne, Normalise
from ..layers.utils import eval_mode
from .attribution import resolve_target

Variant = Literal["attnlrp", "cp"]
VARIANTS: tuple[str, ...] = ("attnlrp", "cp")

# Element-wise non-linearities given the identity rule; ReLU is absent on purpose (its gradient is the rule).
_ELEMENTWISE: tuple[type[nn.Module], ...] = (
    nn.GELU,
    nn.SiLU,
    nn.ELU,
    nn.CELU,
    nn.SELU,
    nn.Tanh,
    nn.Sigmoid,
    nn.Softplus,
    nn.Mish,
    nn.Hardswish,
    nn.Hardtanh,
    nn.LeakyReLU,
)
try:  # timm's own activation classes, where a model was built with them
    from timm.layers import activations as _timm_act

    _ELEMENTWISE += tuple(
        getattr(_timm_act, name) for name in ("GELU", "GELUTanh", "QuickGELU", "Swish") if hasattr(_timm_act, name)
    )
except ImportError:  # pragma: no cover - timm is a dependency
    pass

_ACTIVE: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # models being explained right now
_ACTIVE_LOCK = threading.Lock()


@dataclass
class LRPResult:
    """Relevance of a batch for its target classes.

    Attributes:
        pixels: ``(B, H, W)`` signed pixel relevance, gradient x input summed over the colour channels.
        patches: ``(B, grid_h, grid_w)`` its sum over each patch.
        target: ``(B,)`` the class explained per image.
        logits: ``(B, classes)`` the model's logits (the forward values are unchanged by the rules).
    """

    pixels: torch.Tensor
    patches: torch.Tensor
    target: torch.Tensor
    logits: torch.Tensor


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by a constant."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class _GradientTimes(torch.autograd.Function):
    """Forward: a given value; backward: the gradient times a given factor, routed to ``x``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, value: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(factor)
        return value.view_as(value)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (factor,) = ctx.saved_tensors
        return grad * factor, None, None


class _CentredScale(torch.autograd.Function):
    """LayerNorm with a constant std: forward the given value; backward ``centre(grad · scale)`` over the last dims
    (the centring ``x - mean(x)`` is a symmetric projection, so it is its own adjoint)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, value: torch.Tensor, scale: torch.Tensor, dims: tuple[int, ...]):
        ctx.save_for_backward(scale)
        ctx.dims = dims
        return value.view_as(value)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (scale,) = ctx.saved_tensors
        grad = grad * scale
        return grad - grad.mean(dim=ctx.dims, keepdim=True), None, None, None


def _layer_norm_hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    x = args[0]
    dims = tuple(range(-len(module.normalized_shape), 0))
    with torch.no_grad():
        scale = (x.var(dim=dims, keepdim=True, correction=0) + module.eps).rsqrt()  # 1 / std, a constant
        if module.weight is not None:
            scale = scale * module.weight
    return _CentredScale.apply(x, output.detach(), scale, dims)


def _rms_norm_hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    x = args[0]
    dims = tuple(range(-len(module.normalized_shape), 0))
    with torch.no_grad():
        eps = module.eps if module.eps is not None else torch.finfo(x.dtype).eps
        scale = (x.pow(2).mean(dim=dims, keepdim=True) + eps).rsqrt()
        if module.weight is not None:
            scale = scale * module.weight
        scale = scale.expand_as(x)
    return _GradientTimes.apply(x, output.detach(), scale)


def _identity_rule_hook(offset: float):
    """Gradient times ``(f(x) - f(0)) / x``: relevance ``x · ∂`` in equals ``(f(x) - f(0)) · ∂`` out."""

    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        x = args[0]
        with torch.no_grad():  # f(0) - offset = 0, so x = 0 gives 0 / 0: NaN, set to 0 (no relevance to pass on)
            ratio = (output - offset if offset else output / 1.0).div_(x).nan_to_num_(0.0, 0.0, 0.0)
        return _GradientTimes.apply(x, output.detach(), ratio)

    return hook


def _scale_input_hook(scale: float):
    def hook(module: nn.Module, args: tuple) -> tuple:
        return (_ScaleGradient.apply(args[0], scale), *args[1:])

    return hook


def _scale_output_hook(scale: float, seen: set[int]):
    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        seen.add(id(module))
        return output.detach() if scale == 0 else _ScaleGradient.apply(output, scale)

    return hook


GAMMA_STABILISER = 1e-6  # added to each gamma rule's denominator with its sign (+ for 0), as zennit's default


def _gamma_hook(gamma: float):
    """The generalised gamma rule on an ``nn.Linear`` or ``nn.Conv2d`` (module docstring), in gradient form.

    The output keeps its value; its gradient with respect to the input becomes ``Σ_j g_j y_j / z_j · ∂f_j/∂x``, where
    ``f_j = lin_j + gamma · P_j`` for ``y_j > 0`` (``P``: the sum of the positive contributions ``(x_i w_ij)⁺``) and
    ``lin_j + gamma · N_j`` for ``y_j < 0`` (``N = lin - P``, the negative ones), ``z_j`` is ``f_j`` with the bias and
    ``gamma`` times its positive (negative) part, and ``g_j y_j`` is the relevance arriving at output ``j``. So input
    ``i`` receives ``x_i · gradient_i = Σ_j x_i (w_ij + gamma w_ij^±) / z_j · R_j``: the rule's share.
    """

    def contributions(module: nn.Module, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if isinstance(module, nn.Linear):
            return F.linear(x, weight)
        return module._conv_forward(x, weight, None)

    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        x = args[0]
        weight = module.weight.detach()
        bias = module.bias.detach() if module.bias is not None else weight.new_zeros(weight.shape[0])
        if isinstance(module, nn.Conv2d):
            bias = bias[:, None, None]
        positive = contributions(module, x.clamp(min=0), weight.clamp(min=0)) + contributions(
            module, x.clamp(max=0), weight.clamp(max=0)
        )  # Σ_i (x_i w_ij)⁺
        linear = output - bias  # Σ_i x_i w_ij, through the layer's own graph
        agreeing = torch.where(output > 0, positive, linear - positive)
        with torch.no_grad():
            y = output.detach()
            denominator = y + gamma * (agreeing + torch.where(y > 0, bias.clamp(min=0), bias.clamp(max=0)))
            denominator = denominator + GAMMA_STABILISER * torch.where(denominator >= 0, 1.0, -1.0)
            factor = torch.where(y != 0, y / denominator, 0.0)  # an output of 0 passes nothing on
        surrogate = factor * (linear + gamma * agreeing)
        return y + (surrogate - surrogate.detach())  # the value of y, the gradient of the rule

    return hook


def _sequence_pool_rule(module: SequencePool, variant: Variant) -> Any:
    """The hook of a :class:`~vit.layers.SequencePool` (module docstring): CP-LRP stops the gradient at the score's
    input, AttnLRP halves it at the pool's output."""
    if variant == "cp":
        return module.score.register_forward_pre_hook(_scale_input_hook(0.0))
    return module.register_forward_hook(_scale_output_hook(0.5, set()))


def _mark_ran(ran: dict[int, str], name: str):
    def hook(module: nn.Module, args: tuple) -> None:
        ran[id(module)] = name

    return hook


# MLPs whose output multiplies two branches of its input (SwiGLUPacked is a GluMlp): no rule covers the product.
_PRODUCT_MLPS: tuple[type[nn.Module], ...] = (GluMlp, SwiGLU, GatedMlp)


def _refuse_products(model: nn.Module) -> None:
    """Raise if ``model`` holds a module whose forward multiplies two branches (see :data:`_PRODUCT_MLPS`)."""
    for name, module in model.named_modules():
        if isinstance(module, _PRODUCT_MLPS):
            raise ValueError(
                f"{name or 'the model'} is a {type(module).__name__}, a gated MLP multiplying two branches, which "
                "LRP's rules do not cover: use a Block with timm's Mlp, or another method (e.g. 'ig')"
            )


def _detach_denominator(module: nn.Module, args: tuple) -> tuple:
    numerator, denominator = args
    return numerator, denominator.detach()


def check_gamma(gamma: float, embed_gamma: float | None) -> tuple[float, float]:
    """``(gamma, embed_gamma)`` with ``embed_gamma=None`` read as ``gamma``.

    Raises:
        ValueError: If either is negative or not finite.
    """
    embed_gamma = gamma if embed_gamma is None else embed_gamma
    for name, value in (("gamma", gamma), ("embed_gamma", embed_gamma)):
        if not (isinstance(value, (int, float)) and 0.0 <= value < float("inf")):
            raise ValueError(f"{name} must be a finite number >= 0 (0: the LRP-0 rule), got {value!r}")
    return float(gamma), float(embed_gamma)


@contextlib.contextmanager
def relevance_rules(
    model: nn.Module, variant: Variant = "attnlrp", gamma: float = 0.0, embed_gamma: float | None = None
) -> Iterator[None]:
    """Install the rules of ``variant`` on ``model`` as forward hooks for the ``with`` block (module docstring).

    Gradient x input of the model's output taken inside the block is the relevance. On exit the hooks are removed
    (also on an error), and it is checked that every attention module that ran went through its hooked ``q_norm``
    and ``k_norm`` (an attention path that does not would escape the attention rule).

    Args:
        model: Any module; its LayerNorms, element-wise activations and :class:`~vit.layers.Attention`,
            :class:`~vit.layers.CrossAttention` and :class:`~vit.layers.LinearAttention` modules get the rules.
        variant: ``"attnlrp"`` or ``"cp"``.
        gamma: The gamma rule's parameter on every ``nn.Linear``; 0: LRP-0 (no hook).
        embed_gamma: The same on every ``nn.Conv2d`` (the patch projection, the stem); ``None``: ``gamma``.

    Raises:
        ValueError: On an unknown variant, a negative gamma, or if the model holds a gated MLP (a product of two
            branches).
        RuntimeError: If an attention module ran without its ``q_norm`` / ``k_norm``, or the model is already being
            explained (by another thread).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    gamma, embed_gamma = check_gamma(gamma, embed_gamma)
    _refuse_products(model)
    with _ACTIVE_LOCK:
        if model in _ACTIVE:
            raise RuntimeError(f"{type(model).__name__} is already being explained (another thread?): rules stack")
        _ACTIVE.add(model)
    handles: list[Any] = []
    ran: dict[int, str] = {}
    normed: set[int] = set()
    try:
        for module in model.modules():  # norms and activations first: a q_norm's scaling hook must run after it
            if isinstance(module, nn.LayerNorm):
                handles.append(module.register_forward_hook(_layer_norm_hook))
            elif isinstance(module, nn.RMSNorm):
                handles.append(module.register_forward_hook(_rms_norm_hook))
            elif isinstance(module, (*_ELEMENTWISE, EluPlusOne)):
                with torch.no_grad():
                    offset = float(module(torch.zeros(())))
                handles.append(module.register_forward_hook(_identity_rule_hook(offset)))
            elif isinstance(module, nn.Linear) and gamma > 0:
                handles.append(module.register_forward_hook(_gamma_hook(gamma)))
            elif isinstance(module, nn.Conv2d) and embed_gamma > 0:
                handles.append(module.register_forward_hook(_gamma_hook(embed_gamma)))
            elif isinstance(module, SequencePool):
                handles.append(_sequence_pool_rule(module, variant))
        for name, module in model.named_modules():
            if not isinstance(module, (Attention, CrossAttention)):
                continue
            handles.append(module.register_forward_pre_hook(_mark_ran(ran, name)))
            linear = isinstance(module, LinearAttention)
            if variant == "cp":
                qk_scale, out_scale = 0.0, 1.0
            else:
                qk_scale, out_scale = (1.0, 1 / 3) if linear else (0.5, 0.5)
            for norm in (module.q_norm, module.k_norm):
                if qk_scale != 1.0:
                    handles.append(norm.register_forward_hook(_scale_output_hook(qk_scale, normed)))
                else:
                    handles.append(norm.register_forward_hook(lambda m, a, o: normed.add(id(m))))
            if out_scale != 1.0:
                handles.append(module.proj.register_forward_pre_hook(_scale_input_hook(out_scale)))
            if linear and variant == "attnlrp":
                normalise = getattr(module, "normalise", None)
                if not isinstance(normalise, Normalise):
                    raise RuntimeError(f"{name}: LinearAttention without its Normalise submodule")
                handles.append(normalise.register_forward_pre_hook(_detach_denominator))
        norm_owner = {
            id(m): (id(m.q_norm), id(m.k_norm)) for m in model.modules() if isinstance(m, (Attention, CrossAttention))
        }
        yield
        missing = [name for key, name in ran.items() if not set(norm_owner[key]) <= normed]
        if missing:
            raise RuntimeError(
                f"attention {missing} ran without calling q_norm and k_norm: its q / k escape the attention rule"
            )
    finally:
        for handle in handles:
            handle.remove()
        with _ACTIVE_LOCK:
            _ACTIVE.discard(model)


def lrp(
    model: nn.Module,
    images: torch.Tensor,
    target: Any = None,
    variant: Variant = "attnlrp",
    gamma: float = 0.0,
    embed_gamma: float | None = None,
) -> LRPResult:
    """Relevance of every pixel and patch for a target class, by AttnLRP or CP-LRP (module docstring).

    One forward and one backward pass (``torch.autograd.grad`` with respect to the images, so no parameter gets a
    ``.grad``); the images of a batch do not interact, so a batch equals its images one by one. The model is left
    as it was: hooks removed, ``training`` flags restored, ``requires_grad`` untouched.

    Args:
        model: A :class:`~vit.VisionTransformer` (``patch_embed.patch_size``) or any classifier whose attention
            layers are vit's.
        images: ``(B, C, H, W)`` normalised as the model expects; moved to the model's device.
        target: Class per image (tensor, list or one int for all); ``None`` explains the predicted class.
        variant: ``"attnlrp"`` (Achtibat et al. 2024) or ``"cp"`` (Ali et al. 2022).
        gamma: The gamma rule on the linear layers (module docstring); 0, the default: LRP-0, the rules of the
            papers. :func:`~vit.explain.tune_gamma` chooses it for a model by measured faithfulness.
        embed_gamma: The gamma rule on the convolutions (patch projection, stem); ``None``: ``gamma``.

    Returns:
        An :class:`LRPResult` on the model's device, detached: signed pixel relevance, its patch sums, the targets
        and the logits.

    Raises:
        ValueError: On an unknown variant, a negative gamma, a target out of range or of the wrong length, or a gated
            MLP in the model.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    param = next(model.parameters(), None)
    if param is not None:
        images = images.to(param.device)
    x = images.detach().requires_grad_(True)
    with relevance_rules(model, variant, gamma, embed_gamma), eval_mode(model), torch.enable_grad():
        logits = model.forward(x)  # eager even after model.compile(): the hooks must run
        target = resolve_target(target, logits.detach())
        (grad,) = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), x)
    pixels = (x.detach() * grad).sum(dim=1)  # (B, H, W)
    return LRPResult(pixels, patch_sums(model, pixels), target, logits.detach())


def patch_sums(model: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """Sum a ``(B, H, W)`` pixel map over the model's patches: ``(B, grid_h, grid_w)``.

    The grid is the patch embedding's for this input size (``dynamic_feat_size``), so an input that
    ``dynamic_img_pad`` pads up to whole patches sums over the padded grid, the padding counting zero.
    """
    B, H, W = pixels.shape
    embed = model.patch_embed
    ph, pw = embed.patch_size
    gh, gw = embed.dynamic_feat_size((H, W)) if hasattr(embed, "dynamic_feat_size") else (H // ph, W // pw)
    pixels = F.pad(pixels, (0, gw * pw - W, 0, gh * ph - H))  # zeros at the bottom and right, as the model pads
    return pixels.reshape(B, gh, ph, gw, pw).sum(dim=(2, 4))
