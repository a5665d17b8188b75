"""The model API of timm's ViT: intermediate features, gradient checkpointing, dynamic image size and padding, the
description timm's tools read (``pretrained_cfg``, ``feature_info``) and ``features_only``.

References: timm's ``VisionTransformer`` loaded with the same state dict where timm has the feature (global
attention); for window, sliding and linear attention, a model freshly built for the other image size with the
position embedding resampled, and the non-dynamic model at the native size.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from timm.data import resolve_data_config
from timm.models import get_pretrained_cfg, is_model
from timm.models._features import FeatureGetterNet
from timm.models.vision_transformer import VisionTransformer as TimmViT
from torch.utils._pytree import tree_leaves

from vit.layers import NeighborhoodAttention, WindowAttention, resample_pos_embed, to_2tuple
from vit.models import VisionTransformer, create_model, list_models, model_config
from vit.models.intermediates import feature_take_indices
from vit.models.vision_transformer import _DEFAULTS

# Every attention kind, on an 8 x 8 grid; block 1 (or 3) stays global.
KINDS = {
    "global": {},
    "window": dict(window_size=3, global_attn_indexes=(3,)),
    "window_shifted": dict(window_size=4, shift_windows=True, global_attn_indexes=(1,)),
    "sliding": dict(window_size=3, window_type="sliding", global_attn_indexes=(1,)),
    "sliding_dilated": dict(window_size=3, window_type="sliding", window_dilation=2),
    "linear": dict(linear_attention=True, global_attn_indexes=(1,)),
}
POOLS = {
    "token": dict(reg_tokens=2),
    "avg": dict(class_token=False, global_pool="avg"),
    "map": dict(class_token=False, global_pool="map"),
}


@pytest.fixture
def tiny_config(tiny_vit):
    """``tiny_config(**overrides)``: the arguments of the tiny model with four blocks and five classes."""
    return partial(tiny_vit.config, depth=4, num_classes=5)


def _pair(config: dict) -> tuple[VisionTransformer, TimmViT]:
    ours = VisionTransformer(**config).eval()
    theirs = TimmViT(**config).eval()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _assert_trees_close(a, b, atol: float = 1e-5) -> None:
    a, b = tree_leaves(a), tree_leaves(b)
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        assert u.shape == v.shape
        torch.testing.assert_close(u, v, atol=atol, rtol=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(indices=2, norm=True),
        dict(indices=[0, -1], output_fmt="NLC"),
        dict(indices=[2, 0], return_prefix_tokens=True),
        dict(indices=[1], intermediates_only=True, stop_early=True, norm=True),
        dict(indices=3, output_fmt="NLC", return_prefix_tokens=True, intermediates_only=True),
    ],
)
@pytest.mark.parametrize("pool", ["token", "avg"])
def test_forward_intermediates_matches_timm(kwargs, pool, tiny_config):
    ours, theirs = _pair(tiny_config(**POOLS[pool]))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        got, want = ours.forward_intermediates(x, **kwargs), theirs.forward_intermediates(x, **kwargs)
    _assert_trees_close(got, want)
    intermediates = got if kwargs.get("intermediates_only") else got[1]
    take, _ = feature_take_indices(4, kwargs.get("indices"))
    assert len(intermediates) == len(take)
    first = intermediates[0][0] if kwargs.get("return_prefix_tokens") and pool == "token" else intermediates[0]
    expected = (2, 32, 8, 8) if kwargs.get("output_fmt", "NCHW") == "NCHW" else (2, 64, 32)
    assert first.shape == expected


@pytest.mark.parametrize("n", [1, 3, [0, 2]])
@pytest.mark.parametrize("reshape", [False, True])
def test_get_intermediate_layers_matches_timm(n, reshape, tiny_config):
    ours, theirs = _pair(tiny_config(reg_tokens=1))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for kwargs in (dict(), dict(norm=True, return_prefix_tokens=True)):
            got = ours.get_intermediate_layers(x, n, reshape=reshape, **kwargs)
            _assert_trees_close(got, theirs.get_intermediate_layers(x, n, reshape=reshape, **kwargs))


@pytest.mark.parametrize("kind", list(KINDS))
def test_intermediates_of_every_attention_kind_are_the_blocks_outputs(kind, tiny_config):
    """The final features are forward_features'; the last block's normed output is their patch part."""
    model = VisionTransformer(**tiny_config(**KINDS[kind])).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        final, (last,) = model.forward_intermediates(x, indices=[-1], norm=True, output_fmt="NLC")
        tokens = model.forward_features(x)
    torch.testing.assert_close(final, tokens, atol=0, rtol=0)
    torch.testing.assert_close(last, tokens[:, 1:], atol=0, rtol=0)


def test_bad_intermediate_arguments_are_value_errors(tiny_config):
    model = VisionTransformer(**tiny_config())
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(ValueError, match="output_fmt must be 'NCHW' or 'NLC', got 'NHWC'"):
        model.forward_intermediates(x, output_fmt="NHWC")
    with pytest.raises(ValueError, match=r"n must be in 1\.\.4, got 5"):
        model.forward_intermediates(x, indices=5)
    with pytest.raises(ValueError, match=r"block indices \[0, 4\] out of range: use 0\.\.3"):
        model.get_intermediate_layers(x, [0, 4])


@pytest.mark.parametrize("pool", list(POOLS))
@pytest.mark.parametrize("prune_norm", [False, True])
def test_prune_intermediate_layers_keeps_the_features_of_the_kept_blocks(pool, prune_norm, tiny_config):
    ours, theirs = _pair(tiny_config(**POOLS[pool]))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = ours.get_intermediate_layers(x, [0, 1])
        assert ours.prune_intermediate_layers([0, -3], prune_norm=prune_norm) == [0, 1]
        assert theirs.prune_intermediate_layers([0, -3], prune_norm=prune_norm) == [0, 1]
        after = ours.get_intermediate_layers(x, [0, 1])
        pruned, timm_pruned = ours(x), theirs(x)
        tokens = ours.forward_features(x)
    assert len(ours.blocks) == 2 and ours.attn_pool is None and ours.num_classes == 0
    _assert_trees_close(after, before, atol=0)
    assert pruned.shape == (2, ours.num_prefix_tokens + 64, 32)  # every token, un-pooled, as timm's
    torch.testing.assert_close(pruned, timm_pruned, atol=1e-5, rtol=0)
    torch.testing.assert_close(pruned, tokens, atol=0, rtol=0)


def _loss_and_grads(model: VisionTransformer, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict, int]:
    """Loss, gradients and the bytes autograd kept for backward (saved-tensor hooks)."""
    model.zero_grad(set_to_none=True)
    saved = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    torch.manual_seed(1)  # the same dropout and drop-path masks in both runs
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, sum(saved)


@pytest.mark.parametrize("pool", list(POOLS))
@pytest.mark.parametrize("kind", list(KINDS))
def test_grad_checkpointing_gives_the_same_loss_and_gradients(kind, pool, tiny_config):
    # Attention dropout where the layer has it; the sliding layers' CPU kernel (and linear attention) have none.
    attn_dropout = kind.startswith(("global", "window"))
    drops = dict(attn_drop_rate=0.1) if attn_dropout else dict(proj_drop_rate=0.1, drop_path_rate=0.2)
    model = VisionTransformer(**tiny_config(**KINDS[kind], **POOLS[pool], **drops)).train()
    x, y = torch.randn(3, 3, 32, 32), torch.tensor([0, 3, 4])
    loss, grads, saved = _loss_and_grads(model, x, y)
    model.set_grad_checkpointing()
    loss_ckpt, grads_ckpt, saved_ckpt = _loss_and_grads(model, x, y)
    torch.testing.assert_close(loss_ckpt, loss, atol=1e-6, rtol=0)
    assert grads_ckpt.keys() == grads.keys() and len(grads) == len(list(model.parameters()))
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ckpt[name], grad, atol=1e-6, rtol=0, msg=name)
    # Outside the blocks only the block inputs are kept: far less than every block's activations.
    assert saved_ckpt < saved / 2
    model.set_grad_checkpointing(False)
    assert _loss_and_grads(model, x, y)[2] == saved


@pytest.mark.parametrize("pool", list(POOLS))
@pytest.mark.parametrize("extra", [{}, dict(no_embed_class=True)])
def test_dynamic_img_size_matches_timm(pool, extra, tiny_config):
    ours, theirs = _pair(tiny_config(**POOLS[pool], **extra, dynamic_img_size=True))
    with torch.no_grad():
        for shape in ((32, 32), (24, 40), (44, 16)):
            x = torch.randn(2, 3, *shape)
            torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=0)
            _assert_trees_close(ours.forward_intermediates(x), theirs.forward_intermediates(x))


def test_dynamic_img_pad_matches_timm(tiny_config):
    ours, theirs = _pair(tiny_config(reg_tokens=1, dynamic_img_size=True, dynamic_img_pad=True))
    with torch.no_grad():
        for shape in ((30, 27), (33, 41), (32, 32)):
            x = torch.randn(2, 3, *shape)
            torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=0)
            got, want = ours.get_intermediate_layers(x, 2, reshape=True), theirs.get_intermediate_layers(x, 2, True)
            _assert_trees_close(got, want)
            assert got[0].shape[-2:] == (-(-shape[0] // 4), -(-shape[1] // 4))


def _fresh_at(model: VisionTransformer, img_size: tuple[int, int], config: dict) -> VisionTransformer:
    """The same weights in a model built for ``img_size``, its learned position grid resampled."""
    fresh = VisionTransformer(**{**config, "img_size": img_size}).eval()
    state = dict(model.state_dict())
    if "pos_embed" in state:
        grid = (img_size[0] // 4, img_size[1] // 4)
        prefix = 0 if model.no_embed_class else model.num_prefix_tokens
        state["pos_embed"] = resample_pos_embed(state["pos_embed"], grid, model.patch_embed.grid_size, prefix)
    fresh.load_state_dict(state)
    return fresh


@pytest.mark.parametrize(
    ("pool", "pos_embed"), [("token", "learn"), ("avg", "learn"), ("map", "learn"), ("token", "sincos")]
)
@pytest.mark.parametrize("kind", [k for k in KINDS if k != "global"])
def test_dynamic_img_size_of_local_and_linear_attention(kind, pool, pos_embed, tiny_config):
    config = tiny_config(**KINDS[kind], **POOLS[pool], pos_embed=pos_embed)
    model = VisionTransformer(**config, dynamic_img_size=True).eval()
    static = VisionTransformer(**config).eval()
    static.load_state_dict(model.state_dict())
    with torch.no_grad():
        x = torch.randn(2, 3, 32, 32)
        torch.testing.assert_close(model(x), static(x), atol=1e-6, rtol=0)
        for shape in ((28, 44), (40, 36)):
            x = torch.randn(2, 3, *shape)
            fresh = _fresh_at(model, shape, config)
            torch.testing.assert_close(model(x), fresh(x), atol=1e-5, rtol=0)
            got = model.get_intermediate_layers(x, [0, 2], reshape=True)
            _assert_trees_close(got, fresh.get_intermediate_layers(x, [0, 2], reshape=True))


def test_dynamic_img_pad_of_window_attention_is_zero_padding(tiny_config):
    config = tiny_config(**KINDS["window"])
    model = VisionTransformer(**config, dynamic_img_size=True, dynamic_img_pad=True).eval()
    x = torch.randn(2, 3, 30, 25)
    fresh = _fresh_at(model, (32, 28), config)
    with torch.no_grad():
        torch.testing.assert_close(model(x), fresh(F.pad(x, (0, 3, 0, 2))), atol=1e-5, rtol=0)


def test_local_patterns_are_built_once_per_grid_and_follow_the_input(tiny_config):
    model = VisionTransformer(**tiny_config(**KINDS["sliding"], dynamic_img_size=True)).eval()
    window = VisionTransformer(**tiny_config(**KINDS["window"], dynamic_img_size=True)).eval()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(1, 3, 24, 40)), window(torch.randn(1, 3, 24, 40))
        model(torch.randn(1, 3, 32, 32)), window(torch.randn(1, 3, 32, 32))
    sliding_attn, window_attn = model.blocks[0].attn, window.blocks[0].attn
    assert isinstance(sliding_attn, NeighborhoodAttention) and isinstance(window_attn, WindowAttention)
    assert list(sliding_attn._tables) == [(6, 10, "cpu")] and list(window_attn._layouts) == [(6, 10, "cpu")]


@pytest.mark.parametrize("path", ["forward_kernel", "forward_tiled", "forward_flex"])
@pytest.mark.parametrize(("kernel_size", "dilation"), [(3, 1), (3, 2), (5, 1)])
def test_every_sliding_path_at_another_grid_equals_a_layer_built_for_it(path, kernel_size, dilation):
    if path == "forward_flex":
        pytest.importorskip("torch.nn.attention.flex_attention")
    grid, other = (6, 7), (7, 11)
    layer = NeighborhoodAttention(32, 2, grid_size=grid, kernel_size=kernel_size, dilation=dilation).eval()
    fresh = NeighborhoodAttention(32, 2, grid_size=other, kernel_size=kernel_size, dilation=dilation).eval()
    fresh.load_state_dict(layer.state_dict())
    x = torch.randn(2, 1 + 77, 32)
    with torch.no_grad():
        got = getattr(layer, path)(x, other)
        torch.testing.assert_close(got, getattr(fresh, path)(x), atol=1e-5, rtol=0)
        dense = layer.attention_weights(x, grid_size=other)  # the dense pattern of that grid, explicit softmax
        v = layer.qkv(x).view(2, 78, 3, 2, 16)[:, :, 2].transpose(1, 2)
        want = layer.proj((dense @ v).transpose(1, 2).reshape(2, 78, 32))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("kind", "shape", "message"),
    [
        ("window", (8, 32), r"window_size 3 is larger than the patch grid 2x8: use window_size <= 2"),
        ("sliding", (32, 8), r"kernel_size 3 x dilation 1 = 3 is larger than the patch grid 8x2"),
        ("sliding_dilated", (20, 32), r"kernel_size 3 x dilation 2 = 6 is larger than the patch grid 5x8"),
    ],
)
def test_a_grid_the_pattern_cannot_take_is_one_value_error(kind, shape, message, tiny_config):
    model = VisionTransformer(**tiny_config(**KINDS[kind], dynamic_img_size=True))
    with pytest.raises(ValueError, match=message):
        model(torch.randn(1, 3, *shape))


def test_input_size_errors_name_the_option(tiny_config):
    with pytest.raises(ValueError, match=r"does not match the model's img_size \(32, 32\).*dynamic_img_size=True"):
        VisionTransformer(**tiny_config())(torch.randn(1, 3, 36, 32))
    with pytest.raises(ValueError, match=r"\(30, 32\) is not divisible by the patch size.*dynamic_img_pad=True"):
        VisionTransformer(**tiny_config(dynamic_img_size=True))(torch.randn(1, 3, 30, 32))


@pytest.mark.parametrize("name", list_models())
def test_every_preset_describes_itself_as_timm_models_do(name):
    """timm's attributes: the data config timm's tools resolve, first conv and classifier naming weights, one
    feature_info entry per block as timm's ViT of the same shape has, widths."""
    with torch.device("meta"):
        model = create_model(name)
    config = {**_DEFAULTS, **model_config(name)}
    height, width = to_2tuple(config["img_size"])
    data = resolve_data_config({}, model=model)
    assert data["input_size"] == (3, height, width)
    if height > 64:  # ImageNet-sized: timm's own model of that name where it has one, else ImageNet's statistics
        twin = get_pretrained_cfg(name) if is_model(name) else None
        expected = (
            (twin.mean, twin.std, twin.crop_pct) if twin else ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), 0.875)
        )
        assert (data["mean"], data["std"], data["crop_pct"]) == expected
    else:  # CIFAR-sized: CIFAR-10's statistics, the whole image resized
        assert (data["mean"], data["std"], data["crop_pct"]) == ((0.4914, 0.4822, 0.4465), (0.247, 0.2435, 0.2616), 1.0)
    cfg = model.default_cfg
    assert cfg is model.pretrained_cfg and cfg["architecture"] == name and cfg["num_classes"] == config["num_classes"]
    weights = model.state_dict()
    assert f"{cfg['first_conv']}.weight" in weights and f"{cfg['classifier']}.weight" in weights
    shape = {k: config[k] for k in ("img_size", "patch_size", "embed_dim", "num_heads", "depth")}
    theirs = TimmViT(**shape, device="meta")
    assert model.feature_info == theirs.feature_info
    assert model.num_features == model.head_hidden_size == theirs.head_hidden_size == config["embed_dim"]


