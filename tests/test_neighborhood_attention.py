"""Sliding-window (neighbourhood) attention against plain masked global attention over the full sequence.

The reference pattern is built here with explicit loops from the rule in the issue (NATTEN / DiNAT): along each
axis, a patch's neighbours are the ``k`` positions of its own residue class ``i mod d`` centred on it, the window
moved inward where it would leave the class; a patch attends to the product of its row and column neighbours and
to every prefix token; prefix tokens attend to everything.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from PIL import Image
from timm.models.vision_transformer import VisionTransformer as TimmViT
from torch.nn.attention.flex_attention import create_mask

import vit
from vit.callbacks import AttentionRolloutLogger
from vit.explain import attention_distance, attention_rollout, attention_statistics, capture_attention
from vit.kernels import neighborhood as neighborhood_kernel
from vit.layers import Attention, NeighborhoodAttention, neighborhood_attention_mask, neighborhood_mask_mod
from vit.models import model_config


def axis_neighbours(i: int, length: int, k: int, d: int) -> list[int]:
    members = list(range(i % d, length, d))  # the residue class of i, in order
    centre = members.index(i)
    first = min(max(centre - k // 2, 0), len(members) - k)
    return members[first : first + k]


def reference_pattern(rows: int, cols: int, k: int, d: int, num_prefix: int) -> torch.Tensor:
    n = num_prefix + rows * cols
    allowed = torch.zeros(n, n, dtype=torch.bool)
    allowed[:num_prefix, :] = True
    allowed[:, :num_prefix] = True
    for r in range(rows):
        for c in range(cols):
            query = num_prefix + r * cols + c
            for rr in axis_neighbours(r, rows, k, d):
                for cc in axis_neighbours(c, cols, k, d):
                    allowed[query, num_prefix + rr * cols + cc] = True
    return allowed


CASES = [
    # (rows, cols, k, dilation, prefix tokens, query tile side or (rows, cols))
    (8, 8, 3, 1, 0, 8),
    (8, 8, 3, 1, 1, 8),
    (8, 8, 3, 1, 5, 3),
    (7, 10, 3, 1, 1, 4),  # non-square, k does not divide the grid, the last tiles overlap
    (9, 11, 5, 1, 0, 4),
    (9, 11, 5, 1, 5, 8),
    (14, 14, 7, 1, 1, 8),  # the 224-px preset's grid
    (13, 16, 7, 1, 1, 4),
    (10, 13, 3, 2, 1, 4),  # dilation: residue classes of unequal lengths
    (12, 15, 5, 2, 0, 3),
    (11, 9, 3, 3, 5, 8),  # k * d = 9 fills the narrow side
    (15, 16, 5, 3, 1, 2),
    (14, 17, 7, 2, 1, 8),
    (8, 16, 5, 1, 5, (4, 8)),  # oblong tiles that cut the grid exactly: the reshape path, with prefix tokens
    (9, 12, 3, 1, 1, (4, 6)),  # oblong tiles, the last row of tiles overlaps: the gather path
]
IDS = [f"{r}x{c}-k{k}-d{d}-p{p}-t{t}" for r, c, k, d, p, t in CASES]


def _pair(rows, cols, k, d, prefix, tile, fused=True):
    sliding = NeighborhoodAttention(
        48,
        num_heads=4,
        qkv_bias=True,
        grid_size=(rows, cols),
        kernel_size=k,
        dilation=d,
        num_prefix_tokens=prefix,
        tile_size=tile,
        fused_attn=fused,
    ).eval()
    dense = Attention(48, num_heads=4, qkv_bias=True, fused_attn=fused).eval()
    dense.load_state_dict(sliding.state_dict(), strict=True)
    return sliding, dense


def test_reference_rule_on_a_small_grid():
    # 7 columns, k = 3: the window of column 0 moves inward to 0..2, column 3 is centred, column 6 sees 4..6.
    assert [axis_neighbours(c, 7, 3, 1) for c in (0, 3, 6)] == [[0, 1, 2], [2, 3, 4], [4, 5, 6]]
    # Dilation 2 on 9: class 0 is 0,2,4,6,8 and class 1 is 1,3,5,7; each window stays in its class.
    assert [axis_neighbours(c, 9, 3, 2) for c in (0, 4, 8, 1, 7)] == [[0, 2, 4], [2, 4, 6], [4, 6, 8], [1, 3, 5]] + [
        [3, 5, 7]
    ]


@pytest.mark.parametrize(("rows", "cols", "k", "d", "prefix", "tile"), CASES, ids=IDS)
@pytest.mark.parametrize("path", ["kernel", "tiled", "explicit"])
def test_sliding_attention_equals_masked_global_attention(rows, cols, k, d, prefix, tile, path):
    """The CPU kernel (the default on the CPU), the tiled path's fused SDPA and its explicit softmax."""
    sliding, dense = _pair(rows, cols, k, d, prefix, tile, fused=path != "explicit")
    if path == "kernel":  # where a compiler is installed (CI), a kernel that does not build fails here
        if neighborhood_kernel.find_compiler() is None:
            pytest.skip("no C++ compiler: the layer uses its tiled path")
        assert neighborhood_kernel.load() is not None, neighborhood_kernel.status()
    forward = sliding.forward_tiled if path == "tiled" else sliding
    pattern = reference_pattern(rows, cols, k, d, prefix)
    assert (pattern[prefix:, prefix:].sum(-1) == k * k).all()  # every patch query sees exactly k x k patches
    x = torch.randn(2, prefix + rows * cols, 48, requires_grad=True)
    out = forward(x)
    torch.testing.assert_close(out, dense(x, attn_mask=pattern), atol=1e-5, rtol=1e-5)
    # Backward too: the same gradients for the input and every parameter.
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, *sliding.parameters()], grad)
    want = torch.autograd.grad(dense(x, attn_mask=pattern), [x, *dense.parameters()], grad)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("rows", "cols", "k", "d", "prefix", "tile"), CASES, ids=IDS)
