"""The attention explorer's data, encoded: attention rows as a few bits of their shape in grayscale PNGs, maps as
float16, pictures as PNG or JPEG, every block's attention pattern.

Every attention row is a probability distribution over the keys, so only its shape is kept: each value ``a`` becomes
``round(L sqrt(a / m))`` with ``m`` the maximum of its key group (the class and register tokens, or the patches) and
``L = 2**bits - 1``, and the page decodes ``(code / L)**2`` and rescales each group to its share of the row (the
smaller share kept as float16; rows sum to 1). The square root spends the codes where a row's long tail is, which is
what its entropy and mean distance are made of. The codes of an image, every block and head stacked, are one
grayscale PNG that the page inflates with the browser's ``DecompressionStream``.
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image
from torch import nn

from ..capture import attention_modules
from ..colors import lookup_table
from .images import b64, png_bytes, to_uint8_image

if TYPE_CHECKING:
    from ..explanation import Explanation

CODES = ("attn", "share", "pool")
"""The fields of an image's entry that the page reads only when it shows that image: a script element per image
(``explorer-codes-<i>``), as is its picture (``explorer-picture-<i>``)."""
DEFAULT_BITS = 6
"""Bits per attention code: a value ``a`` comes back within about ``m sqrt(a / m) / 63`` (``m``: the maximum of its key
group), 1.6 % of ``m`` at the top of a row and finer in its tail."""
AUTO_BITS = (6, 5, 4, 3)
"""The bits ``bits="auto"`` tries, finest first: the first whose file fits ``max_bytes``, else the last (then images
are refused or left out as without it). Below 3 bits a map has 4 shades: too coarse to choose without being asked."""


def lut(cmap: str, size: int) -> str:
    """A colour map's lookup table as base64 ``uint8`` RGB, ``size`` colours (the page bins as matplotlib does)."""
    return b64(np.rint(lookup_table(cmap, size) * 255.0).astype(np.uint8).tobytes())


def _chunk(kind: bytes, body: bytes) -> bytes:
    """A PNG chunk: length, type, body, CRC-32 of type and body."""
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def codes_png(codes: np.ndarray, bits: int) -> str:
    """Grayscale ``bits``-bit codes ``(H, W)`` (``uint8``) as base64 PNG: row filters from 4 bits, none below.

    Pillow filters each row by the PNG heuristic, which pays on fine codes (6 bits: 15 % smaller than unfiltered)
    and costs on coarse ones, where deflate alone finds the repeats (2 bits: 27 % larger, on ViT-S/16's attention);
    the unfiltered PNG (filter 0 on every row) is written here, with zlib.
    """
    if bits >= 4:
        return b64(png_bytes(codes, 9))
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    rows = np.concatenate([np.zeros((codes.shape[0], 1), np.uint8), codes], axis=1)  # filter byte 0, then the row
    header = struct.pack(">IIBBBBB", codes.shape[1], codes.shape[0], 8, 0, 0, 0, 0)  # 8-bit grey, not interlaced
    plain = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 9))
    return b64(plain + _chunk(b"IEND", b""))


def picture(pixels: np.ndarray) -> str:
    """An ``(H, W, 3)`` image to show, as base64: PNG up to 64 pixels a side (each pixel shows, upscaled), JPEG of
    quality 90 above (a 224-pixel photograph: about 20 kB instead of 140 kB)."""
    if max(pixels.shape[:2]) <= 64:
        return b64(png_bytes(pixels, 9))
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, format="JPEG", quality=90)
    return b64(buffer.getvalue())


