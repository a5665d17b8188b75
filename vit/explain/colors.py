"""How a map is coloured: one decision, :func:`color_scale`, that every renderer (panels, report, training-time
grids, the explorer) follows.

A map is *signed* when its method says so (:attr:`~vit.explain.methods.Method.signed`: AttnLRP, CP-LRP, integrated
gradients and gradient x input return evidence for the class as positive and evidence against it as negative) and
*unsigned* otherwise (rollout, attention weights, Chefer's attribution, Grad-CAM are non-negative by construction).

- Signed: the diverging map ``bwr`` (blue, white, red) on limits symmetric about zero, ``±max |value|``, so zero is
  white in every panel, red is evidence for the class and blue evidence against it. ``bwr`` is the colouring of LRP
  heatmaps since Bach et al. (PLOS ONE 2015) and the default of zennit's ``imgify``; unlike ``seismic`` its ends
  are not darkened, so a strong patch stays saturated over a dark image. Overlays make a signed map transparent
  in proportion to ``1 - |value| / max``: the image shows through where the relevance is near zero.
- Unsigned: the sequential map ``inferno`` from 0 (the map's minimum if it dips below 0) to its maximum, so black is
  "none" as in the explorer's attention rows.

Limits are per panel (each image's map on its own colour bar): the relevance of different images has different
totals (LRP conserves the logit), so one limit shared by a grid would blank the images with smaller logits; the
numbers on each bar make the panels comparable. Pass ``limit`` to share one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .methods import ALIASES, METHODS

SEQUENTIAL = "inferno"
"""Colour map of unsigned maps."""
DIVERGING = "bwr"
"""Colour map of signed maps (white at zero)."""
LUT_SIZE = 256
"""Entries of a sequential lookup table (matplotlib's default)."""
DIVERGING_LUT_SIZE = 255
"""Entries of a diverging lookup table: odd, so that its middle entry is the colour map's centre (white) exactly."""


# matplotlib's "jet" as (x, value) breakpoints per channel (matplotlib/_cm.py, _jet_data).
_JET = (
    ((0.0, 0.0), (0.35, 0.0), (0.66, 1.0), (0.89, 1.0), (1.0, 0.5)),
    ((0.0, 0.0), (0.125, 0.0), (0.375, 1.0), (0.64, 1.0), (0.91, 0.0), (1.0, 0.0)),
    ((0.0, 0.5), (0.11, 1.0), (0.34, 1.0), (0.65, 0.0), (1.0, 0.0)),
)


def lookup_table(cmap: str, size: int = LUT_SIZE) -> np.ndarray:
    """``size`` colours of a colour map, evenly spaced from its start to its end, as ``float64 (size, 3)`` in
    ``[0, 1]``: ``"jet"`` is built in (matplotlib's segment data), any other name is matplotlib's.

    Raises:
        ValueError: If ``cmap`` is unknown or needs matplotlib and it is missing.
    """
    x = np.linspace(0.0, 1.0, size)
    if cmap == "jet":
        return np.stack([np.interp(x, *zip(*channel, strict=True)) for channel in _JET], axis=1)
    try:
        import matplotlib
    except ImportError as err:
        raise ValueError(f"colormap {cmap!r} needs matplotlib (pip install matplotlib), or use cmap='jet'") from err
    if cmap not in matplotlib.colormaps:
        raise ValueError(f"unknown colormap {cmap!r}; e.g. 'jet', 'viridis', 'inferno', 'magma', 'gray', 'bwr'")
    return matplotlib.colormaps[cmap].resampled(size)(x)[:, :3]


def apply_colormap(values: np.ndarray | torch.Tensor, cmap: str = SEQUENTIAL, size: int = LUT_SIZE) -> np.ndarray:
    """Map values in ``[0, 1]`` (clipped) to ``uint8`` RGB, appending a channel axis of size 3.

    Args:
        values: Array of any shape with values in ``[0, 1]``.
        cmap: ``"jet"`` (built in) or any matplotlib colormap name (needs matplotlib).
        size: Entries of the lookup table; a value ``x`` takes entry ``min(floor(x · size), size - 1)``
            (matplotlib's binning). With an odd size, 0.5 takes the middle entry: a diverging map's centre.

    Raises:
        ValueError: If ``cmap`` is unknown or needs matplotlib and it is missing.
    """
    values = np.clip(_as_array(values), 0.0, 1.0)
    index = np.minimum((values * size).astype(np.int64), size - 1)
    return np.rint(lookup_table(cmap, size)[index] * 255.0).astype(np.uint8)


def _as_array(values: np.ndarray | torch.Tensor) -> np.ndarray:
    values = values.detach().double().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    return np.nan_to_num(values.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)


@dataclass(frozen=True)
class ColorScale:
    """The colour map and limits of one map.

    Attributes:
        signed: Whether the map is signed (diverging, symmetric limits, zero in the middle).
        low: The value drawn at the bottom of the colour bar (``-high`` when signed).
        high: The value drawn at its top.
        cmap: The matplotlib colour map.
    """

    signed: bool
    low: float
    high: float
    cmap: str

    @property
    def lut_size(self) -> int:
        """Entries of the lookup table (odd when signed: zero falls on the middle entry exactly)."""
        return DIVERGING_LUT_SIZE if self.signed else LUT_SIZE

    def normalize(self, values: np.ndarray | torch.Tensor) -> np.ndarray:
        """``values`` mapped to ``[0, 1]`` between the limits (clipped; 0.5 is zero when signed)."""
        values = _as_array(values)
        span = self.high - self.low
        return np.clip((values - self.low) / span, 0.0, 1.0) if span > 0 else np.full_like(values, 0.5 * self.signed)

    def colors(self, values: np.ndarray | torch.Tensor) -> np.ndarray:
        """``uint8`` RGB of ``values``, a channel axis of 3 appended (matplotlib's binning: ``floor(x · size)``)."""
        return apply_colormap(self.normalize(values), self.cmap, self.lut_size)

    def opacity(self, values: np.ndarray | torch.Tensor, alpha: float) -> np.ndarray:
        """Heatmap weight per value over an image: ``alpha · |value| / high`` when signed (the image shows where the
        relevance is near zero), ``alpha`` everywhere otherwise."""
        values = _as_array(values)
        if not self.signed:
            return np.full_like(values, alpha)
        return alpha * np.clip(np.abs(values) / self.high, 0.0, 1.0) if self.high > 0 else np.zeros_like(values)

    def ticks(self) -> tuple[float, ...]:
        """The values a colour bar is labelled with, bottom to top: ``(-m, 0, m)`` when signed, ``(low, high)``."""
        return (self.low, 0.0, self.high) if self.signed else (self.low, self.high)

    def labels(self) -> tuple[str, ...]:
        """:meth:`ticks` as text (two significant digits; zero as ``0``)."""
        return tuple(format_value(v) for v in self.ticks())


def format_value(value: float) -> str:
    """A colour-bar number: two significant digits, ``0`` for zero."""
    return "0" if value == 0 else f"{value:.2g}"


def color_scale(
    values: np.ndarray | torch.Tensor, signed: bool, *, limit: float | None = None, cmap: str | None = None
) -> ColorScale:
    """The colour map and limits of a map (see the module docstring for the rule).

    Args:
        values: The map's raw values, any shape.
        signed: Whether the map is signed: :func:`is_signed` of its method.
        limit: A shared limit instead of the map's own: ``±limit`` when signed, ``[0, limit]`` otherwise.
        cmap: The sequential colour map of an unsigned map instead of ``inferno`` (signed maps are always ``bwr``).

    Returns:
        A :class:`ColorScale`; a map of zeros gets the limits ``±1`` (signed) or ``[0, 1]``, drawn at zero's colour.
    """
    array = _as_array(values)
    if signed:
        top = float(np.abs(array).max(initial=0.0)) if limit is None else float(limit)
        top = top if top > 0 else 1.0
        return ColorScale(True, -top, top, DIVERGING)
    high = float(array.max(initial=0.0)) if limit is None else float(limit)
    low = min(0.0, float(array.min(initial=0.0)))
    return ColorScale(False, low, high if high > low else low + 1.0, cmap or SEQUENTIAL)


def is_signed(name: str, values: np.ndarray | torch.Tensor | None = None) -> bool:
    """Whether the map of method ``name`` is signed: the method's declared :attr:`~vit.explain.methods.Method.signed`.

    A name outside :data:`~vit.explain.METHODS` (a map of the caller's own) is signed when ``values`` has a negative
    value; without ``values``, unsigned.
    """
    method = METHODS.get(ALIASES.get(name, name))
    if method is not None:
        return method.signed
    return values is not None and bool((_as_array(values) < 0).any())
