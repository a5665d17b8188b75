"""Vision Transformer for image classification.

Dosovitskiy et al., "An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale" (ICLR 2021);
training-friendly defaults from Touvron et al., "Training data-efficient image transformers" (DeiT, ICML 2021);
register tokens from Darcet et al., "Vision Transformers Need Registers" (ICLR 2024); local-window blocks
interleaved with global ones from Li et al., ViTDet (ECCV 2022); sliding windows from Hassani et al.,
"Neighborhood Attention Transformer" (CVPR 2023) and its dilated form, DiNAT (Hassani & Shi, 2022); linear
attention from Katharopoulos et al. (ICML 2020); the attention-pooling (MAP) head of SigLIP (Zhai et al., ICCV 2023);
for small data, locality self-attention and shifted patch tokens from Lee, Lee & Song (2021) and sequence pooling from
CCT (Hassani et al., 2021); DeiT's distillation token (:mod:`vit.models.heads`).

Parameter names and shapes follow timm's ``VisionTransformer``, so timm checkpoints load with a plain
``load_state_dict``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Literal

import torch
from timm.layers import PatchDropout, trunc_normal_
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..layers import AttentionPoolLatent, Block, SequencePool, build_sincos_2d_pos_embed, resample_pos_embed
from ..layers.linear_attention import FeatureMap
from .assembly import AttentionKind, attention_layers, patch_embedding, pool_head
from .checks import check_arguments, check_sliding
from .heads import GlobalPool, HeadMixin
from .heads import init_vit_weights as _init_vit_weights
from .intermediates import IntermediatesMixin
from .pretrained_cfg import block_feature_info, default_pretrained_cfg

__all__ = ["AttentionKind", "VisionTransformer", "block_attention_kinds"]


class VisionTransformer(IntermediatesMixin, HeadMixin, nn.Module):
    """Vision Transformer with optional class/register tokens and local-window or sliding-window blocks.

    Initialisation follows ViT/DeiT: every linear layer (and the patch projection, a linear map over
    flattened patches) gets a truncated normal with std 0.02 and zero bias; learned position embeddings
    get a truncated normal with std 0.02, class and register tokens a normal with std 1e-6 (timm); LayerNorm
    weights are ones and biases zeros; the sin-cos table is fixed.

    Args:
        img_size: Input image size, an int or ``(height, width)``.
        patch_size: Patch size; must divide ``img_size``.
        in_chans: Number of input channels.
        num_classes: Number of classes; 0 makes the head an identity (features only).
        embed_dim: Token width.
        depth: Number of blocks.
        num_heads: Attention heads per block; must divide ``embed_dim``.
        mlp_ratio: MLP hidden width relative to ``embed_dim``.
        qkv_bias: Whether the ``qkv`` projections have a bias.
        qk_norm: Normalise queries and keys per head.
        class_token: Prepend a learned class token.
        reg_tokens: Number of register tokens after the class token.
        distilled: DeiT's distillation token after the class token, with its own head ``head_dist``; the logits are
            the mean of both heads' (:mod:`vit.models.heads`, timm's ``VisionTransformerDistilled``).
        global_pool: ``"token"`` pools the class token, ``"avg"`` the mean of the patch tokens, ``"map"`` a learned
            latent query attending to the patch tokens (:class:`~vit.layers.AttentionPoolLatent`, timm's
            ``attn_pool``; prefix tokens are not attended to, as in timm), ``"seqpool"`` CCT's sequence pooling, a
            softmax-weighted average of the patch tokens by a learned linear score (:class:`~vit.layers.SequencePool`,
            as ``attn_pool``).
        latent_len: Number of latent queries of the ``"map"`` head (their outputs are averaged).
        pos_embed: ``"learn"`` (learned table), ``"sincos"`` (fixed 2-D sine-cosine over patches), ``"none"``.
        no_embed_class: With ``"learn"``, give position embeddings to patches only, not to prefix tokens.
        conv_stem: Embed patches with a convolutional stem (3x3 stride-2 convolutions + BatchNorm + ReLU, then a
            1x1 projection; Xiao et al. 2021) instead of one patchify convolution. See :class:`PatchEmbed`.
        shifted_patches: Shifted patch tokenization (Lee et al. 2021): the image and its four half-patch-shifted
            copies are embedded together (:class:`~vit.layers.ShiftedPatchEmbed`); with ``conv_stem`` they are the
            stem's input.
        init_values: Layer-scale initial value; ``None`` disables layer scale.
        fc_norm: Normalise the pooled features instead of the tokens; ``None`` means ``global_pool == "avg"``.
        drop_rate: Dropout before the head.
        pos_drop_rate: Dropout after adding position embeddings.
        patch_drop_rate: Fraction of patch tokens dropped at random per image during training (PatchDropout, Liu
            et al. 2023; timm's layer): about that much less work per step in the blocks, all tokens at evaluation.
            Global attention only (windows need the whole grid).
        proj_drop_rate: Dropout after attention projections and in the MLPs.
        attn_drop_rate: Dropout on attention weights.
        drop_path_rate: Stochastic-depth rate of the last block, increasing linearly from 0 over depth.
        window_size: 0 for global attention everywhere; ``w > 0`` makes every block not listed in
            ``global_attn_indexes`` attend within ``w × w`` windows of the patch grid (plus the prefix tokens).
        window_type: ``"block"``: fixed, non-overlapping windows (Swin / ViTDet); ``"sliding"``: the ``w × w``
            neighbourhood of each patch, shifted inward at the border (NAT); ``w`` must then be odd.
        window_dilation: Stride between the neighbours of a sliding window (DiNAT); ``w · dilation`` must fit in
            the grid. Sliding windows only.
        global_attn_indexes: Indexes of the blocks that stay global (softmax) when ``window_size > 0`` or
            ``linear_attention``.
        linear_attention: Every block not in ``global_attn_indexes`` uses :class:`~vit.layers.LinearAttention`
            (same parameters as :class:`~vit.layers.Attention`); needs ``window_size=0``.
        linear_feature_map: Feature map of the linear blocks: ``"elu"`` (``elu + 1``) or ``"relu"``.
        locality_attention: Locality self-attention (Lee et al. 2021) in the global and block-window blocks: each
            token's own key masked out, a learned scale per head (:class:`~vit.layers.LocalityAttention`, one more
            parameter per block). Not with sliding windows or linear attention.
        shift_windows: Shift the window grid by ``w // 2`` in every second window block (Swin); block windows only.
        fused_attn: Use PyTorch's fused attention kernels; ``False`` selects the explicit path.
        norm_layer: Normalisation layer class; default ``LayerNorm(eps=1e-6)`` as in timm and big_vision.
        dynamic_img_size: Accept any image size divisible by the patch (timm's option): the learned position
            embedding is resampled to the input's grid in every forward pass (bicubic, as timm), the sin-cos table
            rebuilt for it, and window and sliding blocks use (and cache) the pattern of that grid.
        dynamic_img_pad: Pad the input with zeros at the bottom and right to a multiple of the patch (timm's option;
            with a fixed ``img_size`` the input must still match it).

    Raises:
        ValueError: On inconsistent arguments (the message names the argument).
    """

    __jit_unused_properties__ = ["default_cfg"]  # TorchScript leaves the property out

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        class_token: bool = True,
        reg_tokens: int = 0,
        distilled: bool = False,
        global_pool: GlobalPool = "token",
        latent_len: int = 1,
        pos_embed: Literal["learn", "sincos", "none"] = "learn",
        no_embed_class: bool = False,
        conv_stem: bool = False,
        shifted_patches: bool = False,
        init_values: float | None = None,
        fc_norm: bool | None = None,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        patch_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        window_size: int = 0,
        window_type: Literal["block", "sliding"] = "block",
        window_dilation: int = 1,
        global_attn_indexes: Sequence[int] = (),
        shift_windows: bool = False,
        linear_attention: bool = False,
        linear_feature_map: FeatureMap = "elu",
        locality_attention: bool = False,
        fused_attn: bool = True,
        norm_layer: type[nn.Module] | None = None,
        dynamic_img_size: bool = False,
        dynamic_img_pad: bool = False,
    ) -> None:
        """Build the model from timm's flat argument list (documented on the class): check the arguments, then create
        the modules in timm's order, so that seeded initialisation and state dicts match timm's."""
        super().__init__()
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim  # timm's names: tokens, pooled
        self.in_chans = in_chans
        self.has_class_token = class_token
        self.num_reg_tokens = reg_tokens
        self.num_prefix_tokens = int(class_token) + int(distilled) + reg_tokens
        self.no_embed_class = no_embed_class or pos_embed == "sincos"
        self.window_size = window_size
        self.window_type = window_type
        self.window_dilation = window_dilation
        self.global_attn_indexes = tuple(global_attn_indexes)
        self.linear_attention = linear_attention
        self.locality_attention = locality_attention
        self.dynamic_img_size = dynamic_img_size
        self.grad_checkpointing = False
        check_arguments(
            self, num_heads, depth, latent_len, pos_embed, patch_drop_rate, shift_windows, linear_feature_map
        )
        norm_layer = norm_layer or partial(nn.LayerNorm, eps=1e-6)
        use_fc_norm = global_pool == "avg" if fc_norm is None else fc_norm

        self._build_embedding(
            distilled, img_size, patch_size, in_chans, conv_stem, shifted_patches, dynamic_img_pad, pos_embed
        )
        self.pos_drop = nn.Dropout(pos_drop_rate)
        self.patch_drop: nn.Module = nn.Identity()
        if patch_drop_rate:
            self.patch_drop = PatchDropout(patch_drop_rate, num_prefix_tokens=self.num_prefix_tokens)
        block = partial(
            Block,
            embed_dim,
            num_heads,
            mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            proj_drop=proj_drop_rate,
            attn_drop=attn_drop_rate,
            init_values=init_values,
            fused_attn=fused_attn,
            norm_layer=norm_layer,
        )
        dpr = torch.linspace(0, drop_path_rate, depth, device="cpu").tolist()  # stochastic depth, linear in depth
        kinds = block_attention_kinds({**vars(self), "depth": depth})
        grid, P = self.patch_embed.grid_size, self.num_prefix_tokens
        layers = attention_layers(
            kinds, grid, P, window_size, window_dilation, shift_windows, linear_feature_map, locality_attention
        )
        self.blocks = nn.Sequential(
            *(block(drop_path=rate, attn_layer=layer) for rate, layer in zip(dpr, layers, strict=True))
        )
        self.norm = norm_layer(embed_dim) if not use_fc_norm else nn.Identity()
        self.attn_pool: AttentionPoolLatent | SequencePool | None = pool_head(
            global_pool, embed_dim, num_heads, mlp_ratio, latent_len, norm_layer, fused_attn
        )
        self.fc_norm = norm_layer(embed_dim) if use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.head_dist = None
        if distilled:
            self.head_dist = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.init_weights()
        self.feature_info = block_feature_info(depth, embed_dim, self.patch_embed.patch_size)
        self.pretrained_cfg = default_pretrained_cfg(img_size, in_chans, num_classes, dynamic_img_size, conv_stem)

    def _build_embedding(
        self,
        distilled: bool,
        img_size: int | tuple[int, int],
        patch_size: int | tuple[int, int],
        in_chans: int,
        conv_stem: bool,
        shifted_patches: bool,
        dynamic_img_pad: bool,
        pos_embed: str,
    ) -> None:
        """The patch embedding, the prefix tokens and the position embedding (zeros until :meth:`init_weights`)."""
        embed_dim = self.embed_dim
        self.patch_embed = patch_embedding(
            img_size,
            patch_size,
            in_chans,
            embed_dim,
            shifted_patches,
            conv_stem=conv_stem,
            dynamic_img_size=self.dynamic_img_size,
            dynamic_img_pad=dynamic_img_pad,
            output_fmt="NHWC" if self.dynamic_img_size else "NLC",  # the grid of the input stays visible (timm)
        )
        grid_size = self.patch_embed.grid_size
        if self.window_size and self.window_type == "sliding":
            check_sliding(grid_size, self.window_size, self.window_dilation)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if self.has_class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, self.num_reg_tokens, embed_dim)) if self.num_reg_tokens else None
        embed_len = self.patch_embed.num_patches + (0 if self.no_embed_class else self.num_prefix_tokens)
        if pos_embed == "learn":
            self.pos_embed = nn.Parameter(torch.zeros(1, embed_len, embed_dim))
        elif pos_embed == "sincos":
            self.register_buffer("pos_embed", build_sincos_2d_pos_embed(grid_size, embed_dim), persistent=False)
        else:
            self.pos_embed = None

    def attention_kinds(self) -> list[AttentionKind]:
        """The attention of each block, in order: ``"global"`` (softmax over all tokens), ``"window"`` (fixed windows,
        :class:`~vit.layers.WindowAttention`), ``"sliding"`` (the neighbourhood of each patch,
        :class:`~vit.layers.NeighborhoodAttention`) or ``"linear"`` (:class:`~vit.layers.LinearAttention`)."""
        return block_attention_kinds({**vars(self), "depth": len(self.blocks)})  # attributes named as the arguments

    def init_weights(self) -> None:
        """ViT/DeiT initialisation (see the class docstring)."""
        if isinstance(self.pos_embed, nn.Parameter):
            trunc_normal_(self.pos_embed, std=0.02)
        for token in (self.cls_token, self.reg_token):
            if token is not None:
                nn.init.normal_(token, std=1e-6)
        if self.dist_token is not None:
            trunc_normal_(self.dist_token, std=0.02)  # timm's distilled DeiT
        self.apply(_init_vit_weights)
        if self.attn_pool is not None:
            self.attn_pool.init_weights()
        trunc_normal_(self.patch_embed.proj.weight, std=0.02)
        if self.patch_embed.proj.bias is not None:
            nn.init.zeros_(self.patch_embed.proj.bias)

    @property
    def default_cfg(self) -> dict[str, Any]:
        """timm's older name of ``pretrained_cfg``."""
        return self.pretrained_cfg

    @default_cfg.setter
    def default_cfg(self, cfg: dict[str, Any]) -> None:
        self.pretrained_cfg = cfg

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Names of parameters that take no weight decay (position embedding and prefix tokens), timm's hook."""
        return {"pos_embed", "cls_token", "dist_token", "reg_token"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        """Parameter groups by depth for layer-wise learning-rate decay (timm's ``param_groups_layer_decay``)."""
        return {
            "stem": r"^cls_token|^dist_token|^pos_embed|^patch_embed|^reg_token",
            "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        }

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of keeping them (timm's hook).

        Every block runs under :func:`torch.utils.checkpoint.checkpoint` (non-reentrant, random state preserved, so
        dropout and drop-path draw the same masks): the same loss and gradients for about a third more compute, and
        only each block's input kept per block.
        """
        self.grad_checkpointing = enable

    def _pos_embed(self, x: torch.Tensor, grid_size: tuple[int, int] | None = None) -> torch.Tensor:
        """Add position embeddings and prepend prefix tokens: ``(B, N, C) -> (B, prefix + N, C)``.

        ``grid_size``: the patch grid of ``x`` when the image size is dynamic; the learned table is resampled to it
        (prefix positions kept), the sin-cos table rebuilt for it.
        """
        B = x.shape[0]
        prefix = []
        if self.cls_token is not None:
            prefix.append(self.cls_token.expand(B, -1, -1))
        if self.dist_token is not None:
            prefix.append(self.dist_token.expand(B, -1, -1))
        if self.reg_token is not None:
            prefix.append(self.reg_token.expand(B, -1, -1))
        pos_embed = self.pos_embed
        if pos_embed is not None and grid_size is not None and grid_size != self.patch_embed.grid_size:
            if isinstance(pos_embed, nn.Parameter):
                num_prefix = 0 if self.no_embed_class else self.num_prefix_tokens
                pos_embed = resample_pos_embed(pos_embed, grid_size, self.patch_embed.grid_size, num_prefix)
            else:
                table = build_sincos_2d_pos_embed(grid_size, self.embed_dim)
                pos_embed = table.to(device=pos_embed.device, dtype=pos_embed.dtype)
        if self.no_embed_class:
            if pos_embed is not None:
                x = x + pos_embed
            x = torch.cat([*prefix, x], dim=1) if prefix else x
        else:
            x = torch.cat([*prefix, x], dim=1) if prefix else x
            if pos_embed is not None:
                x = x + pos_embed
        return self.pos_drop(x)

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int] | None]:
        """Images ``(B, C, H, W)`` to the first block's input ``(B, prefix + N, C)``, and the patch grid when the
        image size is dynamic (``None``: the model's grid)."""
        x = self.patch_embed(x)  # (B, N, C), or (B, rows, cols, C) with a dynamic image size
        grid_size = None
        if self.dynamic_img_size:
            B, rows, cols, C = x.shape
            grid_size = (rows, cols)
            x = x.reshape(B, rows * cols, C)
        x = self.patch_drop(self._pos_embed(x, grid_size))  # fewer patches when training with patch_drop
        return x, grid_size

    def run_block(self, block: nn.Module, x: torch.Tensor, grid_size: tuple[int, int] | None = None) -> torch.Tensor:
        """One block, under gradient checkpointing when it is on and gradients are recorded."""
        if self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
            return checkpoint(block, x, grid_size, use_reentrant=False)
        return block(x, grid_size)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``(B, C, H, W)`` to normalised tokens ``(B, prefix + N, embed_dim)``."""
        x, grid_size = self.embed(x)  # (B, prefix + N, C)
        for block in self.blocks:
            x = self.run_block(block, x, grid_size)
        return self.norm(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``(B, C, H, W)`` to logits ``(B, num_classes)``."""
        return self.forward_head(self.forward_features(x))


def block_attention_kinds(settings: Mapping[str, Any]) -> list[AttentionKind]:
    """The attention kind of each block (:meth:`VisionTransformer.attention_kinds`) of a model built with ``settings``,
    its keyword arguments (those missing at their defaults). Nothing is checked: arguments it refuses get kinds too."""
    args = {**_DEFAULTS, **settings}
    local = "linear" if args["linear_attention"] else "global" if not args["window_size"] else "window"
    if local == "window" and args["window_type"] == "sliding":
        local = "sliding"
    return ["global" if i in args["global_attn_indexes"] else local for i in range(args["depth"])]


_DEFAULTS = {name: parameter.default for name, parameter in inspect.signature(VisionTransformer).parameters.items()}

# timm's registry files an entrypoint under the last part of its module's name (its tests choose the models with
# forward_intermediates by it) and reads that module's default_cfgs: vit.models.register_timm_models fills both.
default_cfgs: dict[str, dict[str, Any]] = {}
