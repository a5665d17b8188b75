"""Attention captured from a model with ``dynamic_img_size=True`` at an image size it was not built for: the window,
sliding-window and linear blocks are recorded over the input's own patch grid, equal to the layer's dense weights at
that grid, and those weights reproduce what the block's forward pass (fused, windowed or linear) computed."""

from __future__ import annotations

import pytest
import torch

from vit.explain import capture_attention
from vit.layers import LinearAttention, NeighborhoodAttention, WindowAttention
from vit.models import VisionTransformer

# An 8 x 8 grid at the native size; block 1 stays global (softmax over every token).
KINDS = {
    "window": (dict(window_size=3, global_attn_indexes=(1,)), WindowAttention),
    "window_shifted": (dict(window_size=4, shift_windows=True, global_attn_indexes=(1,)), WindowAttention),
    "sliding": (dict(window_size=3, window_type="sliding", global_attn_indexes=(1,)), NeighborhoodAttention),
    "linear": (dict(linear_attention=True, global_attn_indexes=(1,)), LinearAttention),
}
SHAPE, GRID = (28, 44), (7, 11)  # not the native 32 x 32, and not square


def _record_inputs(model: VisionTransformer) -> tuple[list[tuple[torch.Tensor, dict]], list]:
    """Hooks that keep each block attention's input and keyword arguments, and their handles."""
    seen: list[tuple[torch.Tensor, dict]] = []

    def hook(module, args, kwargs):
        seen.append((args[0] if args else kwargs["x"], dict(kwargs)))

    handles = [block.attn.register_forward_pre_hook(hook, with_kwargs=True) for block in model.blocks]
    return seen, handles


@pytest.mark.parametrize("kind", list(KINDS))
def test_capture_at_another_image_size_uses_the_input_grid(kind, tiny_vit):
    torch.manual_seed(0)
    config, local_type = KINDS[kind]
    model = tiny_vit(depth=3, num_classes=5, reg_tokens=1, **config, dynamic_img_size=True).eval()
    assert isinstance(model.blocks[0].attn, local_type) and isinstance(model.blocks[2].attn, local_type)
    images = torch.randn(2, 3, *SHAPE)

    seen, handles = _record_inputs(model)
    try:
        record = capture_attention(model, images)
    finally:
        for handle in handles:
            handle.remove()

    n = model.num_prefix_tokens + GRID[0] * GRID[1]
    assert len(record) == len(model.blocks) == len(seen)
    with torch.no_grad():
        for block, weights, (x, kwargs) in zip(model.blocks, record, seen, strict=True):
            attn = block.attn
            assert kwargs.get("grid_size") == GRID  # the block told its attention the input's grid
            assert weights.shape == (2, 2, n, n)  # two heads
            # The layer's own dense computation over the input's grid.
            torch.testing.assert_close(weights, attn.attention_weights(x, grid_size=GRID), atol=0, rtol=0)
            # Those weights are the ones the block applied: A @ v through the projection is the block's
            # attention output, computed by its own forward path (windows gathered, neighbourhoods, linear).
            _, _, v = attn.split_qkv(attn.qkv(x))  # (B, heads, N, head_dim)
            mixed = (weights.to(v.dtype) @ v).transpose(1, 2).reshape(x.shape)
            torch.testing.assert_close(attn.proj(mixed), attn(x, grid_size=GRID), atol=1e-5, rtol=1e-5)
            sums = weights.sum(-1)
            torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-4, rtol=0)
        if local_type is not LinearAttention:
            # A local pattern at the native 8 x 8 grid would not even have the input's token count.
            local = model.blocks[0].attn
            assert local.dense_mask().shape != (n, n) and local.dense_mask(GRID).shape == (n, n)
            allowed = local.dense_mask(GRID)  # (N, N), True = may attend
            assert (record[0][:, :, ~allowed] == 0).all() and (~allowed).any()


def test_linear_attention_weights_take_and_ignore_the_grid():
    torch.manual_seed(0)
    attn = LinearAttention(16, num_heads=2).eval()
    x = torch.randn(2, 1 + 5 * 3, 16)
    with torch.no_grad():
        torch.testing.assert_close(attn.attention_weights(x, grid_size=(5, 3)), attn.attention_weights(x))
        torch.testing.assert_close(attn.attention_weights(x, None, (3, 5)), attn.attention_weights(x))
