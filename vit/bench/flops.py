"""FLOPs per image of a ViT (forward, and a training step) and the dense bf16 peak of known GPUs, for MFU (model
FLOPs utilisation, Chowdhery et al., "PaLM", 2022, appendix B)."""

from __future__ import annotations

from typing import Any

import torch

from vit.models import VisionTransformer
from vit.models.flops import forward_flops

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, matched against the CUDA device name in order.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("GH200", 989.0),
    ("A100", 312.0),
)


def count_flops(config: dict[str, Any]) -> dict[str, float]:
    """FLOPs per image of one forward pass and of one training step (forward + backward), counted on the CPU.

    ``FlopCounterMode`` counts matrix products (patch projection, linear layers, attention); attention is counted
    through PyTorch's reference (math) kernel because the counter has no formula for the CPU fused kernel. The
    count does not depend on the device; elementwise ops (softmax, GELU, LayerNorm) are not counted.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model = VisionTransformer(**config)
    shape = (model.patch_embed.in_chans, *model.patch_embed.img_size)
    forward = forward_flops(model, shape)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(torch.randn(1, *shape)).sum().backward()
    return {"forward_gflops_per_image": forward / 1e9, "train_gflops_per_image": counter.get_total_flops() / 1e9}


def peak_tflops(device_name: str) -> float | None:
    """Dense bf16 peak of a known CUDA device, else ``None``."""
    for key, value in PEAK_BF16_TFLOPS:
        if key in device_name:
            return value
    return None
