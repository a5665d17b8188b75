"""Window attention against plain masked global attention over the full sequence.

The reference pattern is built here with explicit loops from the rule in the issue: a patch attends to the
patches of its own window (boundaries at ``shift + k·w`` in original grid coordinates, so tokens separated by
the wrap-around never meet) and to every prefix token; prefix tokens attend to everything.
"""

from __future__ import annotations

import math

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer as TimmViT

import vit
from vit.layers import Attention, WindowAttention, window_attention_mask
from vit.models import model_config


def reference_pattern(rows: int, cols: int, w: int, shift: int, num_prefix: int) -> torch.Tensor:
    n = num_prefix + rows * cols
    allowed = torch.ones(n, n, dtype=torch.bool)

    def window_of(index: int) -> tuple[int, int]:
        r, c = divmod(index, cols)
        return math.floor((r - shift) / w), math.floor((c - shift) / w)

    for i in range(rows * cols):
        for j in range(rows * cols):
            allowed[num_prefix + i, num_prefix + j] = window_of(i) == window_of(j)
    return allowed


CASES = [
    # (rows, cols, window, shift, prefix tokens)
    (8, 8, 4, 0, 0),
    (8, 8, 4, 0, 1),
    (8, 8, 4, 0, 5),
    (8, 8, 4, 2, 0),
    (8, 8, 4, 2, 1),
    (8, 8, 4, 2, 5),
    (7, 10, 3, 0, 0),  # grid not divisible by the window: padded
    (7, 10, 3, 0, 1),
    (7, 10, 3, 1, 5),  # padded and shifted
    (6, 6, 4, 2, 1),
    (14, 14, 7, 3, 1),
]


def _pair(rows, cols, w, shift, prefix, fused=True):
    window = WindowAttention(
        48,
        num_heads=4,
        qkv_bias=True,
        grid_size=(rows, cols),
        window_size=w,
        shift=shift,
        num_prefix_tokens=prefix,
        fused_attn=fused,
    ).eval()
    dense = Attention(48, num_heads=4, qkv_bias=True, fused_attn=fused).eval()
    dense.load_state_dict(window.state_dict(), strict=True)
    return window, dense


@pytest.mark.parametrize(("rows", "cols", "w", "shift", "prefix"), CASES)
@pytest.mark.parametrize("fused", [True, False])
def test_window_attention_equals_masked_global_attention(rows, cols, w, shift, prefix, fused):
    window, dense = _pair(rows, cols, w, shift, prefix, fused)
    pattern = reference_pattern(rows, cols, w, shift, prefix)
    x = torch.randn(2, prefix + rows * cols, 48)
    torch.testing.assert_close(window(x), dense(x, attn_mask=pattern), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("rows", "cols", "w", "shift", "prefix"), CASES)
