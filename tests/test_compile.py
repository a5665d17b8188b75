"""torch.compile(fullgraph=True) traces the global, windowed, sliding-window, linear-attention and MAP-head models
(forward and backward) and matches eager.

Inductor on the CPU: a cold compile takes about 1.5 minutes for the first two tiny models and 5 minutes for the sliding
one on two loaded cores (cached afterwards).
"""

from __future__ import annotations

import pytest
import torch

from vit.layers import Attention, NeighborhoodAttention, neighborhood_attention

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "name, overrides, backend",
    [
        ("vit_tiny_patch4_32", {}, "inductor"),
        # Block 0: 4x4 windows; block 1: shifted by 2 (uneven edge windows, four window shapes); block 2: global.
        ("vit_tiny_window_patch4_32", {"global_attn_indexes": (2,)}, "inductor"),
        # Blocks 0-1: 5x5 neighbourhoods through the CPU kernel (one custom op in the graph), block 2: global.
        ("vit_tiny_sliding_patch4_32", {"global_attn_indexes": (2,)}, "inductor"),
        # Linear attention in blocks 0-1 and the MAP head (after a register token) add no kernel of their own: the
        # graph is traced whole (aot_eager) without the minute of code generation.
        ("vit_tiny_linear_patch4_32", {"global_attn_indexes": (2,)}, "aot_eager"),
        ("vit_tiny_map_patch4_32", {"reg_tokens": 1}, "aot_eager"),
    ],
)
def test_fullgraph_compile_matches_eager_forward_and_backward(name, overrides, backend, tiny_vit):
    torch._dynamo.reset()
    model = tiny_vit(name, depth=3, embed_dim=64, **overrides).train()
    x = torch.randn(3, 3, 32, 32)
    target = torch.randint(0, 10, (3,))

    def loss_and_grads(module):
        loss = torch.nn.functional.cross_entropy(module(x), target)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        return loss.detach(), grads

    eager_loss, eager_grads = loss_and_grads(model)
    compiled = torch.compile(model, fullgraph=True, backend=backend)  # raises on any graph break
    compiled_loss, compiled_grads = loss_and_grads(compiled)
    torch.testing.assert_close(compiled_loss, eager_loss, atol=1e-5, rtol=1e-5)
    for (param_name, _), got, want in zip(model.named_parameters(), compiled_grads, eager_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4, msg=lambda m, n=param_name: f"{n}: {m}")
    # A second call reuses the graph (no recompilation for the same shapes).
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)


def test_fullgraph_compile_of_the_tiled_path():
    """The tiled path (the CPU's fallback without a C++ compiler) traces in one graph and matches eager, with grads."""
    torch._dynamo.reset()
    layer = NeighborhoodAttention(64, 2, grid_size=(9, 11), kernel_size=3, dilation=2, num_prefix_tokens=1)
    x = torch.randn(2, 1 + 9 * 11, 64, requires_grad=True)
    grad = torch.randn(2, 1 + 9 * 11, 64)
    inputs = [x, *layer.parameters()]
    eager = torch.autograd.grad(layer.forward_tiled(x), inputs, grad)
    compiled = torch.autograd.grad(torch.compile(layer.forward_tiled, fullgraph=True)(x), inputs, grad)
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_fullgraph_compile_of_the_flex_path():
    """The FlexAttention path (CUDA's) traces in one graph, BlockMask built inside it and cached (CPU, inference)."""
    torch._dynamo.reset()
    layer = NeighborhoodAttention(64, 2, grid_size=(9, 11), kernel_size=5, dilation=1, num_prefix_tokens=1).eval()
    dense = Attention(64, 2).eval()
    dense.load_state_dict(layer.state_dict(), strict=True)
    x = torch.randn(2, 1 + 9 * 11, 64)
    with torch.no_grad():
        out = torch.compile(layer.forward_flex, fullgraph=True)(x)
        torch.testing.assert_close(out, dense(x, attn_mask=layer.dense_mask()), atol=1e-5, rtol=1e-5)
    assert (9, 11, 5, 1, 1, "cpu") in neighborhood_attention._BLOCK_MASKS
