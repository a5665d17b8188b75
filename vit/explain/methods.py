"""One registry of explanation methods, each ``(model, images, target=None, **options) -> MethodMap``.

The project's own maps: attention rollout (Abnar & Zuidema, ACL 2020), class-specific attribution (Chefer et al.,
ICCV 2021), AttnLRP (Achtibat et al., ICML 2024) and CP-LRP (Ali et al., ICML 2022); the baselines, from the
libraries that maintain them: integrated gradients (Sundararajan et al., "Axiomatic Attribution for Deep Networks",
ICML 2017) through captum, Grad-CAM (Selvaraju et al., ICCV 2017) through ``grad-cam`` (pytorch-grad-cam) with the
reshape of ViT tokens to their grid, plain gradient x input (Shrikumar et al., 2016), and the raw attention of the
last block. captum and grad-cam are the optional ``explain`` extra: ``pip install "vit[explain]"``.

Every method returns patch-level relevance ``(B, grid_h, grid_w)`` (higher = more relevant; negative, for the
methods declared ``signed``, is evidence against the class), and a pixel map
``(B, H, W)`` where the method has one::

    from vit.explain import METHODS, explain_map
    maps = explain_map(model, images, "attnlrp")  # maps.patches, maps.pixels
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..layers.utils import eval_mode
from .attribution import attention_attribution, resolve_target
from .capture import attention_modules, pool_module
from .lrp import lrp, patch_sums
from .rollout import head_pool, rollout_grid, rollout_map

EXTRA_HINT = 'pip install "vit[explain]"'
DEFAULT_METHOD = "attnlrp"
"""The map the project shows by default (README picture, ``vit explain``, the training-time grids, the report): the
one measured most faithful, by the symmetric relevance gain under three ways of removing a patch, among the methods a
plain install has, on the quickstart and ``cifar10_cpu`` models (``docs/results/faithfulness.json``): first in four of
the five model x removal cells; with token drop on ``cifar10_cpu`` Chefer's attribution is ahead, unless AttnLRP's
gamma rule is tuned for the model (``vit explain --tune``: then AttnLRP is ahead or level with integrated gradients
under all three removals there). Integrated gradients is level or ahead in some cells but costs several times as much
and needs the ``explain`` extra."""


@dataclass
class MethodMap:
    """One method's explanation of a batch.

    Attributes:
        patches: ``(B, grid_h, grid_w)`` relevance per patch, higher = more relevant.
        pixels: ``(B, H, W)`` relevance per pixel, or ``None`` for methods defined on patches only.
        target: ``(B,)`` the class explained, or ``None`` for class-agnostic methods (rollout, attention).
    """

    patches: torch.Tensor
    pixels: torch.Tensor | None = None
    target: torch.Tensor | None = None


@dataclass(frozen=True)
class Method:
    """A registered method.

    Attributes:
        name: Its name in :data:`METHODS`.
        fn: ``fn(model, images, target=None, **options) -> MethodMap``.
        summary: One line for listings.
        class_specific: Whether the map depends on the target class.
        needs: Module names the method imports (an optional extra), checked before it runs.
        reason_not_applicable: ``f(model) -> str | None``: why the method cannot explain ``model``, or ``None``.
        fixed_grid: Whether the method reads the model's own patch grid, so that images of another size (on a
            ``dynamic_img_size`` model) are refused.
        signed: Whether the map is signed (evidence against the class is negative): drawn on a diverging colour map
            centred on zero (:mod:`vit.explain.colors`). Rollout, attention, Chefer's attribution (the positive part
            of each update) and Grad-CAM (a ReLU) are non-negative by construction.
        from_record: ``f(model, record, **options) -> (B, grid_h, grid_w)``: the same map read from attention already
            recorded in a forward pass (:func:`~vit.explain.record_attention`), so that :func:`~vit.explain.explain`
            needs no second pass for it; ``None`` for methods that need their own.
    """

    name: str
    fn: Callable[..., MethodMap]
    summary: str
    class_specific: bool
    needs: tuple[str, ...] = ()
    reason_not_applicable: Callable[[nn.Module], str | None] = lambda model: None
    fixed_grid: bool = False
    signed: bool = False
    from_record: Callable[..., torch.Tensor] | None = None


def _require(module: str, method: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"method {method!r} needs the {module.split('.')[0]} package: {EXTRA_HINT}") from error


def _device_images(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    param = next(model.parameters(), None)
    return images.to(param.device) if param is not None else images


def _pixels_result(model: nn.Module, pixels: torch.Tensor, target: torch.Tensor | None) -> MethodMap:
    return MethodMap(patch_sums(model, pixels), pixels, target)


def rollout_method(model: nn.Module, images: torch.Tensor, target: Any = None, **options: Any) -> MethodMap:
    """Attention rollout (class-agnostic; ``target`` is ignored); options go to :func:`rollout_map`."""
    return MethodMap(rollout_map(model, images, **options))


def attribution_method(model: nn.Module, images: torch.Tensor, target: Any = None) -> MethodMap:
    """Chefer et al.'s class-specific attribution (:func:`attention_attribution`)."""
    images = _device_images(model, images)
    if target is None:  # the classes explained, for the result (given ones are checked by the attribution)
        with eval_mode(model), torch.no_grad():
            target = model.forward(images).argmax(dim=-1)
    target = torch.as_tensor(target, dtype=torch.long, device=images.device).flatten().expand(len(images))
    return MethodMap(attention_attribution(model, images, target), target=target)


