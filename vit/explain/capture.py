"""Capture the dense attention matrices of every block without changing the model.

Training runs through the fused kernels, which never materialise the ``N × N`` weights. Capture is opt-in: a
forward pre-hook on each block's attention module recomputes the matrix from that module's own weights with
``attn.attention_weights(x)`` on the exact input the block received, for one eval-mode, no-grad forward pass.
The hooks are removed and every module's ``training`` flag restored afterwards, so nothing persists.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The attention module of every block, in block order.

    Args:
        model: A model with ``model.blocks`` (an ``nn.Sequential`` or ``nn.ModuleList``) whose blocks have an
            ``attn`` module providing ``attention_weights(x)``.

    Raises:
        ValueError: If the model has no blocks or a block's ``attn`` lacks ``attention_weights``.
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Module) or len(list(blocks.children())) == 0:
        raise ValueError(
            f"{type(model).__name__} has no non-empty `blocks` container: capture_attention needs "
            "model.blocks[i].attn.attention_weights (vit.VisionTransformer provides it)"
        )
    modules = []
    for i, block in enumerate(blocks.children()):
        attn = getattr(block, "attn", None)
        if attn is None or not callable(getattr(attn, "attention_weights", None)):
            raise ValueError(
                f"blocks[{i}] ({type(block).__name__}) has no attn.attention_weights(x): use vit's Attention / "
                "WindowAttention or add a method returning the dense (B, heads, N, N) softmax"
            )
        modules.append(attn)
    return modules


@torch.no_grad()
def capture_attention(model: nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
    """Dense attention weights of every block for a batch of images.

    The model runs once in eval mode under ``torch.no_grad()``; a pre-hook on each ``block.attn`` records
    ``attn.attention_weights(x)`` for its input ``x``. Window blocks give the full ``N × N`` matrix with zeros
    outside their pattern. Afterwards the model is exactly as before: same ``training`` flag on every module,
    same fused-attention switches, no hooks left (also when the forward pass raises).

    Args:
        model: A model with ``model.blocks[i].attn.attention_weights`` (see :func:`attention_modules`).
        images: Batch ``(B, C, H, W)``, normalised as the model expects; moved to the model's device.

    Returns:
        One ``(B, heads, N, N)`` tensor per block, in block order; every row sums to 1.

    Raises:
        ValueError: If the model does not expose its blocks' attention (see :func:`attention_modules`).
        RuntimeError: If some block's attention module was not called by the forward pass.
    """
    modules = attention_modules(model)
    captured: dict[int, torch.Tensor] = {}

    def make_hook(index: int):
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0] if args else kwargs["x"]
            attn_mask = args[1] if len(args) > 1 else kwargs.get("attn_mask")
            if attn_mask is None:
                captured[index] = module.attention_weights(x)
            else:
                captured[index] = module.attention_weights(x, attn_mask)

        return hook

    training = {module: module.training for module in model.modules()}
    handles = []
    try:
        for i, module in enumerate(modules):
            handles.append(module.register_forward_pre_hook(make_hook(i), with_kwargs=True))
        model.eval()
        param = next(model.parameters(), None)
        if param is not None:
            images = images.to(param.device)
        forward_features = getattr(model, "forward_features", None)
        # The blocks are all we need: skip the head when the model splits its forward pass (timm convention).
        forward_features(images) if callable(forward_features) else model(images)
    finally:
        for handle in handles:
            handle.remove()
        for module, flag in training.items():
            module.training = flag
    missing = [i for i in range(len(modules)) if i not in captured]
    if missing:
        raise RuntimeError(f"the forward pass never called the attention of blocks {missing}")
    return [captured[i] for i in range(len(modules))]
