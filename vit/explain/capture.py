"""Capture the dense attention matrices of every block without changing the model.

Training runs through the fused kernels, which never materialise the ``N × N`` weights. Capture is opt-in: a
forward pre-hook on each block's attention module recomputes the matrix from that module's own weights with
``attn.attention_weights(x)`` on the exact input the block receives, during the model's ordinary forward pass
(:func:`record_attention`), so one pass gives both the logits and every block's attention. The hooks are removed
and every module's ``training`` flag restored afterwards, so nothing persists.

A model that pools with attention (``global_pool="map"``, its ``attn_pool`` head) has one more attention to record:
the head's cross-attention from its latent queries to the patch tokens, ``(B, heads, latent_len, num_patches)``,
kept beside the blocks' list as :attr:`AttentionRecord.pool`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ..layers.utils import eval_mode


class AttentionRecord(list):
    """One ``(B, heads, N, N)`` tensor per block, in block order, and the pooling head's cross-attention.

    Attributes:
        pool: ``(B, heads, latent_len, num_patches)`` weights of the latent queries of an attention-pooling head
            (``model.attn_pool``) over the patch tokens, or ``None`` when the model has no such head or the
            head did not run (a ``forward_features``-only pass).
    """

    pool: torch.Tensor | None = None


def pool_module(model: nn.Module) -> nn.Module | None:
    """The model's attention-pooling head (``model.attn_pool`` with ``attention_weights``), or ``None``."""
    attn_pool = getattr(model, "attn_pool", None)
    return attn_pool if callable(getattr(attn_pool, "attention_weights", None)) else None


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


@contextlib.contextmanager
def record_attention(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Record every block's dense attention weights during the forward passes run inside the ``with`` block.

    A forward pre-hook on each ``block.attn`` computes ``attn.attention_weights(x)`` (with the mask or the patch
    grid the block passes: a dynamic image size's ``grid_size``) on the exact input the block receives, while the
    model's normal forward pass runs: the caller runs the model however it likes (``model(images)`` for logits,
    ``forward_features`` for tokens) and gets the attention of that same pass. Hooks are removed on exit, also when
    the forward pass raises. Training flags and gradient mode are the caller's business (see
    :func:`capture_attention`).

    Args:
        model: A model with ``model.blocks[i].attn.attention_weights`` (see :func:`attention_modules`).

    Yields:
        An :class:`AttentionRecord` filled on exit with one ``(B, heads, N, N)`` tensor per block, in block order,
        and, for a model with an attention-pooling head that ran, the head's latent -> patch weights as ``.pool``
        (the last forward pass wins when several run).

    Raises:
        ValueError: If the model does not expose its blocks' attention (see :func:`attention_modules`).
        RuntimeError: On exit, if some block's attention module was not called.
    """
    modules = attention_modules(model)
    captured: dict[int, torch.Tensor] = {}

    def make_hook(index: int):
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0] if args else kwargs["x"]
            attn_mask = args[1] if len(args) > 1 else kwargs.get("attn_mask")
            grid_size = args[2] if len(args) > 2 else kwargs.get("grid_size")
            # A dynamic-size model passes the patch grid of this input; the model's own grid needs no argument,
            # so attention modules that know no grid keep working.
            extra = {} if grid_size is None else {"grid_size": grid_size}
            if attn_mask is None:
                captured[index] = module.attention_weights(x, **extra)
            else:
                captured[index] = module.attention_weights(x, attn_mask, **extra)

        return hook

    def pool_hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs["x"]
        key_mask = args[1] if len(args) > 1 else kwargs.get("key_mask")
        captured[-1] = module.attention_weights(x, key_mask)

    handles = [module.register_forward_pre_hook(make_hook(i), with_kwargs=True) for i, module in enumerate(modules)]
    head = pool_module(model)
    if head is not None:
        handles.append(head.register_forward_pre_hook(pool_hook, with_kwargs=True))
    result = AttentionRecord()
    try:
        yield result
    finally:
        for handle in handles:
            handle.remove()
    missing = [i for i in range(len(modules)) if i not in captured]
    if missing:
        raise RuntimeError(f"the forward pass never called the attention of blocks {missing}")
    result.extend(captured[i] for i in range(len(modules)))
    result.pool = captured.get(-1)


@torch.no_grad()
def capture_attention(model: nn.Module, images: torch.Tensor) -> AttentionRecord:
    """Dense attention weights of every block for a batch of images.

    The model runs once in eval mode under ``torch.no_grad()`` through :func:`record_attention`. Window blocks
    give the full ``N × N`` matrix with zeros outside their pattern. Afterwards the model is exactly as before:
    same ``training`` flag on every module, same fused-attention switches, no hooks left (also when the forward
    pass raises). To get the logits of the same pass too, use :func:`~vit.explain.explain_images`. A model with an
    attention-pooling head runs whole, so that the head's cross-attention is recorded too (``.pool``).

    Args:
        model: A model with ``model.blocks[i].attn.attention_weights`` (see :func:`attention_modules`).
        images: Batch ``(B, C, H, W)``, normalised as the model expects; moved to the model's device.

    Returns:
        An :class:`AttentionRecord`: one ``(B, heads, N, N)`` tensor per block, in block order, every row summing
        to 1 (to 1 up to ``eps`` for linear attention), and ``.pool`` for an attention-pooling head.

    Raises:
        ValueError: If the model does not expose its blocks' attention (see :func:`attention_modules`).
        RuntimeError: If some block's attention module was not called by the forward pass.
    """
    param = next(model.parameters(), None)
    if param is not None:
        images = images.to(param.device)
    forward_features = getattr(model, "forward_features", None)
    with eval_mode(model), record_attention(model) as attentions:
        # The blocks are all we need: skip the head when the model splits its forward pass (timm convention).
        if callable(forward_features) and pool_module(model) is None:
            forward_features(images)
        else:
            model.forward(images)
    return attentions
