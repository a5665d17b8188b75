"""Class-specific attribution: attention weighted by its gradient, accumulated over the blocks.

Chefer, Gur & Wolf, "Generic Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder
Transformers" (ICCV 2021), rule for a self-attention encoder. With ``y`` the logit of the target class, and per
block ``A`` its attention weights ``(B, heads, N, N)`` and ``∇A = ∂y/∂A``:

    R = I (N × N);  for each block in forward order:  R ← R + mean_heads((∇A ⊙ A)⁺) · R

The map is the class-token row of ``R`` over the patch columns (raw, not normalised); without a class token
(``global_pool="avg"``) it is the mean of ``R``'s patch rows over the patch columns. Unlike rollout it depends on
the class explained, and only attention that *raises* the target logit counts.

With an attention-pooling head (``global_pool="map"``) the map ends at the latent query, the rule of the paper for
a query that reads a context through cross-attention only (it has no self-attention, so its own relevance starts
at zero): with ``A_p`` the head's weights ``(B, heads, latent_len, num_patches)`` and ``∇A_p = ∂y/∂A_p``,

    r = mean_latents(mean_heads((∇A_p ⊙ A_p)⁺)) · R[patches, patches]

Compared with jacobgil/vit-explain's gradient rollout, ``R`` accumulates additively (no renormalisation, no
discard), heads are averaged after the positive part is taken, and every sample of the batch is explained (not
only element 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..layers.utils import eval_mode
from .capture import attention_modules, pool_module
from .rollout import RolloutPool, _check_pool_attention, head_pool


def relevance_from_gradients(
    attentions: Sequence[torch.Tensor],
    gradients: Sequence[torch.Tensor],
    num_prefix_tokens: int = 1,
    pool: RolloutPool = "token",
    pool_attention: torch.Tensor | None = None,
    pool_gradient: torch.Tensor | None = None,
) -> torch.Tensor:
    """Apply the update ``R ← R + mean_heads((∇A ⊙ A)⁺) · R`` block by block and read the patch relevance.

    Args:
        attentions: Per-block weights ``(B, heads, N, N)`` in forward order.
        gradients: ``∂y/∂A`` of the same shapes.
        num_prefix_tokens: Class and register tokens at the start of the sequence.
        pool: ``"token"``: class-token row over patch columns; ``"avg"``: mean of the patch rows over patch columns;
            ``"map"``: the latent query's row (module docstring), from ``pool_attention`` and ``pool_gradient``.
        pool_attention: The pooling head's weights ``(B, heads, latent_len, N - num_prefix_tokens)``, for ``"map"``.
        pool_gradient: ``∂y/∂pool_attention``, same shape.

    Returns:
        ``(B, N - num_prefix_tokens)`` raw relevance per patch, row-major grid order, float32 (float64 if given).

    Raises:
        ValueError: On mismatched shapes, no blocks, ``pool="token"`` without a class token, or no patch tokens.
    """
    if len(attentions) == 0 or len(attentions) != len(gradients):
        raise ValueError(f"need one gradient per attention map, got {len(attentions)} and {len(gradients)}")
    for i, (attn, grad) in enumerate(zip(attentions, gradients, strict=True)):
        if attn.ndim != 4 or attn.shape != grad.shape or attn.shape != attentions[0].shape:
            raise ValueError(f"block {i}: attention {tuple(attn.shape)} and gradient {tuple(grad.shape)} must match")
    if pool not in ("token", "avg", "map"):
        raise ValueError(f"pool must be 'token', 'avg' or 'map', got {pool!r}")
    if pool == "token" and num_prefix_tokens < 1:
        raise ValueError("pool='token' needs a class token (num_prefix_tokens >= 1); use pool='avg'")
    B, _, N, _ = attentions[0].shape
    P = num_prefix_tokens
    if not 0 <= P < N:
        raise ValueError(f"sequence length {N} leaves no patch tokens after {P} prefix tokens")
    if pool == "map":
        _check_pool_attention(pool_attention, B, N - P)
        if pool_gradient is None or pool_gradient.shape != pool_attention.shape:
            raise ValueError("pool='map' needs pool_gradient of the shape of pool_attention")
    dtype = torch.float64 if attentions[0].dtype == torch.float64 else torch.float32
    relevance = torch.eye(N, dtype=dtype, device=attentions[0].device).expand(B, N, N)
    for attn, grad in zip(attentions, gradients, strict=True):
        cam = (grad.to(dtype) * attn.to(dtype)).clamp(min=0).mean(dim=1)  # (B, N, N): heads fused after ReLU
        relevance = relevance + cam @ relevance
    if pool == "token":
        return relevance[:, 0, P:]
    if pool == "map":
        cam = (pool_gradient.to(dtype) * pool_attention.to(dtype)).clamp(min=0).mean(dim=1).mean(dim=1)  # (B, Np)
        return (cam[:, None] @ relevance[:, P:, P:])[:, 0]
    return relevance[:, P:, P:].mean(dim=1)


def resolve_target(target: Any, logits: torch.Tensor) -> torch.Tensor:
    """Class index per image ``(B,)``: ``target`` checked against ``logits (B, classes)``, or the argmax if None.

    Raises:
        ValueError: If ``target`` has neither one nor ``B`` entries, or names a class outside the logits.
    """
    B, num_classes = logits.shape
    if target is None:
        return logits.argmax(dim=-1)
    target = torch.as_tensor(target, dtype=torch.long, device=logits.device).flatten()
    if target.numel() == 1 and B > 1:
        target = target.expand(B)
    if target.numel() != B:
        raise ValueError(f"target has {target.numel()} class indices for {B} images: give one per image")
    bad = target[(target < 0) | (target >= num_classes)]
    if bad.numel():
        raise ValueError(
            f"target class {int(bad[0])} out of range: the model has {num_classes} classes (0..{num_classes - 1})"
        )
    return target


def attention_attribution(model: nn.Module, images: torch.Tensor, target: Any = None) -> torch.Tensor:
    """Gradient-weighted attention relevance of every patch for a target class (Chefer et al., ICCV 2021).

    One forward and one backward pass. During the forward pass a temporary hook on each block's attention module
    recomputes its output from the dense weights ``A = attn.attention_weights(x)`` (window and sliding blocks give
    their full ``N × N`` pattern with zeros outside it), so that ``∂y/∂A`` exists; ``torch.autograd.grad`` then
    takes it for the sum of the target logits (images do not interact, so a batch equals its images one by one).
    The model is left as it was: ``training`` flags restored, no hook left, no ``.grad`` written to parameters.
    An attention-pooling head is hooked the same way (its ``apply_weights`` and ``pool_latents``), and the map ends
    at its latent query (module docstring).

    Args:
        model: A :class:`~vit.VisionTransformer` (``blocks[i].attn`` with ``attention_weights``, ``qkv``,
            ``split_qkv`` and ``proj``; ``num_prefix_tokens``, ``has_class_token``, ``patch_embed.grid_size``).
        images: ``(B, C, H, W)`` normalised as the model expects; moved to the model's device.
        target: Class index per image (tensor, list or one int for all); ``None`` explains the predicted class.

    Returns:
        ``(B, grid_h, grid_w)`` raw relevance (float32, detached, on the model's device).

    Raises:
        ValueError: On a target out of range or of the wrong length, or a model without dense attention weights.
        RuntimeError: If a block's dense weights do not reproduce its output (an attention module this rule
            cannot read).
    """
    modules = attention_modules(model)
    attentions: dict[int, torch.Tensor] = {}

    def make_hook(index: int):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
            x = args[0] if args else kwargs["x"]
            mask = args[1] if len(args) > 1 else kwargs.get("attn_mask")
            attn = module.attention_weights(x) if mask is None else module.attention_weights(x, mask)
            B, N, C = x.shape
            v = module.split_qkv(module.qkv(x))[2]  # (B, heads, N, head_dim)
            out = module.proj_drop(module.proj((attn @ v).transpose(1, 2).reshape(B, N, C)))
            expected = output.detach()
            tolerance = 1e-4 * float(expected.abs().max()) + 1e-6
            if out.dtype in (torch.float32, torch.float64) and not torch.allclose(out, expected, 1e-3, tolerance):
                raise RuntimeError(
                    f"blocks[{index}].attn: its dense attention_weights do not reproduce its output, "
                    "so ∂y/∂A cannot be taken from them"
                )
            attentions[index] = attn
            return out

        return hook

    head = pool_module(model)

    def pool_hook(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
        x = args[0] if args else kwargs["x"]
        key_mask = args[1] if len(args) > 1 else kwargs.get("key_mask")
        attn = module.attention_weights(x, key_mask)
        out = module.pool_latents(module.apply_weights(attn, x))
        expected = output.detach()
        tolerance = 1e-4 * float(expected.abs().max()) + 1e-6
        if out.dtype in (torch.float32, torch.float64) and not torch.allclose(out, expected, 1e-3, tolerance):
            raise RuntimeError("attn_pool: its dense attention_weights do not reproduce its output")
        attentions[-1] = attn
        return out

    param = next(model.parameters(), None)
    if param is not None:
        images = images.to(param.device)
    handles = []
    try:
        for i, module in enumerate(modules):
            handles.append(module.register_forward_hook(make_hook(i), with_kwargs=True))
        if head is not None:
            handles.append(head.register_forward_hook(pool_hook, with_kwargs=True))
        with eval_mode(model), torch.enable_grad():
            # The input requires grad so that every A is in the graph even when the parameters are frozen.
            logits = model.forward(images.detach().requires_grad_(True))  # eager even after model.compile()
            target = resolve_target(target, logits.detach())
            score = logits.gather(1, target[:, None]).sum()
            missing = [i for i in range(len(modules)) if i not in attentions]
            if missing:
                raise RuntimeError(f"the forward pass never called the attention of blocks {missing}")
            order = [attentions[i] for i in range(len(modules))] + ([attentions[-1]] if head is not None else [])
            gradients = torch.autograd.grad(score, order)
    finally:
        for handle in handles:
            handle.remove()
    pool = head_pool(model)
    blocks = len(modules)
    relevance = relevance_from_gradients(
        [a.detach() for a in order[:blocks]],
        gradients[:blocks],
        num_prefix_tokens=model.num_prefix_tokens,
        pool=pool,
        pool_attention=order[blocks].detach() if head is not None else None,
        pool_gradient=gradients[blocks] if head is not None else None,
    )
    rows, cols = model.patch_embed.grid_size
    return relevance.reshape(-1, rows, cols)
