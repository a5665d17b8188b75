"""Sequence pooling (SeqPool): the image vector as an attention-weighted average of the tokens.

Hassani et al., "Escaping the Big Data Paradigm with Compact Transformers" (CCT, 2021), Sec. 3.2. Instead of reading
one class token or averaging the tokens, a linear layer scores every token, ``s_i = w · x_i + b``, the scores are
turned into weights over the sequence, ``a = softmax(s)``, and the image vector is ``z = Σ_i a_i x_i``: one latent
query whose "attention" is a learned linear function of each token, ``dim`` parameters in all. CCT's linear layer has
a bias ``b``, which the softmax over the tokens cancels (it adds the same to every score, so its gradient is zero):
it is left out here. The authors report
+1.0 to +1.6 points on CIFAR over a class token at the same cost.

Here it reads the patch tokens (``prefix`` tokens are not pooled, as with ``"avg"`` and ``"map"``); CCT has no prefix
tokens, so the two agree there. For explanation it shows the interface of the attention-pooling head
(:class:`~vit.layers.AttentionPoolLatent`): :meth:`SequencePool.attention_weights` as one head and one latent,
``(B, 1, 1, N)``, so rollout and attribution read it as they read a MAP head.
"""

from __future__ import annotations

import torch
from timm.layers import trunc_normal_
from torch import nn


class SequencePool(nn.Module):
    """``(B, N, C) -> (B, C)``: ``softmax(score(x))``-weighted sum of the tokens (module docstring).

    Args:
        dim: Token width.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.score = nn.Linear(dim, 1, bias=False)
        self.init_weights()

    def init_weights(self) -> None:
        """Truncated normal with std 0.02, as every linear layer of the ViT."""
        trunc_normal_(self.score.weight, std=0.02)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Pool tokens ``(B, N, C)`` into ``(B, C)``; ``key_mask (B, N)`` marks the tokens that may be pooled."""
        return self.pool_latents(self.apply_weights(self.attention_weights(x, key_mask), x))

    def attention_weights(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The pooling weights ``softmax_i(score(x_i))`` as one head of one latent, ``(B, 1, 1, N)``; rows sum to 1."""
        scores = self.score(x).transpose(1, 2)  # (B, 1, N)
        if key_mask is not None:
            scores = scores.masked_fill(~key_mask[:, None, :], float("-inf"))
        return scores.softmax(dim=-1)[:, None]  # (B, 1, 1, N)

    def apply_weights(self, attn: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``attn @ x`` for given weights ``attn (B, 1, 1, N)``: :meth:`forward` with its weights replaced, so
        explanation code can differentiate through them. Returns ``(B, 1, C)``."""
        return attn[:, 0] @ x

    def pool_latents(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, 1, C) -> (B, C)``, the interface of :meth:`AttentionPoolLatent.pool_latents`."""
        return x[:, 0]
