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

Three parts: the encoding of attention, maps and pictures (:mod:`vit.explain.render.explorer_codes`, 6 bits per
attention value at most unless asked); the size budget (:func:`explorer_payload` explains the images batch by batch
through :func:`~vit.explain.explain` and encodes them until the file would pass ``max_bytes``, choosing the bits); and
the page (:func:`render_explorer` fills ``assets/explorer.html`` with the data, the script and the style).
:func:`write_explorer` writes a payload atomically; the file needs no network.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ...atomic import write_bytes
from ..colors import DIVERGING, DIVERGING_LUT_SIZE, LUT_SIZE, SEQUENTIAL, is_signed
from ..methods import DEFAULT_METHOD
from ..pipeline import explain
from .explorer_codes import AUTO_BITS, CODES, block_info, check_bits, encode_image, lut

if TYPE_CHECKING:
    from ..explanation import Explanation

ASSETS = Path(__file__).with_name("assets")
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
    importance: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The explorer's data as a JSON-ready dict, for :func:`write_explorer` or :func:`render_explorer`.

    The model runs in eval mode without gradients (attribution needs one backward pass) and is left as it was; the
    images are explained batch by batch (:func:`~vit.explain.explain`), and encoded until the file would pass
    ``max_bytes``.

    Args:
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
        importance: ``(blocks, heads)`` drop of the target logit when each head is mean-ablated
            (:func:`~vit.explain.heads.head_importance`): a bar under each map and the heads ranked, each a button
            that shows it; ``None``: not shown.



    Raises:
        ExplorerTooLarge: As soon as the encoded images pass ``max_bytes`` (with ``subset_note``: if not even the
            first image fits).
        ValueError: If a map is not ``(B, rows, cols)`` on the model's patch grid, the images are not a batch of at
            least one, or ``bits`` is not ``"auto"`` or 2 to 8.
    """
    check_bits(bits, auto=True)
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
    computed = ["rollout"] + (["attribution"] if attribution and "attribution" not in maps else [])
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
        "blocks": block_info(model),
        "lut": lut(SEQUENTIAL, LUT_SIZE),
        "lut_signed": lut(DIVERGING, DIVERGING_LUT_SIZE),
        "signed": sorted(name for name, grid_map in maps.items() if is_signed(name, grid_map)),
        "class_names": None if class_names is None else [str(c) for c in class_names],
        "faithfulness": _faithfulness(faithfulness),
        "map_names": sorted([*maps, *(n for n in computed if n not in maps)], key=_map_order),
        "importance": None if importance is None else [[round(float(v), 5) for v in row] for row in importance],
        "images": [],
    }
    labels = None if labels is None else torch.as_tensor(labels).reshape(-1)

    def explain_batch(start: int) -> Explanation:  # every block's attention, the computed maps, the given ones
        part = explain(model, images[start : start + batch_size], [n for n in computed if n not in maps], mean=mean,
                       std=std, labels=None if labels is None else labels[start : start + batch_size],
                       class_names=class_names, statistics=False, block=None, keep_attentions=True,
                       batch_size=batch_size)  # fmt: skip
        part.maps.update({name: grid_map[start : start + len(part)] for name, grid_map in maps.items()})
        payload["heads"] = int(part.attentions[0].shape[1])
        payload["latent"] = 0 if part.pool_attention is None else int(part.pool_attention.shape[2])
        return part

    auto = bits == "auto" and max_bytes is not None  # without a limit, "auto" is the finest
    # The page without images, measured with the longest notes it can get (a subset's count has the most digits).
    payload["note"] = _join(subset_note(B) if subset_note is not None else note, auto and _coarser(3, max_bytes))
    base = len(render_explorer(payload).encode("utf-8"))
    names = list(names) if names is not None else [f"image {i}" for i in range(B)]
    chosen = None if auto else payload["bits"]
    batches: dict[int, Explanation] = {}  # explained once, encoded again if "auto" has to go one bit coarser
    for _ in AUTO_BITS:
        chosen, coarser = _encode_within(payload, batches, explain_batch, names, B, batch_size, base, max_bytes,
                                         chosen, auto, subset_note)  # fmt: skip
        if not coarser:
            break
    payload["bits"] = chosen
    kept = len(payload["images"])
    payload["note"] = _join(subset_note(kept) if subset_note is not None and kept < B else note,
                            bits == "auto" and chosen < AUTO_BITS[0] and _coarser(chosen, max_bytes))  # fmt: skip
    return payload


def _encode_within(
    payload: dict[str, Any],
    batches: dict[int, Explanation],
    explain_batch: Callable[[int], Explanation],
    names: Sequence[str],
    count: int,
    batch_size: int,
    base: int,
    max_bytes: int | None,
    bits: int | None,
    auto: bool,
    subset_note: Callable[[int], str] | None,
) -> tuple[int, bool]:
    """One pass of the size budget: encode the images batch by batch into ``payload["images"]`` until the page
    would pass ``max_bytes``; returns the bits used and whether "auto" must try one bit coarser.

    ``bits`` ``None`` guesses the finest that fits from the first image (:func:`_fitting_bits`). Past the limit:
    with ``auto`` and bits to spare, stop and go coarser; with ``subset_note``, keep the first images that fit (no
    later batch is explained); else refuse.

    Raises:
        ExplorerTooLarge: Past the limit without a way out (with ``subset_note``: not even the first image fits).
    """
    payload["images"], total = [], base
    for start in range(0, count, batch_size):
        if start not in batches:
            batches[start] = explain_batch(start)
        part = batches[start]
        for i in range(len(part)):
            if bits is None:
                bits = _fitting_bits(part, payload["prefix"], names[start + i], count, max_bytes - base)
            entry = {**encode_image(part, i, start + i, payload["prefix"], bits), "name": names[start + i]}
            payload["images"].append(entry)
            total += _page_bytes(entry)
        if max_bytes is None or total <= max_bytes:
            continue
        if auto and bits > AUTO_BITS[-1]:
            return AUTO_BITS[AUTO_BITS.index(bits) + 1], True
        if subset_note is not None:
            kept = payload["images"]  # the first images that fit; no later batch is explained
            while kept and total > max_bytes:
                total -= _page_bytes(kept.pop())
            if not kept:
                raise ExplorerTooLarge(
                    f"one image is too large for an explorer of {_size(max_bytes)} (pass a larger max_bytes)", 0
                )
            return bits, False
        done = len(payload["images"])
        fit = max(0, int((max_bytes - base) // ((total - base) / done)))
        raise ExplorerTooLarge(
            f"{count} images are too many for one explorer: {done} already take {_size(total)}, over the "
            f"{_size(max_bytes)} limit; about {fit} fit (pass fewer images or a larger max_bytes)",
            fit,
        )
    return bits, False


def _map_order(name: str) -> int:
    """Sort key of the maps: the default method's first (the page opens on it), then rollout and attribution."""
    first = (DEFAULT_METHOD, "rollout", "attribution")
    return first.index(name) if name in first else len(first)