def test_flex_mask_and_dense_mask_describe_the_reference_pattern(rows, cols, k, d, prefix, tile):
    pattern = reference_pattern(rows, cols, k, d, prefix)
    n = pattern.shape[0]
    flex = create_mask(neighborhood_mask_mod((rows, cols), k, d, prefix), None, None, n, n, device="cpu")
    assert torch.equal(flex[0, 0], pattern)
    assert torch.equal(neighborhood_attention_mask((rows, cols), k, d, prefix), pattern)
    sliding, _ = _pair(rows, cols, k, d, prefix, tile)
    assert torch.equal(sliding.dense_mask(), pattern)


@pytest.mark.parametrize(("rows", "cols", "k", "d", "prefix", "tile"), CASES[1::3], ids=IDS[1::3])
def test_flex_path_output_on_cpu(rows, cols, k, d, prefix, tile):
    """The FlexAttention path (used on CUDA) with its BlockMask, run unfused on the CPU: forward only."""
    sliding, dense = _pair(rows, cols, k, d, prefix, tile)
    x = torch.randn(2, prefix + rows * cols, 48)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        out = sliding.forward_flex(x)
    torch.testing.assert_close(out, dense(x, attn_mask=reference_pattern(rows, cols, k, d, prefix)), atol=1e-5, rtol=0)
    twin, _ = _pair(rows, cols, k, d, prefix, tile)
    assert twin.block_mask(x.device) is sliding.block_mask(x.device)  # built once per geometry, shared by blocks


@pytest.mark.parametrize(("rows", "cols", "k", "d", "prefix", "tile"), CASES[::4], ids=IDS[::4])
def test_dense_weights_follow_the_pattern(rows, cols, k, d, prefix, tile):
    sliding, _ = _pair(rows, cols, k, d, prefix, tile)
    pattern = reference_pattern(rows, cols, k, d, prefix)
    x = torch.randn(2, prefix + rows * cols, 48)
    weights = sliding.attention_weights(x)
    assert weights.shape == (2, 4, *pattern.shape)
    assert torch.all(weights[:, :, ~pattern] == 0) and torch.all(weights[:, :, pattern] > 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    _, _, v = sliding.split_qkv(sliding.qkv(x))
    out = (weights @ v).transpose(1, 2).reshape(x.shape)
    torch.testing.assert_close(sliding.proj(out), sliding(x), atol=1e-5, rtol=1e-5)


def test_bf16_autocast_keeps_the_attention_dtype():
    sliding, dense = _pair(8, 8, 3, 1, 1, 8)
    pattern = reference_pattern(8, 8, 3, 1, 1)
    x = torch.randn(2, 65, 48)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, want = sliding(x), dense(x, attn_mask=pattern)
    assert out.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want.float(), atol=3e-2, rtol=3e-2)


def test_buffers_grow_linearly_with_the_grid():
    def buffer_elements(side):
        layer = NeighborhoodAttention(32, 2, grid_size=side, kernel_size=7)
        return sum(b.numel() for b in layer.buffers())

    small, large = buffer_elements(32), buffer_elements(64)
    assert 3.5 < large / small < 4.5  # 4x the patches, 4x the buffers (an N x N mask would be 16x)
    assert large < 64**4 / 15  # and far below one N x N mask


