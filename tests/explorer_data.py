"""What an explorer page holds, read back in Python: its JSON elements, each image's stored codes, the rows the page
must decode from them (an independent numpy decoding) and a bound on their distance from the true attention."""

from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import torch
from PIL import Image

from vit.explain.render.explorer import explorer_payload, render_explorer

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
"""The normalisation of the explorer tests' pages."""


def data_blocks(page: str) -> list[str]:
    """The text of every JSON script element of a page: the explorer's data, then each image's picture and codes."""
    pattern = r'<script type="application/json" id="explorer-(?:data|picture-\d+|codes-\d+)">(.*?)</script>'
    return re.findall(pattern, page, re.S)


def page_data(page: str) -> dict:
    """The explorer's embedded JSON with each image's own element merged into its entry, parsed strictly (``NaN`` /
    ``Infinity`` are not JSON and fail here)."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    data, *images = (json.loads(block, parse_constant=refuse) for block in data_blocks(page))
    assert len(images) == 2 * len(data["images"])
    for entry, picture, codes in zip(data["images"], images[::2], images[1::2], strict=True):
        entry.update(image=picture, **codes)
    return data


def decode_rows(codes: np.ndarray, share: np.ndarray | None, prefix: int, bits: int) -> np.ndarray:
    """The rows the page should show, from the stored codes: each group's squared codes scaled to its share."""
    x = (codes.astype(np.float64) / (2**bits - 1)) ** 2
    small = np.zeros(x.shape[:-1]) if share is None else share.astype(np.float64)  # the smaller share; < 0: patches
    patches = np.signbit(small)
    share = np.stack([np.where(patches, 1 + small, small), np.where(patches, -small, 1 - small)], -1)
    out = np.empty_like(x)
    for keys, mass in ((slice(0, prefix), share[..., :1]), (slice(prefix, None), share[..., 1:])):
        total = x[..., keys].sum(-1, keepdims=True)
        out[..., keys] = x[..., keys] * np.where(total > 0, mass / np.where(total > 0, total, 1), 0)
    return out


def decode_bound(truth: np.ndarray, prefix: int, bits: int) -> np.ndarray:
    """A bound on |decoded - truth| for every entry of rows ``truth`` (``(..., K)``, each row summing to 1).

    In a key group with maximum ``m``, ``x = a / m`` is coded as ``round(L sqrt(x))``, so the decoded ``x'`` is within
    ``e = sqrt(x) / L + 1 / (4 L^2)``. The group is rescaled to its share ``S`` of the row: the smaller of the two
    shares is kept as float16 and the larger is 1 minus it, so both are off by ``dS <= 2^-11 min(S, 1 - S) + 2^-25``
    (float16's rounding, subnormals included; ``S`` itself is a sum of doubles, ``2^-40`` more covers it). With
    ``X``, ``E`` the group's sums of ``x`` and ``e``: ``|a' - a| <= (S (e + x E / X) + dS (x + e)) / (X - E)``
    (no bound unless ``X > E``: too few bits for too many keys).
    """
    levels = 2**bits - 1
    truth = truth.astype(np.float64)
    bound = np.empty_like(truth)
    for keys in (slice(0, prefix), slice(prefix, None)):
        a = truth[..., keys]
        if not a.shape[-1]:
            continue
        top = a.max(-1, keepdims=True)
        x = a / np.where(top > 0, top, 1)
        e = np.sqrt(x) / levels + 1 / (4 * levels**2)
        X, E, mass = x.sum(-1, keepdims=True), e.sum(-1, keepdims=True), a.sum(-1, keepdims=True)
        assert np.all((X > E) | (top == 0)), "no error bound: too few bits for this many keys"
        slack = 2**-11 * np.minimum(mass, 1 - mass) + 2**-25 + 2**-40 if prefix else 0.0  # float16's rounding
        with np.errstate(divide="ignore", invalid="ignore"):  # a group of zeros decodes as exact zeros
            bound[..., keys] = np.where(top > 0, (mass * (e + x * E / X) + slack * (x + e)) / (X - E), 0.0)
    return bound + 1e-6


def stored(page_data_: dict, image: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The codes ``(blocks, heads, N, N)`` and prefix shares an explorer's JSON holds for one image."""
    entry = page_data_["images"][image]
    codes = np.asarray(Image.open(io.BytesIO(base64.b64decode(entry["attn"]))))
    blocks, heads, n = len(page_data_["blocks"]), page_data_["heads"], codes.shape[1]
    share = None
    if "share" in entry:
        share = np.frombuffer(base64.b64decode(entry["share"]), "<f2").reshape(blocks, heads, n)
    return codes.reshape(blocks, heads, n, n), share


def one_image_page(model, pixels: torch.Tensor, maps: dict | None = None, **options) -> int:
    """Bytes of the explorer page of the first image alone: a size limit just above it holds one image, not two."""
    first = {name: m[:1] for name, m in (maps or {}).items()}
    payload = explorer_payload(model, pixels[:1], mean=MEAN, std=STD, max_bytes=None, maps=first, **options)
    return len(render_explorer(payload).encode())