def quantize_rows(
    attn: torch.Tensor, prefix: int = 0, bits: int = DEFAULT_BITS
) -> tuple[np.ndarray, np.ndarray | None]:
    """Attention rows as ``bits``-bit codes of their shape, and the share of each row on each key group.

    The keys of a row fall in two groups, the ``prefix`` class / register tokens and the patches, each coded against
    its own maximum (an attention sink on the class token must not flatten the patch map to zeros): a value ``a`` of
    a group with maximum ``m`` becomes ``round(L sqrt(a / m))``, ``L = 2**bits - 1``. The page decodes
    ``(code / L)**2`` and scales each group to its share of the row, so a decoded row sums to 1 (softmax rows, window
    rows and linear attention's normalised weights all do). One float16 per row keeps the smaller of the two shares,
    the larger being 1 minus it: positive, the prefix share; negative, minus the patches' share. Kept the other way, a
    sink row's patch share (1 minus a prefix share float16 rounds to 1 above 0.99976) would be zero.

    Args:
        attn: ``(..., Q, K)`` non-negative weights.
        prefix: How many leading keys form the prefix group (0: one group).
        bits: Bits per code, 2 to 8.

    Returns:
        ``(codes, share)``: ``uint8`` codes of ``attn``'s shape, and (``prefix > 0``) every row's smaller share as
        float16, ``(..., Q)`` (negative: the patches'); ``None`` without prefix keys.
    """
    check_bits(bits)
    attn = attn.detach().double().cpu().clamp_min(0)
    levels = 2**bits - 1
    codes = torch.empty_like(attn, dtype=torch.uint8)
    for keys in (slice(prefix, None), slice(0, prefix)):
        group = attn[..., keys]
        if group.shape[-1]:
            top = group.amax(dim=-1, keepdim=True)
            ratio = group / torch.where(top > 0, top, torch.ones_like(top))
            codes[..., keys] = (ratio.sqrt() * levels).round().clamp(0, levels).to(torch.uint8)
    if not prefix:
        return codes.numpy(), None
    total = attn.sum(-1)
    total = torch.where(total > 0, total, torch.ones_like(total))
    front, back = attn[..., :prefix].sum(-1) / total, attn[..., prefix:].sum(-1) / total
    return codes.numpy(), torch.where(front <= back, front, -back).numpy().astype(np.float16)  # -0.0: patches hold 0


def check_bits(bits: int | str, auto: bool = False, name: str = "bits") -> None:
    """Refuse ``bits`` unless it is an ``int`` from 2 to 8 (or, with ``auto``, the string ``"auto"``)."""
    if auto and bits == "auto":
        return
    if not (isinstance(bits, int) and not isinstance(bits, bool) and 2 <= bits <= 8):
        choices = '"auto" or an integer from 2 to 8' if auto else "an integer from 2 to 8"
        raise ValueError(f"{name} must be {choices}, got {bits!r}")


def block_info(model: nn.Module) -> list[dict[str, Any]]:
    """Kind, label and allowed-pattern PNG (255 = allowed; ``None`` for dense blocks) of every block."""
    blocks = []
    for attn, kind in zip(attention_modules(model), model.attention_kinds(), strict=True):  # the model says its kinds
        mask = attn.dense_mask() if callable(getattr(attn, "dense_mask", None)) else None
        label = {"window": "window", "sliding": "sliding window", "linear": "linear (implicit)", "global": "global"}
        blocks.append(
            {
                "kind": kind,
                "label": label[kind],
                "mask": None if mask is None else b64(png_bytes(mask.cpu().numpy().astype(np.uint8) * 255, 9)),
            }
        )
    return blocks


def encode_image(explanation: Explanation, i: int, index: int, prefix: int, bits: int) -> dict[str, Any]:
    """Everything the page needs of image ``i`` of ``explanation`` (every block's attention kept, its maps), which is
    image ``index`` of the page."""
    pixels = to_uint8_image(explanation.images[i])
    probs = explanation.probs[i]
    top = probs.topk(min(5, probs.numel()))
    codes, share = quantize_rows(torch.stack([attn[i] for attn in explanation.attentions]), prefix, bits)
    entry: dict[str, Any] = {
        "index": index,
        "image": picture(pixels),
        "label": None if explanation.labels is None else int(explanation.labels[i]),
        "pred": int(explanation.preds[i]),
        "top": [[int(c), round(float(p), 5)] for p, c in zip(top.values, top.indices, strict=True)],
        "attn": codes_png(codes.reshape(-1, codes.shape[-1]), bits),  # (blocks · heads · N, N), stacked
        "maps": {name: half_map(grid[i]) for name, grid in explanation.maps.items()},
    }
    if share is not None:
        entry["share"] = b64(share.astype("<f2").tobytes())  # (blocks, heads, N)
    if index == 0:  # the rows the page opens on (the first patch as query), in its data: drawn before the rest
        entry["first"] = {"attn": codes_png(codes[:, :, prefix].reshape(-1, codes.shape[-1]), bits)}
        if share is not None:
            entry["first"]["share"] = b64(share[:, :, prefix].astype("<f2").tobytes())
    if explanation.pool_attention is not None:
        pool, _ = quantize_rows(explanation.pool_attention[i], 0, bits)  # (heads, latent, patches)
        entry["pool"] = codes_png(pool.reshape(-1, pool.shape[-1]), bits)
    return entry


def half_map(values: torch.Tensor) -> dict[str, Any]:
    """A map as float16 (base64) of ``values / max |values|`` and that maximum: 2 bytes a patch, 3 digits."""
    values = values.nan_to_num(0.0, 0.0, 0.0)  # one NaN patch must not blank the whole map
    top = float(values.abs().max())
    scaled = values.flatten().numpy() / (top if top > 0 else 1.0)
    return {"max": top, "f16": b64(scaled.astype("<f2").tobytes())}