def _fitting_bits(part: Explanation, prefix: int, name: str, count: int, room: int) -> int:
    """The finest of :data:`AUTO_BITS` at which ``count`` images, each the size of the batch's first, take at most
    ``room`` bytes of the page; the coarsest if none does."""
    for bits in AUTO_BITS:
        if count * _page_bytes({**encode_image(part, 0, 0, prefix, bits), "name": name}) <= room:
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
        "js": explorer_script(),
        "rest": "\n".join(heavy[1:]),
    }
    template = (ASSETS / "explorer.html").read_text(encoding="utf-8")
    # One pass: a "{{data}}" inside a user's string (a name, the extra HTML) is left as it is, never filled.
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m[1]], template)


def explorer_script() -> str:
    """The explorer's script: ``assets/explorer.js`` (the data and rows) then ``assets/explorer_page.js`` (the page),
    as the body of one function called at once, so that nothing leaks into the page's global names."""
    body = "\n".join((ASSETS / name).read_text(encoding="utf-8") for name in ("explorer.js", "explorer_page.js"))
    return f"(() => {{\n{body}}})();\n"


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


def write_explorer(path: str | Path, payload: Mapping[str, Any]) -> Path:
    """Write the explorer page of ``payload`` (:func:`explorer_payload`) to ``path``, atomically; returns ``path``."""
    return write_bytes(path, render_explorer(payload).encode("utf-8"))
