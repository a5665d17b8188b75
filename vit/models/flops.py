"""FLOPs of a forward pass, counted with :class:`torch.utils.flop_counter.FlopCounterMode` (a multiply-add is 2)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..layers.utils import eval_mode


def forward_flops(model: nn.Module, input_shape: Sequence[int]) -> int:
    """FLOPs of one eval-mode forward pass of one input of shape ``input_shape`` (without batch dimension).

    Counted with :class:`torch.utils.flop_counter.FlopCounterMode`, where a multiply-add is 2 FLOPs (GMACs =
    GFLOPs / 2, the unit timm and most papers quote). Attention runs on PyTorch's math backend meanwhile, because
    the fused CPU kernel is not counted. The model's ``training`` flags are restored.

    Args:
        model: The network.
        input_shape: E.g. ``(3, 224, 224)``.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    param = next(model.parameters())
    x = torch.zeros(1, *input_shape, device=param.device, dtype=param.dtype)
    with torch.no_grad(), eval_mode(model), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model.forward(x)
    return int(counter.get_total_flops())
