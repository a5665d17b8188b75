"""An attention explorer in one self-contained HTML file: click a patch, see where it looks in every block and head.

Per image the page shows the image and its patch grid; the query is a clicked patch (or one reached with the arrow
keys), the class token, a register token or the latent query of an attention-pooling head. For that query it draws
the attention row of every block and head (and the head mean) as small heatmaps over the image, outlines the allowed
neighbourhood of window and sliding-window blocks, shows linear attention's implicit weights, the entropy and mean
attention distance of the selected head per block (Dosovitskiy et al., ICLR 2021, Fig. 7), the top-5 prediction,
and overlays of image-level maps (attention rollout, Abnar & Zuidema, ACL 2020; attribution, Chefer et al.,
ICCV 2021; any other map passed in) with their faithfulness areas. The overlay is coloured by the rule of
:mod:`vit.explain.colors`, which the page repeats: a signed map (AttnLRP, integrated gradients, ...) on ``bwr`` from
``-max |value|`` to ``+max |value|``, white and transparent at zero; attention and the unsigned maps on ``inferno``
from 0 to their maximum; the colour bar under the image carries the numbers. The idea is bertviz's (Vig, "A Multiscale
Visualization of Attention in the Transformer Model", ACL 2019 demo), for the patches of a vision transformer.

Attention is stored compactly. Every row is a probability distribution over the keys, so the page keeps only its
shape: each value ``a`` becomes ``round(L sqrt(a / m))`` with ``m`` the maximum of its key group (the class and
register tokens, or the patches) and ``L = 2**bits - 1`` (6 bits at most unless asked), and the page decodes
``(code / L)**2``
and rescales each group to its share of the row (the smaller share kept as float16; rows sum to 1). The square root
spends the codes where a row's long tail is, which is what its entropy and mean distance are made of. The codes of
an image, every block and head stacked, are one grayscale PNG that the page inflates with the browser's
``DecompressionStream``; the file needs no network. :func:`explorer_payload` builds the data, :func:`render_explorer`
the page and :func:`write_explorer` writes it atomically, refusing an image set over ``max_bytes``.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn

from ..atomic import write_bytes
from ..layers import LinearAttention, NeighborhoodAttention, WindowAttention
from ..normalize import normalize
from .attribution import attention_attribution
from .capture import attention_modules
from .colors import DIVERGING, DIVERGING_LUT_SIZE, LUT_SIZE, SEQUENTIAL, is_signed, lookup_table
from .methods import DEFAULT_METHOD
from .pipeline import Explanation, explain_images

ASSETS = Path(__file__).with_name("explorer_assets")
CODES = ("attn", "share", "pool")
"""The fields of an image's entry that the page reads only when it shows that image: a script element per image
(``explorer-codes-<i>``), as is its picture (``explorer-picture-<i>``)."""
DEFAULT_BITS = 6
"""Bits per attention code: a value ``a`` comes back within about ``m sqrt(a / m) / 63`` (``m``: the maximum of its key
group), 1.6 % of ``m`` at the top of a row and finer in its tail."""
AUTO_BITS = (6, 5, 4, 3)
"""The bits ``bits="auto"`` tries, finest first: the first whose file fits ``max_bytes``, else the last (then images
are refused or left out as without it). Below 3 bits a map has 4 shades: too coarse to choose without being asked."""
DEFAULT_MAX_BYTES = 4_000_000
"""Largest explorer written by default: 4 MB, which 16 images of the CIFAR-10 recipe's model take a quarter of at
6 bits, and 8 of ViT-S/16 fill at 3 (the docs' Explorer section has the sizes)."""


class ExplorerTooLarge(ValueError):
    """The images asked for would make an explorer file over its size limit; the message says how many fit.

    Attributes:
        fit: About how many of the images fit under the limit.
    """

    def __init__(self, message: str, fit: int) -> None:
        super().__init__(message)
        self.fit = fit


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _lut(cmap: str, size: int) -> str:
    """A colour map's lookup table as base64 ``uint8`` RGB, ``size`` colours (the page bins as matplotlib does)."""
    return _b64(np.rint(lookup_table(cmap, size) * 255.0).astype(np.uint8).tobytes())


def _png(array: np.ndarray) -> str:
    """A ``uint8`` ``(H, W)`` (grayscale) or ``(H, W, 3)`` array as base64 PNG (zlib level 9)."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(array)).save(buffer, format="PNG", compress_level=9)
    return _b64(buffer.getvalue())


def _chunk(kind: bytes, body: bytes) -> bytes:
    """A PNG chunk: length, type, body, CRC-32 of type and body."""
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _codes_png(codes: np.ndarray, bits: int) -> str:
    """Grayscale ``bits``-bit codes ``(H, W)`` (``uint8``) as base64 PNG: row filters from 4 bits, none below.

    Pillow filters each row by the PNG heuristic, which pays on fine codes (6 bits: 15 % smaller than unfiltered)
    and costs on coarse ones, where deflate alone finds the repeats (2 bits: 27 % larger, on ViT-S/16's attention);
    the unfiltered PNG (filter 0 on every row) is written here, with zlib.
    """
    if bits >= 4:
        return _png(codes)
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    rows = np.concatenate([np.zeros((codes.shape[0], 1), np.uint8), codes], axis=1)  # filter byte 0, then the row
    header = struct.pack(">IIBBBBB", codes.shape[1], codes.shape[0], 8, 0, 0, 0, 0)  # 8-bit grey, not interlaced
    plain = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 9))
    return _b64(plain + _chunk(b"IEND", b""))


def _picture(pixels: np.ndarray) -> str:
    """An ``(H, W, 3)`` image to show, as base64: PNG up to 64 pixels a side (each pixel shows, upscaled), JPEG of
    quality 90 above (a 224-pixel photograph: about 20 kB instead of 140 kB)."""
    if max(pixels.shape[:2]) <= 64:
        return _png(pixels)
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, format="JPEG", quality=90)
    return _b64(buffer.getvalue())


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


def block_kind(attn: nn.Module) -> str:
    """``"window"``, ``"sliding"``, ``"linear"`` or ``"global"``: the attention pattern of a block's module."""
    for cls, kind in ((WindowAttention, "window"), (NeighborhoodAttention, "sliding"), (LinearAttention, "linear")):
        if isinstance(attn, cls):  # a subclass keeps its base's pattern
            return kind
    return "global"


def _block_info(model: nn.Module) -> list[dict[str, Any]]:
    """Kind, label and allowed-pattern PNG (255 = allowed; ``None`` for dense blocks) of every block."""
    blocks = []
    for attn in attention_modules(model):
        kind = block_kind(attn)
        mask = attn.dense_mask() if callable(getattr(attn, "dense_mask", None)) else None
        label = {"window": "window", "sliding": "sliding window", "linear": "linear (implicit)", "global": "global"}
        blocks.append(
            {
                "kind": kind,
                "label": label[kind],
                "mask": None if mask is None else _png(mask.cpu().numpy().astype(np.uint8) * 255),
            }
        )
    return blocks


def _encode_image(
    explanation: Explanation, i: int, maps: Mapping[str, torch.Tensor], offset: int, prefix: int, bits: int
) -> dict[str, Any]:
    """Everything the page needs of image ``i`` of one batch (``offset`` = its index among all images)."""
    pixels = (explanation.images[i].clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    if pixels.shape[2] == 1:
        pixels = np.repeat(pixels, 3, axis=2)
    probs = explanation.probs[i]
    top = probs.topk(min(5, probs.numel()))
    codes, share = quantize_rows(torch.stack([attn[i] for attn in explanation.attentions]), prefix, bits)
    entry: dict[str, Any] = {
        "index": offset + i,
        "image": _picture(pixels),
        "label": None if explanation.labels is None else int(explanation.labels[i]),
        "pred": int(explanation.preds[i]),
        "top": [[int(c), round(float(p), 5)] for p, c in zip(top.values, top.indices, strict=True)],
        "attn": _codes_png(codes.reshape(-1, codes.shape[-1]), bits),  # (blocks · heads · N, N), stacked
        "maps": {name: _half_map(grid[offset + i]) for name, grid in maps.items()},
    }
    if share is not None:
        entry["share"] = _b64(share.astype("<f2").tobytes())  # (blocks, heads, N)
    if offset + i == 0:  # the rows the page opens on (the first patch as query), in its data: drawn before the rest
        entry["first"] = {"attn": _codes_png(codes[:, :, prefix].reshape(-1, codes.shape[-1]), bits)}
        if share is not None:
            entry["first"]["share"] = _b64(share[:, :, prefix].astype("<f2").tobytes())
    if explanation.pool_attention is not None:
        pool, _ = quantize_rows(explanation.pool_attention[i], 0, bits)  # (heads, latent, patches)
        entry["pool"] = _codes_png(pool.reshape(-1, pool.shape[-1]), bits)
    return entry


def _half_map(values: torch.Tensor) -> dict[str, Any]:
    """A map as float16 (base64) of ``values / max |values|`` and that maximum: 2 bytes a patch, 3 digits."""
    values = values.nan_to_num(0.0, 0.0, 0.0)  # one NaN patch must not blank the whole map
    top = float(values.abs().max())
    scaled = values.flatten().numpy() / (top if top > 0 else 1.0)
    return {"max": top, "f16": _b64(scaled.astype("<f2").tobytes())}


def explorer_payload(
    model: nn.Module,
    images: torch.Tensor,
    *,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    labels: torch.Tensor | Sequence[int] | None = None,
    class_names: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
    maps: Mapping[str, torch.Tensor] | None = None,
    attribution: bool = True,
    faithfulness: Mapping[str, Any] | None = None,
    title: str = "attention explorer",
    note: str | None = None,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    batch_size: int = 8,
    subset_note: Callable[[int], str] | None = None,
    bits: int | str = "auto",
) -> dict[str, Any]:
    """The explorer's data as a JSON-ready dict (see :func:`write_explorer` for the arguments).

    Raises:
        ExplorerTooLarge: As soon as the encoded images pass ``max_bytes`` (with ``subset_note``: if not even the
            first image fits).
        ValueError: If a map is not ``(B, rows, cols)`` on the model's patch grid, the images are not a batch of at
            least one, or ``bits`` is not ``"auto"`` or 2 to 8.
    """
    check_bits(bits, auto=True)
    auto = bits == "auto" and max_bytes is not None  # without a limit, "auto" is the finest
    grid = tuple(model.patch_embed.grid_size)
    if images.ndim != 4 or not len(images):
        raise ValueError(f"images must be a (B, C, H, W) batch of at least one image, got shape {tuple(images.shape)}")
    B = len(images)
    # Non-finite values would make the page's JSON invalid; a signed map is drawn on the diverging colour map.
    maps = {
        name: torch.as_tensor(m).detach().float().cpu().nan_to_num(0.0, 0.0, 0.0) for name, m in (maps or {}).items()
    }
    for name, grid_map in maps.items():
        if tuple(grid_map.shape) != (B, *grid):
            raise ValueError(
                f"map {name!r} has shape {tuple(grid_map.shape)}; expected (images, rows, cols) = {(B, *grid)}"
            )
    labels = None if labels is None else torch.as_tensor(labels).reshape(-1)
    computed_names = ["rollout"] + (["attribution"] if attribution and "attribution" not in maps else [])
    payload: dict[str, Any] = {
        "title": title,
        "note": note,
        "grid": list(grid),
        "patch": list(model.patch_embed.patch_size),
        "size": [int(images.shape[-2]), int(images.shape[-1])],
        "cls": getattr(model, "cls_token", None) is not None,
        "prefix": int(model.num_prefix_tokens),
        "bits": AUTO_BITS[0] if bits == "auto" else bits,
        "heads": None,  # null until the model has run: as long as its count, or longer
        "latent": None,
        "blocks": _block_info(model),
        "lut": _lut(SEQUENTIAL, LUT_SIZE),
        "lut_signed": _lut(DIVERGING, DIVERGING_LUT_SIZE),
        "signed": sorted(name for name, grid_map in maps.items() if is_signed(name, grid_map)),
        "class_names": None if class_names is None else [str(c) for c in class_names],
        "faithfulness": _faithfulness(faithfulness),
        "map_names": sorted([*maps, *(n for n in computed_names if n not in maps)], key=_map_order),
        "images": [],
    }
    # The page without images, measured with the longest notes it can get (a subset's count has the most digits).
    payload["note"] = _join(subset_note(B) if subset_note is not None else note, auto and _coarser(3, max_bytes))
    base = len(render_explorer(payload).encode("utf-8"))
    chosen = None if auto else payload["bits"]
    while True:  # once more, one bit coarser, if "auto" sized the images by a first one smaller than the others
        payload["images"], computed, total, coarser = [], {}, base, False
        for start in range(0, B, batch_size):
            chunk = slice(start, start + batch_size)
            part, local = _explain_chunk(model, images[chunk], None if labels is None else labels[chunk], payload,
                                         computed, maps, mean=mean, std=std, class_names=class_names,
                                         attribution=attribution)  # fmt: skip
            for i in range(len(part.probs)):
                index = start + i
                name = names[index] if names is not None else f"image {index}"
                if chosen is None:
                    chosen = _fitting_bits(part, local, payload["prefix"], name, B, max_bytes - base)
                entry = {**_encode_image(part, i, local, start, payload["prefix"], chosen), "name": name}
                payload["images"].append(entry)
                total += _page_bytes(entry)
            if auto and total > max_bytes and chosen > AUTO_BITS[-1]:
                chosen, coarser = AUTO_BITS[AUTO_BITS.index(chosen) + 1], True
                break
            if max_bytes is not None and total > max_bytes and subset_note is not None:
                kept = payload["images"]  # the first images that fit; no later chunk is explained
                while kept and total > max_bytes:
                    total -= _page_bytes(kept.pop())
                if not kept:
                    raise ExplorerTooLarge(
                        f"one image is too large for an explorer of {_size(max_bytes)} (pass a larger max_bytes)", 0
                    )
                break
            if max_bytes is not None and total > max_bytes:
                done = len(payload["images"])
                fit = max(0, int((max_bytes - base) // ((total - base) / done)))
                raise ExplorerTooLarge(
                    f"{B} images are too many for one explorer: {done} already take {_size(total)}, over the "
                    f"{_size(max_bytes)} limit; about {fit} fit (pass fewer images or a larger max_bytes)",
                    fit,
                )
        if not coarser:
            break
    payload["bits"] = chosen
    kept = len(payload["images"])
    payload["note"] = _join(subset_note(kept) if subset_note is not None and kept < B else note,
                            bits == "auto" and chosen < AUTO_BITS[0] and _coarser(chosen, max_bytes))  # fmt: skip
    return payload


def _map_order(name: str) -> int:
    """Sort key of the maps: the default method's first (the page opens on it), then rollout and attribution."""
    first = (DEFAULT_METHOD, "rollout", "attribution")
    return first.index(name) if name in first else len(first)


def _fitting_bits(
    part: Explanation, maps: Mapping[str, torch.Tensor], prefix: int, name: str, count: int, room: int
) -> int:
    """The finest of :data:`AUTO_BITS` at which ``count`` images, each the size of the batch's first, take at most
    ``room`` bytes of the page; the coarsest if none does."""
    for bits in AUTO_BITS:
        if count * _page_bytes({**_encode_image(part, 0, maps, 0, prefix, bits), "name": name}) <= room:
            return bits
    return AUTO_BITS[-1]


def _page_bytes(entry: Mapping[str, Any]) -> int:
    """The bytes one image's entry adds to the page: its light part in the data, its picture and codes elements (and
    a separator for each)."""
    light = {k: v for k, v in entry.items() if k not in (*CODES, "image")}
    heavy = _element("picture", entry["index"], entry["image"])
    heavy += _element("codes", entry["index"], {k: entry[k] for k in CODES if k in entry})
    opening = len(_opening_picture(entry["image"])) if entry["index"] == 0 else 0
    return len(page_json(light)) + len(heavy) + opening + 2  # ASCII: page_json escapes everything else


def _coarser(bits: int, max_bytes: int) -> str:
    """The page's note when "auto" stored fewer bits than the finest."""
    return (f"The attention is stored at {bits} bits per value instead of {AUTO_BITS[0]} to keep the explorer under "
            f"{_size(max_bytes)}: the small maps are coarser.")  # fmt: skip


def _size(count: int) -> str:
    """Bytes for a message: ``"45 kB"``, ``"4.0 MB"``."""
    return f"{count / 1e6:.1f} MB" if count >= 1e6 else f"{count / 1e3:.0f} kB"


def _join(*notes: str | bool | None) -> str | None:
    """The notes that are given, in one line (``None`` if none is)."""
    return " ".join(n for n in notes if n) or None


def _explain_chunk(
    model: nn.Module,
    chunk: torch.Tensor,
    labels: torch.Tensor | None,
    payload: dict[str, Any],
    computed: dict[str, list[torch.Tensor]],
    maps: Mapping[str, torch.Tensor],
    *,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    class_names: Sequence[str] | None,
    attribution: bool,
) -> tuple[Explanation, dict[str, torch.Tensor]]:
    """Explain one batch of images: its explanation, and every image-level map of the images so far.

    The rollout (and the attribution, when asked and not in ``maps``) of the batch is appended to ``computed``, and
    ``payload``'s head and latent-query counts are set from what the model returned.
    """
    part = explain_images(model, chunk, labels=labels, class_names=class_names, mean=mean, std=std, statistics=False)
    batch_maps = {"rollout": part.rollout}
    if attribution and "attribution" not in maps:
        batch_maps["attribution"] = _attribute(model, chunk, mean, std)
    for name, value in batch_maps.items():
        computed.setdefault(name, []).append(value)
    local = {**{k: torch.cat(v) for k, v in computed.items()}, **maps}
    payload["heads"] = int(part.attentions[0].shape[1])
    payload["latent"] = 0 if part.pool_attention is None else int(part.pool_attention.shape[2])
    return part, local


def _attribute(model: nn.Module, chunk: torch.Tensor, mean: Sequence[float] | None, std: Sequence[float] | None):
    """Attention attribution of each image's predicted class (gradients, also inside a no-grad caller)."""
    param = next(model.parameters())
    inputs = chunk.to(param.device)
    inputs = (inputs if inputs.is_floating_point() else normalize(inputs, mean, std)).to(param.dtype)
    with torch.inference_mode(False), torch.enable_grad():
        return attention_attribution(model, inputs).float().cpu()


def _faithfulness(scores: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The areas of :func:`~vit.explain.faithfulness` (curves left out), or ``None``."""
    if not scores:
        return None
    keep = ("deletion_auc", "insertion_auc", "num_images", "steps", "baseline")
    return {key: scores[key] for key in keep if key in scores}


def render_explorer(payload: Mapping[str, Any], extra_html: str = "") -> str:
    """The page: the payload as JSON in script tags, the explorer's CSS and JS inlined, ``extra_html`` below.

    Each image's picture and attention codes are JSON script elements of their own, the first image's before the
    page's script and the others after it (and after ``extra_html``): the browser runs the script, and draws the
    first image, while it still parses the rest of a large file.

    Args:
        payload: What :func:`explorer_payload` returns.
        extra_html: HTML appended after the explorer (the static report's sections), or ``""``.
    """
    light = {
        **payload,
        "images": [{k: v for k, v in im.items() if k not in (*CODES, "image")} for im in payload["images"]],
    }

    heavy = [
        _element("picture", i, im["image"]) + _element("codes", i, {k: im[k] for k in CODES if k in im})
        for i, im in enumerate(payload["images"])
    ]
    parts = {
        "title": html.escape(str(payload.get("title", "attention explorer"))),
        "css": (ASSETS / "explorer.css").read_text(encoding="utf-8"),
        "extra": extra_html,
        "data": page_json(light),
        "first": "\n".join(heavy[:1]),
        "opening": _opening_picture(payload["images"][0]["image"]) if payload["images"] else "",
        "js": (ASSETS / "explorer.js").read_text(encoding="utf-8"),
        "rest": "\n".join(heavy[1:]),
    }
    template = (ASSETS / "explorer.html").read_text(encoding="utf-8")
    # One pass: a "{{data}}" inside a user's string (a name, the extra HTML) is left as it is, never filled.
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m[1]], template)


def _opening_picture(picture: str) -> str:
    """The first image's picture (base64) as an ``<img>`` at the top of the page: the browser loads it while it
    parses the rest, so the first frame does not wait for it (its script element stays, for the thumbnails)."""
    kind = "jpeg" if picture.startswith("/9j/") else "png"
    return f'<img id="explorer-opening" hidden alt="" src="data:image/{kind};base64,{picture}">'


def _element(kind: str, i: int, value: Any) -> str:
    """A JSON script element of the page: image ``i``'s picture or codes."""
    return f'<script type="application/json" id="explorer-{kind}-{i}">{page_json(value)}</script>'


def page_json(payload: Any) -> str:
    """``payload`` as JSON safe inside a ``<script>`` element: valid for ``JSON.parse`` and inert as HTML.

    Non-finite numbers (a NaN area, the probabilities of a diverged model) become ``null``, which the page shows as
    "–" (``NaN`` is not JSON); ``<``, ``>`` and ``&`` are written as ``\\u003c``, ``\\u003e``, ``\\u0026``, so no
    string (a file or class name holding ``</script><img ...>``) can end the element or open a tag.
    """
    data = json.dumps(_finite(payload), separators=(",", ":"), allow_nan=False)
    return data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` (mappings, lists and tuples walked)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: _finite(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_explorer(
    path: str | Path,
    model: nn.Module,
    images: torch.Tensor,
    *,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    labels: torch.Tensor | Sequence[int] | None = None,
    class_names: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
    maps: Mapping[str, torch.Tensor] | None = None,
    attribution: bool = True,
    faithfulness: Mapping[str, Any] | None = None,
    title: str = "attention explorer",
    note: str | None = None,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    batch_size: int = 8,
    subset_note: Callable[[int], str] | None = None,
    bits: int | str = "auto",
) -> Path:
    """Write the explorer of ``images`` to ``path`` (one HTML file, no network), atomically.

    The model runs in eval mode without gradients (attribution needs one backward pass) and is left as it was.

    Args:
        path: The ``.html`` file to write.
        model: A :class:`~vit.VisionTransformer` (blocks with ``attn.attention_weights``).
        images: ``(B, C, H, W)`` uint8 pixels (normalised here with ``mean`` / ``std``) or normalised floats.
        mean: Per-channel mean of the normalisation in ``[0, 1]`` (``None`` for floats of unknown normalisation).
        std: Per-channel standard deviation, or ``None``.
        labels: ``(B,)`` true classes (``-1`` = unknown), or ``None``.
        class_names: Name of every class, or ``None``.
        names: A name per image (e.g. its file), or ``None`` for ``"image i"``.
        maps: Image-level maps ``name -> (B, rows, cols)`` on the patch grid, overlaid with a toggle; the rollout is
            always added, and the attribution when ``attribution`` is true and ``maps`` has none.
        attribution: Compute the attention attribution of each prediction (one backward pass per batch).
        faithfulness: Deletion / insertion areas as :func:`~vit.explain.faithfulness` returns them, or ``None``.
        title: The page title.
        note: A line shown under the title (e.g. that the images are a subset), or ``None``.
        max_bytes: Refuse (:class:`ExplorerTooLarge`, before anything is written) an explorer larger than this;
            ``None``: no limit.
        batch_size: Images per forward pass.
        subset_note: Instead of refusing images past ``max_bytes``, keep the first ones that fit (the later ones
            are not explained at all) and show ``subset_note(kept)`` as the note (the images of
            :func:`explorer_payload`'s result are those kept). ``None``: refuse.
        bits: Bits per attention code, 2 to 8 (see :func:`quantize_rows`): fewer make a smaller file and coarser
            maps. ``"auto"``: the finest of :data:`AUTO_BITS` (6 to 3) at which the images fit ``max_bytes``
            (guessed from the first image, then one bit coarser at a time while they do not), said in the page's
            note when below 6 (6 without a limit).

    Returns:
        ``path``.

    Raises:
        ExplorerTooLarge: If the images would pass ``max_bytes`` (with ``subset_note``: if the first does); the
            message says how many fit.
        ValueError: If a map is not on the model's patch grid, ``images`` holds no image, or ``bits`` is not
            ``"auto"`` or 2 to 8.
    """
    payload = explorer_payload(
        model, images, mean=mean, std=std, labels=labels, class_names=class_names, names=names, maps=maps,
        attribution=attribution, faithfulness=faithfulness, title=title, note=note, max_bytes=max_bytes,
        batch_size=batch_size, subset_note=subset_note, bits=bits,
    )  # fmt: skip
    return write_bytes(path, render_explorer(payload).encode("utf-8"))