def attnlrp_method(
    model: nn.Module, images: torch.Tensor, target: Any = None, gamma: float = 0.0, embed_gamma: float | None = None
) -> MethodMap:
    """AttnLRP (:func:`~vit.explain.lrp`, ``variant="attnlrp"``), with its gamma rule's options."""
    result = lrp(model, images, target, variant="attnlrp", gamma=gamma, embed_gamma=embed_gamma)
    return MethodMap(result.patches, result.pixels, result.target)


def cp_lrp_method(
    model: nn.Module, images: torch.Tensor, target: Any = None, gamma: float = 0.0, embed_gamma: float | None = None
) -> MethodMap:
    """CP-LRP (:func:`~vit.explain.lrp`, ``variant="cp"``), with its gamma rule's options."""
    result = lrp(model, images, target, variant="cp", gamma=gamma, embed_gamma=embed_gamma)
    return MethodMap(result.patches, result.pixels, result.target)


def gradient_x_input(model: nn.Module, images: torch.Tensor, target: Any = None) -> MethodMap:
    """Plain gradient x input, summed over channels: one forward and one backward pass, no rules."""
    x = _device_images(model, images).detach().requires_grad_(True)
    with eval_mode(model), torch.enable_grad():
        logits = model.forward(x)
        target = resolve_target(target, logits.detach())
        (grad,) = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), x)
    return _pixels_result(model, (x.detach() * grad).sum(dim=1), target)


def integrated_gradients(
    model: nn.Module, images: torch.Tensor, target: Any = None, n_steps: int = 16, internal_batch_size: int = 64
) -> MethodMap:
    """Integrated gradients through ``captum.attr.IntegratedGradients`` from the zero image (the dataset mean after
    normalisation), summed over channels.

    Args:
        model: Classifier returning logits.
        images: ``(B, C, H, W)`` normalised.
        target: Class per image; ``None``: the prediction.
        n_steps: Points of the Gauss-Legendre path integral (captum's default method).
        internal_batch_size: Images x steps per forward pass.
    """
    captum_attr = _require("captum.attr", "ig")
    x = _device_images(model, images).detach()
    with eval_mode(model):
        with torch.no_grad():
            target = resolve_target(target, model.forward(x))
        ig = captum_attr.IntegratedGradients(model.forward)
        attributions = ig.attribute(
            x, baselines=torch.zeros_like(x), target=target, n_steps=n_steps, internal_batch_size=internal_batch_size
        )
    return _pixels_result(model, attributions.detach().sum(dim=1), target)


def _needs_patch_grid(model: nn.Module) -> str | None:
    if not hasattr(getattr(model, "patch_embed", None), "patch_size"):
        return f"its patch map reads model.patch_embed.patch_size, which {type(model).__name__} does not have"
    return None


def _needs_vit_tokens(model: nn.Module) -> str | None:
    for attribute in ("blocks", "num_prefix_tokens"):
        if not hasattr(model, attribute):
            return f"it reads model.{attribute}, which {type(model).__name__} does not have"
    return _needs_patch_grid(model)


def _needs_dense_attention(model: nn.Module) -> str | None:
    try:
        attention_modules(model)
    except ValueError as error:
        return str(error)
    if getattr(model, "dist_token", None) is not None:
        return "it averages a class and a distillation head (DeiT), which read different rows of the attention"
    return _needs_vit_tokens(model)