def test_conv_stem_names_its_first_convolution(tiny_config):
    model = VisionTransformer(**tiny_config(conv_stem=True))
    assert f"{model.pretrained_cfg['first_conv']}.weight" in model.state_dict()
    assert model.pretrained_cfg["first_conv"] == "patch_embed.stem.0.conv"


def test_reset_classifier_keeps_device_dtype_and_mode(tiny_config):
    """timm's contract: a new head on the model's device, in its dtype and mode; num_classes follows."""
    model = VisionTransformer(**tiny_config()).to(device="meta", dtype=torch.float64).eval()
    model.reset_classifier(7)
    assert (model.head.weight.device.type, model.head.weight.dtype, model.head.training) == (
        "meta",
        torch.float64,
        False,
    )
    assert model.num_classes == 7


@pytest.mark.parametrize(("out_indices", "output_fmt", "norm"), [(None, "NCHW", False), ((0, 2), "NLC", True)])
def test_features_only_equals_timms_features_only_vit_with_the_same_weights(out_indices, output_fmt, norm, tiny_config):
    """Ours (timm's FeatureGetterNet over our model) equals timm's wrapper over timm's ViT carrying the same weights."""
    config = tiny_config()
    options = dict(output_fmt=output_fmt, norm=norm, **({"out_indices": out_indices} if out_indices else {}))
    ours = create_model("vit_tiny_patch4_32", features_only=True, **{**config, **options}).eval()
    timm_vit = TimmViT(**config)
    timm_vit.load_state_dict(ours.model.state_dict(), strict=False)  # ours lost the blocks after the last taken
    theirs = FeatureGetterNet(timm_vit, out_indices or 3, output_fmt=output_fmt, norm=norm).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        _assert_trees_close(ours(x), theirs(x), atol=1e-5)
    assert ours.feature_info.channels() == theirs.feature_info.channels()
    assert ours.feature_info.reduction() == theirs.feature_info.reduction() == [4] * len(ours.out_indices)
    assert len(ours.model.blocks) == (out_indices[-1] if out_indices else 3) + 1  # the blocks after the last dropped
    assert "classifier" not in ours.pretrained_cfg and ours.pretrained_cfg["input_size"] == (3, 32, 32)


