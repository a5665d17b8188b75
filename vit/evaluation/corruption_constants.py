"""The constants of the 15 common corruptions at severities 1-5: CIFAR-10-C's for 32 px images and ImageNet-C's for
every other size (Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to Common Corruptions and
Perturbations", ICLR 2019).

Both tables are read off the authors' generators, ``make_cifar_c.py`` and ``make_imagenet_c.py`` in their
robustness repository; each row gives the five severities of one corruption, in the tuple layout its function in
:mod:`vit.evaluation.corruption_ops` takes.
"""

from __future__ import annotations

import numpy as np

Params = tuple[tuple, tuple, tuple, tuple, tuple]


def _zoom_factors(stop: float, step: float) -> tuple[float, ...]:
    """``np.arange(1, stop, step)``, as the generators write zoom blur's factors (the same floating-point values)."""
    return tuple(float(z) for z in np.arange(1, stop, step))


CIFAR10_C: dict[str, Params] = {
    "gaussian_noise": ((0.04,), (0.06,), (0.08,), (0.09,), (0.10,)),  # standard deviation in [0, 1] units
    "shot_noise": ((500,), (250,), (100,), (75,), (50,)),  # photons per unit intensity
    "impulse_noise": ((0.01,), (0.02,), (0.03,), (0.05,), (0.07,)),  # fraction of values set to 0 or 1
    "defocus_blur": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)),  # disk radius, anti-alias sigma
    "glass_blur": ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)),  # sigma, max shift, rounds
    "motion_blur": ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)),  # ImageMagick radius, sigma
    "zoom_blur": tuple(
        (_zoom_factors(stop, 0.01),) for stop in (1.06, 1.11, 1.16, 1.21, 1.26)
    ),  # the zoom factors averaged
    # snow: flake mean, flake std, flake zoom, threshold, blur radius, blur sigma, weight of the image
    "snow": (
        (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
        (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
        (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
        (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
        (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
    ),
    "frost": ((1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)),  # weight of the image, of the frost
    "fog": ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)),  # strength, plasma fractal's wibble decay
    "brightness": ((0.05,), (0.1,), (0.15,), (0.2,), (0.3,)),  # added to HSV value
    "contrast": ((0.75,), (0.5,), (0.4,), (0.3,), (0.15,)),  # factor around each channel's mean
    # elastic: displacement scale (alpha), its Gaussian sigma, affine jitter; all in pixels (32 x the authors' ratios)
    "elastic_transform": (
        (32 * 0, 32 * 0, 32 * 0.08),
        (32 * 0.05, 32 * 0.2, 32 * 0.07),
        (32 * 0.08, 32 * 0.06, 32 * 0.06),
        (32 * 0.1, 32 * 0.04, 32 * 0.05),
        (32 * 0.1, 32 * 0.03, 32 * 0.03),
    ),
    "pixelate": ((0.95,), (0.9,), (0.85,), (0.75,), (0.65,)),  # side of the box-downsampled copy
    "jpeg_compression": ((80,), (65,), (58,), (50,), (40,)),  # PIL quality
}
"""CIFAR-10-C's constants (``make_cifar_c.py``), used for 32x32 images."""

IMAGENET_C: dict[str, Params] = {
    "gaussian_noise": ((0.08,), (0.12,), (0.18,), (0.26,), (0.38,)),
    "shot_noise": ((60,), (25,), (12,), (5,), (3,)),
    "impulse_noise": ((0.03,), (0.06,), (0.09,), (0.17,), (0.27,)),
    "defocus_blur": ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)),
    "glass_blur": ((0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)),
    "motion_blur": ((10, 3), (15, 5), (15, 8), (15, 12), (20, 15)),
    "zoom_blur": (
        (_zoom_factors(1.11, 0.01),),
        (_zoom_factors(1.16, 0.01),),
        (_zoom_factors(1.21, 0.02),),
        (_zoom_factors(1.26, 0.02),),
        (_zoom_factors(1.31, 0.03),),
    ),
    "snow": (
        (0.1, 0.3, 3, 0.5, 10, 4, 0.8),
        (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
        (0.55, 0.3, 4, 0.9, 12, 8, 0.7),
        (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
        (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55),
    ),
    "frost": ((1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75)),
    "fog": ((1.5, 2), (2, 2), (2.5, 1.7), (2.5, 1.5), (3, 1.4)),
    "brightness": ((0.1,), (0.2,), (0.3,), (0.4,), (0.5,)),
    "contrast": ((0.4,), (0.3,), (0.2,), (0.1,), (0.05,)),
    # the generator's 244 (for 224) is kept: its comment says the results stand as they are
    "elastic_transform": (
        (244 * 2, 244 * 0.7, 244 * 0.1),
        (244 * 2, 244 * 0.08, 244 * 0.2),
        (244 * 0.05, 244 * 0.01, 244 * 0.02),
        (244 * 0.07, 244 * 0.01, 244 * 0.02),
        (244 * 0.12, 244 * 0.01, 244 * 0.02),
    ),
    "pixelate": ((0.6,), (0.5,), (0.4,), (0.3,), (0.25,)),
    "jpeg_compression": ((25,), (18,), (15,), (10,), (7,)),
}
"""ImageNet-C's constants (``make_imagenet_c.py``), defined for 224x224 images and used for every size but 32x32."""

FROST_PALETTES: tuple[tuple[tuple[float, float, float], tuple[float, float, float]], ...] = (
    ((77.6, 149.1, 165.7), (26.9, 16.5, 15.3)),
    ((200.8, 205.4, 214.5), (21.4, 22.1, 22.6)),
    ((200.8, 205.4, 214.5), (21.4, 22.1, 22.6)),
    ((137.6, 152.8, 165.2), (28.5, 28.5, 29.9)),
    ((112.4, 123.4, 134.8), (44.4, 43.3, 41.7)),
)
"""Per-channel RGB mean and standard deviation (0-255) of the five frost photographs the generators draw from
(``randint(5)`` over ``frost1.png``-``frost5.jpg``; two of them are the same picture), measured on the copies the
``imagecorruptions`` package ships; at CIFAR's 0.2 scale they differ by less than 0.5. The procedural frost
texture takes one of them per image, so its additive term has the photographs' colour and spread."""