def grad_cam(model: nn.Module, images: torch.Tensor, target: Any = None, layer: int = -1) -> MethodMap:
    """Grad-CAM through ``pytorch_grad_cam.GradCAM`` on ``blocks[layer].norm1`` (the tokens entering the block's
    attention), the prefix tokens dropped and the patch tokens reshaped to the grid; the pixel map is grad-cam's
    (upsampled, scaled to [0, 1] per image), the patch map its mean over each patch.

    The model is left as it was: parameters are frozen for the call (so no ``.grad`` is written; grad-cam's
    ``zero_grad`` is undone), flags restored, grad-cam's hooks released.
    """
    cam_module = _require("pytorch_grad_cam", "gradcam")
    targets_module = _require("pytorch_grad_cam.utils.model_targets", "gradcam")
    x = _device_images(model, images).detach()
    P, (rows, cols) = model.num_prefix_tokens, model.patch_embed.grid_size

    def tokens_to_grid(tokens: torch.Tensor) -> torch.Tensor:  # (B, P + N, C) -> (B, C, rows, cols)
        return tokens[:, P:].reshape(tokens.shape[0], rows, cols, -1).permute(0, 3, 1, 2)

    params = list(model.parameters())
    saved = [(p.requires_grad, p.grad) for p in params]
    try:
        with eval_mode(model):
            with torch.no_grad():
                target = resolve_target(target, model.forward(x))
            for p in params:
                p.requires_grad_(False)
            targets = [targets_module.ClassifierOutputTarget(int(t)) for t in target]
            with cam_module.GradCAM(model, [model.blocks[layer].norm1], reshape_transform=tokens_to_grid) as cam:
                pixels = cam(input_tensor=x.requires_grad_(True), targets=targets)  # (B, H, W) numpy in [0, 1]
    finally:
        for p, (flag, grad) in zip(params, saved, strict=True):
            p.requires_grad_(flag)
            p.grad = grad
    pixels = torch.from_numpy(pixels).to(x.device, torch.float32)
    B, H, W = pixels.shape
    patches = pixels.reshape(B, rows, H // rows, cols, W // cols).mean(dim=(2, 4))
    return MethodMap(patches, pixels, target)


def last_block_attention(model: nn.Module, images: torch.Tensor, target: Any = None) -> MethodMap:
    """The raw attention of the last block, head mean: the class-token row over the patches; with an
    attention-pooling head its latents' attention (mean over latents); otherwise the mean of the patch rows."""
    modules = attention_modules(model)
    head = pool_module(model)
    captured: dict[str, torch.Tensor] = {}

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        captured["block"] = module.attention_weights(args[0] if args else kwargs["x"])

    def pool_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        captured["pool"] = module.attention_weights(args[0] if args else kwargs["x"])

    handles = [modules[-1].register_forward_pre_hook(hook, with_kwargs=True)]
    if head is not None:
        handles.append(head.register_forward_pre_hook(pool_hook, with_kwargs=True))
    try:
        with eval_mode(model), torch.no_grad():
            model.forward(_device_images(model, images))
    finally:
        for handle in handles:
            handle.remove()
    P, (rows, cols) = model.num_prefix_tokens, model.patch_embed.grid_size
    pool = head_pool(model)
    if pool == "map":
        relevance = captured["pool"].float().mean(dim=(1, 2))  # (B, num_patches)
    elif pool == "token":
        relevance = captured["block"][:, :, 0, P:].float().mean(dim=1)
    else:
        relevance = captured["block"][:, :, P:, P:].float().mean(dim=(1, 2))
    return MethodMap(relevance.reshape(-1, rows, cols))


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "rollout",
            rollout_method,
            "attention rollout (Abnar & Zuidema 2020)",
            False,
            (),
            _needs_dense_attention,
            fixed_grid=True,
            from_record=rollout_grid,
        ),  # fmt: skip
        Method(
            "attribution",
            attribution_method,
            "gradient-weighted attention (Chefer et al. 2021)",
            True,
            (),
            _needs_dense_attention,
            fixed_grid=True,
        ),  # fmt: skip
        Method("attnlrp", attnlrp_method, "AttnLRP (Achtibat et al. 2024)", True, (), _needs_patch_grid, signed=True),
        Method("cp_lrp", cp_lrp_method, "CP-LRP (Ali et al. 2022)", True, (), _needs_patch_grid, signed=True),
        Method(
            "ig",
            integrated_gradients,
            "integrated gradients, captum",
            True,
            ("captum",),
            _needs_patch_grid,
            signed=True,
        ),  # fmt: skip
        Method(
            "gradcam",
            grad_cam,
            "Grad-CAM on the last block's tokens, grad-cam",
            True,
            ("pytorch_grad_cam",),
            _needs_vit_tokens,
            fixed_grid=True,
        ),  # fmt: skip
        Method("gradxinput", gradient_x_input, "plain gradient x input", True, (), _needs_patch_grid, signed=True),
        Method(
            "attention",
            last_block_attention,
            "the last block's raw attention",
            False,
            (),
            _needs_dense_attention,
            fixed_grid=True,
        ),  # fmt: skip
    )
}
ALIASES = {"cp": "cp_lrp", "chefer": "attribution", "integrated_gradients": "ig", "grad_cam": "gradcam"}