def test_kernel_equal_to_grid_gives_global_logits():
    global_model = vit.create_model("vit_tiny_patch4_32", img_size=28, depth=3, reg_tokens=2).eval()
    sliding = vit.create_model(
        "vit_tiny_patch4_32", img_size=28, depth=3, reg_tokens=2, window_size=7, window_type="sliding"
    ).eval()
    sliding.load_state_dict(global_model.state_dict(), strict=True)
    assert all(isinstance(b.attn, NeighborhoodAttention) for b in sliding.blocks)
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(sliding(x), global_model(x), atol=1e-5, rtol=1e-5)


def test_presets_interleave_global_blocks():
    small = vit.create_model("vit_small_sliding_patch16_224")
    assert [i for i, b in enumerate(small.blocks) if type(b.attn) is Attention] == [2, 5, 8, 11]
    sliding = [b.attn for b in small.blocks if type(b.attn) is not Attention]
    assert all(isinstance(a, NeighborhoodAttention) and (a.kernel_size, a.dilation) == (7, 1) for a in sliding)
    assert sliding[0].grid_size == (14, 14)
    tiny = vit.create_model("vit_tiny_sliding_patch4_32")
    kinds = ["global" if type(b.attn) is Attention else f"k{b.attn.kernel_size}" for b in tiny.blocks]
    assert kinds == ["k5", "k5", "global"] * 4
    dilated = vit.create_model("vit_tiny_sliding_patch4_32", window_size=3, window_dilation=2)
    assert dilated.blocks[0].attn.dilation == 2


def test_timm_global_checkpoint_loads_strictly_into_sliding_model():
    reference = TimmViT(**model_config("vit_small_patch16_224", depth=4)).eval()
    sliding = vit.create_model("vit_small_sliding_patch16_224", depth=4, global_attn_indexes=(2,))
    sliding.load_state_dict(reference.state_dict(), strict=True)
    assert sliding(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


def test_gradients_reach_every_parameter_and_the_input():
    model = vit.create_model(
        "vit_tiny_sliding_patch4_32",
        img_size=28,
        depth=3,
        embed_dim=32,
        num_heads=2,
        window_size=3,
        window_dilation=2,
        reg_tokens=2,
        qk_norm=True,
        global_attn_indexes=(2,),
    )
    x = torch.randn(2, 3, 28, 28, requires_grad=True)
    model(x).sum().backward()
    assert [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0] == []
    assert x.grad is not None and x.grad.abs().sum() > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(kernel_size=4), r"kernel_size must be a positive odd number.*got 4"),
        (dict(kernel_size=0), r"kernel_size must be a positive odd number.*got 0"),
        (dict(kernel_size=-3), r"kernel_size must be a positive odd number.*got -3"),
        (dict(kernel_size=3, dilation=0), r"dilation must be positive, got 0"),
        (dict(kernel_size=3, dilation=3), r"kernel_size 3 x dilation 3 = 9 is larger than the patch grid 8x10"),
        (dict(kernel_size=9), r"kernel_size 9 x dilation 1 = 9 is larger than the patch grid 8x10"),
        (dict(kernel_size=3, tile_size=0), r"tile_size must be positive, got 0"),
    ],
)
def test_bad_layer_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NeighborhoodAttention(32, 2, grid_size=(8, 10), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(window_size=4), r"window_size must be odd for window_type='sliding'.*got 4"),
        (dict(window_size=3, window_dilation=0), r"window_dilation must be positive, got 0"),
        (dict(window_size=5, window_dilation=2), r"window_size 5 x window_dilation 2 = 10 is larger than .* 8x8"),
        (dict(window_size=9), r"window_size 9 x window_dilation 1 = 9 is larger than the patch grid 8x8"),
        (dict(window_size=3, shift_windows=True), r"shift_windows applies to window_type='block' only"),
        (dict(window_size=3, window_type="diagonal"), r"window_type must be 'block' or 'sliding', got 'diagonal'"),
        (dict(window_size=4, window_type="block", window_dilation=2), r"window_dilation 2 needs window_type='sliding'"),
    ],
)
def test_bad_model_arguments(kwargs, message):
    kwargs.setdefault("window_type", "sliding")
    with pytest.raises(ValueError, match=message):
        vit.create_model("vit_tiny_patch4_32", depth=2, **kwargs)