def test_dense_weights_follow_the_pattern(rows, cols, w, shift, prefix):
    window, dense = _pair(rows, cols, w, shift, prefix)
    pattern = reference_pattern(rows, cols, w, shift, prefix)
    assert torch.equal(window.dense_mask(), pattern)
    assert torch.equal(window_attention_mask((rows, cols), w, shift, prefix), pattern)
    x = torch.randn(2, prefix + rows * cols, 48)
    weights = window.attention_weights(x)
    assert weights.shape == (2, 4, pattern.shape[0], pattern.shape[0])
    assert torch.all(weights[:, :, ~pattern] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    # Weights times values reproduce the block's output.
    _, _, v = window.split_qkv(window.qkv(x))
    out = (weights @ v).transpose(1, 2).reshape(x.shape)
    torch.testing.assert_close(window.proj(out), window(x), atol=1e-5, rtol=1e-5)


def test_shifted_boundaries_sit_at_half_window():
    pattern = reference_pattern(8, 8, 4, 2, 0)
    window, _ = _pair(8, 8, 4, 2, 0)
    assert torch.equal(window.dense_mask(), pattern)
    # Rows 0-1 form their own band: (0,0) sees (1,1) but not (2,2) nor the wrapped-around (7,7).
    assert pattern[0, 1 * 8 + 1] and not pattern[0, 2 * 8 + 2] and not pattern[0, 7 * 8 + 7]
    # (2,2)..(5,5) is one window.
    assert pattern[2 * 8 + 2, 5 * 8 + 5] and not pattern[5 * 8 + 5, 6 * 8 + 6]


def test_uneven_windows_cover_every_patch_once_and_buffers_stay_linear():
    window, _ = _pair(7, 10, 3, 1, 1)  # bands of 1+3+3 rows and 1+3+3+3 columns
    # Edge windows are smaller instead of padded: every patch sits in exactly one window slot.
    assert sorted(window.groups) == [(1, 1), (5, 3), (6, 9)]
    assert sum(n * size for n, size in window.groups) == 7 * 10
    assert window.num_windows == 12
    # No N x N tensor on the training path: buffers grow with the number of tokens only.
    for name, buf in window.named_buffers():
        assert buf.numel() <= window.num_windows * (1 + 9), name


def test_real_tokens_never_see_what_a_padded_grid_would_add():
    """Equivalent of 'padded positions never change a real token': outputs of the 7x10 grid equal those of the
    same tokens embedded in a 9x12 grid (padded to a multiple of 3) with the extra tokens masked out as keys."""
    window, dense = _pair(7, 10, 3, 0, 1)
    x = torch.randn(2, 1 + 70, 48)
    padded = torch.randn(2, 1 + 9 * 12, 48) * 50  # garbage in the padded slots
    padded[:, 0] = x[:, 0]
    grid = padded[:, 1:].view(2, 9, 12, 48)
    grid[:, :7, :10] = x[:, 1:].view(2, 7, 10, 48)
    real = torch.zeros(9, 12, dtype=torch.bool)
    real[:7, :10] = True
    pattern = reference_pattern(9, 12, 3, 0, 1)
    pattern[:, 1:] &= real.flatten()[None, :]  # padded keys hidden from everyone
    pattern[1:, 1:] |= torch.eye(9 * 12, dtype=torch.bool)  # padded queries keep themselves (outputs dropped)
    out_padded = dense(padded, attn_mask=pattern)
    keep = torch.cat([torch.tensor([True]), real.flatten()])
    torch.testing.assert_close(window(x), out_padded[:, keep], atol=1e-5, rtol=1e-5)


def test_window_equal_to_grid_gives_global_logits():
    global_model = vit.create_model("vit_tiny_patch4_32", depth=4).eval()
    windowed = vit.create_model("vit_tiny_patch4_32", depth=4, window_size=8, global_attn_indexes=(1,)).eval()
    windowed.load_state_dict(global_model.state_dict(), strict=True)
    assert isinstance(windowed.blocks[0].attn, WindowAttention) and type(windowed.blocks[1].attn) is Attention
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(windowed(x), global_model(x), atol=1e-5, rtol=1e-5)


def test_interleaving_and_shift_schedule():
    model = vit.create_model("vit_tiny_window_patch4_32")
    kinds = [("global" if type(b.attn) is Attention else f"w{b.attn.window_size}s{b.attn.shift}") for b in model.blocks]
    assert kinds == ["w4s0", "w4s2", "global"] * 4
    small = vit.create_model("vit_small_window_patch16_224")
    assert [i for i, b in enumerate(small.blocks) if type(b.attn) is Attention] == [2, 5, 8, 11]
    assert all(b.attn.shift == 0 and b.attn.window_size == 7 for b in small.blocks if type(b.attn) is not Attention)


def test_timm_global_checkpoint_loads_strictly_into_window_model():
    reference = TimmViT(**model_config("vit_small_patch16_224", depth=4)).eval()
    windowed = vit.create_model("vit_small_window_patch16_224", depth=4, global_attn_indexes=(2,))
    windowed.load_state_dict(reference.state_dict(), strict=True)
    assert windowed(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


def test_padded_window_model_gradients_reach_every_parameter():
    model = vit.create_model(
        "vit_tiny_patch4_32",
        img_size=28,
        depth=3,
        window_size=3,
        shift_windows=True,
        reg_tokens=2,
        global_attn_indexes=(2,),
    )
    model(torch.randn(2, 3, 28, 28)).sum().backward()
    assert [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0] == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(window_size=-1), r"window_size must be >= 0"),
        (dict(window_size=4, global_attn_indexes=(12,)), r"global_attn_indexes \[12\] out of range for depth 12"),
        (dict(window_size=9), r"window_size 9 is larger than the patch grid 8x8"),
    ],
)
def test_bad_window_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        vit.create_model("vit_tiny_patch4_32", **kwargs)


def test_layouts_of_other_grids_stay_few_and_correct():
    from vit.layers.window_attention import LAYOUT_CACHE_SIZE

    window, dense = _pair(4, 4, 2, 1, 1)
    grids = [(rows, cols) for rows in range(2, 6) for cols in range(3, 6) if (rows, cols) != (4, 4)]  # 11 grids
    assert len(grids) > LAYOUT_CACHE_SIZE
    for rows, cols in [*grids, grids[0]]:  # the first grid again: dropped by now, so built anew
        x = torch.randn(1, 1 + rows * cols, 48)
        want = dense(x, attn_mask=reference_pattern(rows, cols, 2, 1, 1))
        torch.testing.assert_close(window(x, grid_size=(rows, cols)), want, atol=1e-5, rtol=1e-5)
        assert len(window._layouts) <= LAYOUT_CACHE_SIZE
    recent = [*grids[-(LAYOUT_CACHE_SIZE - 1) :], grids[0]]
    assert [key[:2] for key in window._layouts] == recent  # the most recently used, oldest first
    kept = window._layouts[(*recent[0], "cpu")]
    window(torch.randn(1, 1 + recent[0][0] * recent[0][1], 48), grid_size=recent[0])  # a hit: reused, now newest
    assert next(reversed(window._layouts.values())) is kept
    assert window.layout(None, torch.device("cpu")).gather_index is window.gather_index  # own grid: the buffers