def applicable_methods(model: nn.Module) -> list[str]:
    """Names of the methods in :data:`METHODS` that can explain ``model``."""
    return [name for name, m in METHODS.items() if m.reason_not_applicable(model) is None]


def get_method(name: str, model: nn.Module | None = None) -> Method:
    """The registered method ``name`` (or an alias such as ``"cp"``), checked against ``model`` when given.

    Raises:
        ValueError: On an unknown name, or a method that cannot explain ``model``; the message names those that can.
    """
    method = METHODS.get(ALIASES.get(name, name))
    if method is None:
        names = applicable_methods(model) if model is not None else list(METHODS)
        raise ValueError(f"unknown explanation method {name!r}: choose from {', '.join(names)}")
    if model is not None:
        reason = method.reason_not_applicable(model)
        if reason is not None:
            raise ValueError(
                f"method {name!r} does not apply to this model ({reason}): use one of "
                f"{', '.join(applicable_methods(model)) or 'none'}"
            )
    return method


def check_image_size(name: str, model: nn.Module, images: torch.Tensor) -> None:
    """Refuse images of another size than the model's own for a method that reads the model's fixed patch grid.

    Raises:
        ValueError: Naming the size the method needs and the methods that take any size.
    """
    method = get_method(name)
    embed = getattr(model, "patch_embed", None)
    if not method.fixed_grid or getattr(embed, "grid_size", None) is None:
        return  # no grid to compare with: the method's own applicability check speaks
    (ph, pw), (rows, cols) = embed.patch_size, embed.grid_size
    h, w = int(images.shape[-2]), int(images.shape[-1])
    if (h // ph, w // pw) != (rows, cols):
        raise ValueError(
            f"method {method.name!r} needs images of the model's own size {rows * ph}x{cols * pw} (got {h}x{w}); "
            f"{', '.join(n for n, m in METHODS.items() if not m.fixed_grid)} take any size"
        )


def require_extras(name: str) -> None:
    """Import what method ``name`` needs from the ``explain`` extra, before anything runs.

    Raises:
        ValueError: On an unknown name (naming the known ones).
        ImportError: If a package of the extra is missing (naming the install command).
    """
    method = get_method(name)
    for module in method.needs:
        _require(module, method.name)


def explain_map(model: nn.Module, images: torch.Tensor, method: str, target: Any = None, **options: Any) -> MethodMap:
    """Explain ``images`` with the registered ``method``.

    Args:
        model: The classifier (a :class:`~vit.VisionTransformer` for every method but ``ig`` and ``gradxinput``,
            which need its patch grid only for the patch map).
        images: ``(B, C, H, W)`` normalised as the model expects.
        method: A name in :data:`METHODS` (or an alias: ``cp``, ``chefer``, ``integrated_gradients``, ``grad_cam``).
        target: Class per image (tensor, list or int); ``None``: the prediction. Ignored by class-agnostic methods.
        **options: The method's own options (``n_steps`` for ``ig``, ``head_fusion`` for ``rollout``, ...).

    Returns:
        A :class:`MethodMap` with ``(B, grid_h, grid_w)`` patches.

    Raises:
        ValueError: On an unknown method or one that cannot explain ``model`` (naming those that can), or images of
            another size than the model's for a method that reads its fixed grid.
        ImportError: If the method needs the ``explain`` extra and it is not installed (naming the install command).
    """
    chosen = get_method(method, model)
    check_image_size(chosen.name, model, images)
    for module in chosen.needs:
        _require(module, chosen.name)
    return chosen.fn(model, images, target, **options)