def test_capture_rollout_and_statistics_of_sliding_blocks():
    model = vit.create_model(
        "vit_tiny_sliding_patch4_32", depth=3, embed_dim=32, num_heads=2, reg_tokens=1, global_attn_indexes=(2,)
    )
    images = torch.randn(2, 3, 32, 32)
    attentions = capture_attention(model, images)
    assert len(attentions) == 3 and all(a.shape == (2, 2, 66, 66) for a in attentions)
    pattern = reference_pattern(8, 8, 5, 1, 2)
    for attn in attentions[:2]:  # sliding blocks: zero outside the pattern, rows sum to 1
        assert torch.all(attn[:, :, ~pattern] == 0)
        torch.testing.assert_close(attn.sum(-1), torch.ones(2, 2, 66))
    assert torch.all(attentions[2] > 0)  # block 2 is global
    rollout = attention_rollout(attentions, num_prefix_tokens=2)
    assert rollout.shape == (2, 64) and torch.all(rollout > 0)
    stats = attention_statistics(attentions, (8, 8), (4, 4), num_prefix_tokens=2)
    assert stats["distance"].shape == (3, 2) and stats["entropy"].shape == (3, 2)
    # Entropy is at most log(allowed keys) per row: 66 for the 2 prefix rows, 2 prefix + 25 patches for the others;
    # fresh attention is near-uniform, so the global block lies above that bound.
    bound = (2 * torch.log(torch.tensor(66.0)) + 64 * torch.log(torch.tensor(27.0))) / 66
    assert torch.all(stats["entropy"][:2] <= bound + 1e-4) and torch.all(stats["entropy"][2] > bound)


def test_mean_attention_distance_grows_with_the_window():
    torch.manual_seed(0)
    x = torch.randn(2, 1 + 16 * 16, 32)
    distances = []
    for k in (3, 5, 7, 9):
        torch.manual_seed(1)  # the same weights for every k
        layer = NeighborhoodAttention(32, 2, grid_size=16, kernel_size=k)
        distances.append(attention_distance(layer.attention_weights(x), 16, 16).mean().item())
    assert distances == sorted(distances) and distances[0] < 0.6 * distances[-1]


def test_rollout_logger_on_a_sliding_model(tmp_path, tiny_classifier, cpu_trainer, digits):
    module = tiny_classifier("vit_tiny_sliding_patch4_32", model_overrides={"global_attn_indexes": (1,)}, seed=0)
    data = digits()
    trainer = cpu_trainer(
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=1,
        callbacks=[AttentionRolloutLogger(num_images=2, every_n_epochs=1)],
    )
    trainer.fit(module, data)
    assert isinstance(module.model.blocks[0].attn, NeighborhoodAttention)
    with Image.open(tmp_path / "rollout" / "epoch_000.png") as grid:
        assert grid.mode == "RGB" and grid.width > 2 * 160


def test_tables_of_other_grids_stay_few_and_correct():
    from vit.layers.window_attention import LAYOUT_CACHE_SIZE

    sliding, dense = _pair(5, 5, 3, 1, 1, (2, 2))
    grids = [(rows, cols) for rows in range(3, 7) for cols in range(3, 6) if (rows, cols) != (5, 5)]  # 11 grids
    assert len(grids) > LAYOUT_CACHE_SIZE
    for rows, cols in [*grids, grids[0]]:  # the first grid again: dropped by now, so built anew
        x = torch.randn(1, 1 + rows * cols, 48)
        want = dense(x, attn_mask=reference_pattern(rows, cols, 3, 1, 1))
        torch.testing.assert_close(sliding.forward_tiled(x, (rows, cols)), want, atol=1e-5, rtol=1e-5)
        assert len(sliding._tables) <= LAYOUT_CACHE_SIZE
    recent = [*grids[-(LAYOUT_CACHE_SIZE - 1) :], grids[0]]
    assert [key[:2] for key in sliding._tables] == recent  # the most recently used, oldest first
    kept = sliding._tables[(*recent[0], "cpu")]
    assert sliding.tables(recent[0], torch.device("cpu")) is kept  # a hit: reused, now the newest
    assert next(reversed(sliding._tables.values())) is kept


def test_block_masks_stay_few():
    from vit.layers import neighborhood_attention as module

    sliding, _ = _pair(5, 5, 3, 1, 1, (2, 2))
    for cols in range(3, 4 + module.BLOCK_MASK_CACHE_SIZE):
        sliding.block_mask(torch.device("cpu"), (4, cols))
        assert len(module._BLOCK_MASKS) <= module.BLOCK_MASK_CACHE_SIZE
    first = sliding.block_mask(torch.device("cpu"), (4, 3 + module.BLOCK_MASK_CACHE_SIZE))
    assert sliding.block_mask(torch.device("cpu"), (4, 3 + module.BLOCK_MASK_CACHE_SIZE)) is first