@pytest.mark.parametrize("kind", list(KINDS))
def test_features_only_of_every_attention_kind_are_the_blocks_outputs(kind, tiny_config):
    """Captured by forward hooks on the blocks of the same weights, then laid out (B, C, rows, cols)."""
    features = create_model("vit_tiny_patch4_32", features_only=True, out_indices=(1, 3), **tiny_config(**KINDS[kind]))
    model = VisionTransformer(**tiny_config(**KINDS[kind])).eval()
    model.load_state_dict(features.model.state_dict(), strict=False)
    outputs = []
    for i in (1, 3):
        model.blocks[i].register_forward_hook(lambda module, args, out: outputs.append(out))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        model(x)
        got = features.eval()(x)
    expected = [y[:, 1:].reshape(2, 8, 8, -1).permute(0, 3, 1, 2) for y in outputs]
    _assert_trees_close(got, expected, atol=0)


def test_feature_options_without_features_only_are_refused():
    with pytest.raises(ValueError, match="out_indices choose the features of features_only=True: pass it too"):
        create_model("vit_tiny_patch4_32", out_indices=3)
    with pytest.raises(ValueError, match="bad override for model 'vit_tiny_patch4_32'.*depht"):
        create_model("vit_tiny_patch4_32", features_only=True, depht=3)
