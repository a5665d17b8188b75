"""The end of :class:`~vit.VisionTransformer`: pooling the tokens, the classifier, and DeiT's distillation head.

Distillation token: Touvron et al., "Training data-efficient image transformers & distillation through attention"
(DeiT, ICML 2021). A second learned prefix token, ``dist_token``, goes through the blocks beside the class token and
has its own classifier, ``head_dist``, trained to match a teacher's predictions (the training loss lives in
:mod:`vit.distillation`) while ``head`` learns the labels. At inference the two heads' logits are averaged, as DeiT
and timm's ``VisionTransformerDistilled`` do; while training with ``set_distilled_training(True)`` the model returns
both. Parameter names are timm's (``dist_token``, ``head_dist``), so timm's distilled DeiT weights load.
"""

from __future__ import annotations

from typing import Literal

import torch
from timm.layers import trunc_normal_
from torch import nn

GlobalPool = Literal["token", "avg", "map", "seqpool"]


def init_vit_weights(module: nn.Module) -> None:
    """ViT/DeiT initialisation of one module: linear layers a truncated normal with std 0.02 and zero bias,
    LayerNorms ones and zeros."""
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class HeadMixin(nn.Module):
    """Pooling, the classifier and the distillation head of a :class:`~vit.VisionTransformer` (module docstring)."""

    global_pool: str
    num_prefix_tokens: int
    has_class_token: bool
    embed_dim: int
    attn_pool: nn.Module | None
    dist_token: nn.Parameter | None
    head_dist: nn.Module | None
    distilled_training: bool = False

    def get_classifier(self) -> nn.Module:
        """The classification head."""
        return self.head

    @torch.jit.ignore
    def set_distilled_training(self, enable: bool = True) -> None:
        """While training, return the logits of both heads, ``(class, distillation)``, for the distillation loss
        (timm's switch); otherwise, and always at evaluation, their mean."""
        self.distilled_training = enable

    def reset_classifier(self, num_classes: int, global_pool: Literal["", GlobalPool] | None = None) -> None:
        """Replace the head (and the distillation head) with a freshly initialised one for ``num_classes`` classes
        (0 for none); leaving ``"map"`` or ``"seqpool"`` drops the learned pooling head, and each needs a model built
        with it. ``""`` pools nothing: ``forward_head`` then maps every token (timm's convention, used by
        ``prune_intermediate_layers``)."""
        self.num_classes = num_classes
        if global_pool is not None:
            if global_pool == "token" and not self.has_class_token:
                raise ValueError("global_pool='token' needs a class token")
            if global_pool in ("map", "seqpool") and global_pool != self.global_pool:
                raise ValueError(
                    f"global_pool={global_pool!r} needs the attention-pooling head: build the model with it"
                )
            if global_pool not in ("map", "seqpool"):
                self.attn_pool = None
            self.global_pool = global_pool
        self.head = self._new_head(num_classes)
        if self.head_dist is not None:
            self.head_dist = self._new_head(num_classes)

    def _new_head(self, num_classes: int) -> nn.Module:
        head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        head.apply(init_vit_weights)  # drawn as at construction, then moved to the model's device, dtype and mode
        weight = self.patch_embed.proj.weight
        return head.to(device=weight.device, dtype=weight.dtype).train(self.training)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens ``(B, prefix + N, C)`` to one vector per image ``(B, C)``; ``global_pool=""``: the tokens as they
        are."""
        if self.global_pool == "":
            return x
        if self.attn_pool is not None:
            return self.attn_pool(x[:, self.num_prefix_tokens :])  # MAP or sequence pooling over the patch tokens
        if self.global_pool == "avg":
            return x[:, self.num_prefix_tokens :].mean(dim=1)
        return x[:, 0]

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Pool tokens and classify; ``pre_logits=True`` returns the pooled, normalised features. With a distillation
        token the class and distillation logits are averaged (their features too, with ``pre_logits``), or returned
        as a pair while training with :meth:`set_distilled_training`."""
        features = self.head_drop(self.fc_norm(self.pool(x)))
        if self.dist_token is None or self.global_pool == "":
            return features if pre_logits else self.head(features)
        dist = self.head_drop(self.fc_norm(x[:, int(self.has_class_token)]))  # the token after the class token
        if pre_logits:
            return (features + dist) / 2
        logits, dist_logits = self.head(features), self.head_dist(dist)
        if self.distilled_training and self.training and not torch.jit.is_scripting():
            return logits, dist_logits
        return (logits + dist_logits) / 2
