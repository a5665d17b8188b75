"""The common corruptions (vit.evaluation.corruptions) against references nobody here wrote: the generators' formulas
evaluated independently (loops, scipy, scikit-image, colorsys, PIL), ImageMagick's motion blur where it is installed,
the ``imagecorruptions`` package where it is installed (ImageNet-C's constants), and the noises by their statistics."""

from __future__ import annotations

import colorsys
import io
import shutil
import subprocess
import sys
import types
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from vit.evaluation import corruption_ops as ops
from vit.evaluation.corruption_overlays import frost_apply, frost_texture, snow_apply
from vit.evaluation.corruptions import CORRUPTIONS, corrupt

CIFAR10_MINI = Path(__file__).resolve().parents[2] / "shared/data/cifar10-mini"

# The published constants, copied from the generators (make_cifar_c.py, make_imagenet_c.py) for the tests to check.
CIFAR_JPEG, IMAGENET_JPEG = (80, 65, 58, 50, 40), (25, 18, 15, 10, 7)
CIFAR_PIXELATE = (0.95, 0.9, 0.85, 0.75, 0.65)
CIFAR_CONTRAST, CIFAR_BRIGHTNESS = (0.75, 0.5, 0.4, 0.3, 0.15), (0.05, 0.1, 0.15, 0.2, 0.3)
CIFAR_DEFOCUS = ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1))
CIFAR_GAUSSIAN, CIFAR_SHOT, CIFAR_IMPULSE = (0.04, 0.06, 0.08, 0.09, 0.10), (500, 250, 100, 75, 50), (0.01, 0.07)
CIFAR_ZOOM_STOPS = (1.06, 1.11, 1.16, 1.21, 1.26)
CIFAR_SNOW = (
    (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
    (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
    (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
    (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
    (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
)


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    """Eight 32 x 32 test images: smooth colour gradients with sharp edges and some texture, seeded."""
    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0:32, 0:32] / 31.0
    out = []
    for _ in range(8):
        a, b, c = rng.uniform(0, 1, (3, 3))
        base = a * xx[..., None] + b * yy[..., None] + c * (xx[..., None] > rng.uniform(0.2, 0.8))
        base = base / base.max() * 200 + rng.normal(0, 12, (32, 32, 3))
        out.append(np.clip(base, 0, 255).astype(np.uint8))
    return np.stack(out)


@pytest.fixture(scope="module")
def photos() -> np.ndarray:
    """64 real CIFAR-10 test photographs (cifar10-mini), or a skip where they are absent."""
    files = sorted((CIFAR10_MINI / "test").glob("*/*.jpg"))[::4][:64]
    if not files:
        pytest.skip(f"{CIFAR10_MINI} is absent (it lives in the shared workspace, not in a clone)")
    return np.stack([np.asarray(Image.open(f).convert("RGB")) for f in files])


def floor_uint8(x: np.ndarray) -> np.ndarray:
    return np.floor(np.clip(x, 0, 1) * 255).astype(np.uint8)


def assert_close_uint8(ours: np.ndarray, ref: np.ndarray, exact: float = 0.99) -> None:
    """Equal up to one level, and exactly equal in at least ``exact`` of the values (floating-point rounding
    decides the truncation of values that land on a level)."""
    diff = np.abs(ours.astype(int) - ref.astype(int))
    assert diff.max() <= 1, diff.max()
    assert (diff == 0).mean() >= exact, (diff == 0).mean()


# ------------------------------------------------------------------------------ formulas without randomness
@pytest.mark.parametrize("severity", [1, 3, 5])
def test_contrast_is_the_channel_mean_formula(images: np.ndarray, severity: int) -> None:
    c = CIFAR_CONTRAST[severity - 1]
    ref = np.empty(images.shape)
    for i, image in enumerate(images / 255.0):
        for ch in range(3):
            mean = image[:, :, ch].sum() / image[:, :, ch].size
            ref[i, :, :, ch] = (image[:, :, ch] - mean) * c + mean
    assert_close_uint8(corrupt(images, "contrast", severity), floor_uint8(ref))


@pytest.mark.parametrize("severity", [1, 5])
def test_brightness_adds_to_the_hsv_value(images: np.ndarray, severity: int) -> None:
    from skimage.color import hsv2rgb, rgb2hsv

    c = CIFAR_BRIGHTNESS[severity - 1]
    batch = images[:2]
    ref = np.empty(batch.shape)
    for index in np.ndindex(batch.shape[:3]):
        h, s, v = colorsys.rgb_to_hsv(*(batch[index] / 255.0))
        ref[index] = colorsys.hsv_to_rgb(h, s, min(v + c, 1.0))
    ours = corrupt(batch, "brightness", severity)
    assert_close_uint8(ours, floor_uint8(ref), exact=0.97)  # colorsys rounds differently: truncation may differ
    hsv = rgb2hsv(batch / 255.0)
    hsv[..., 2] = np.clip(hsv[..., 2] + c, 0, 1)
    np.testing.assert_array_equal(ours, floor_uint8(hsv2rgb(hsv)))


def test_black_pixels_turn_grey_under_brightness() -> None:
    black = np.zeros((1, 32, 32, 3), dtype=np.uint8)
    assert (corrupt(black, "brightness", 5) == int(0.3 * 255)).all()


@pytest.mark.parametrize(("size", "qualities"), [(32, CIFAR_JPEG), (40, IMAGENET_JPEG)])
def test_jpeg_is_pil_at_the_published_quality(images: np.ndarray, size: int, qualities: tuple[int, ...]) -> None:
    batch = np.stack([cv2.resize(im, (size, size)) for im in images[:3]])
    for severity, quality in enumerate(qualities, start=1):
        ref = []
        for image in batch:
            buffer = io.BytesIO()
            Image.fromarray(image).save(buffer, "JPEG", quality=quality)
            ref.append(np.asarray(Image.open(buffer)))
        np.testing.assert_array_equal(corrupt(batch, "jpeg_compression", severity), np.stack(ref))


def box_resize_axis(x: np.ndarray, out: int, axis: int) -> np.ndarray:
    """PIL's BOX filter along one axis, written from its definition: an output pixel averages the input pixels whose
    centres fall in its footprint (at least the nearest one when enlarging); rounded to integers."""
    n = x.shape[axis]
    scale = n / out
    rows = []
    for j in range(out):
        lo, hi = j * scale, (j + 1) * scale
        inside = [k for k in range(n) if lo <= k + 0.5 < hi] or [min(int((j + 0.5) * scale), n - 1)]
        rows.append(np.take(x, inside, axis=axis).mean(axis=axis))
    return np.floor(np.stack(rows, axis=axis) + 0.5)


@pytest.mark.parametrize("severity", [1, 2, 4, 5])
def test_pixelate_is_a_box_resize_down_and_up(images: np.ndarray, severity: int) -> None:
    small = int(32 * CIFAR_PIXELATE[severity - 1])
    ref = images.astype(float)
    for size, axis in ((small, 2), (small, 1), (32, 2), (32, 1)):  # PIL: horizontal pass, then vertical
        ref = box_resize_axis(ref, size, axis)
    assert_close_uint8(corrupt(images, "pixelate", severity), ref.astype(np.uint8), exact=0.97)


@pytest.mark.parametrize("severity", [1, 4, 5])
def test_defocus_is_a_correlation_with_the_antialiased_disk(images: np.ndarray, severity: int) -> None:
    radius, alias = CIFAR_DEFOCUS[severity - 1]
    grid = np.arange(-8, 9)
    disk = (grid[None, :] ** 2 + grid[:, None] ** 2 <= radius**2).astype(float)
    disk /= disk.sum()
    taps = np.exp(-(np.arange(-1, 2) ** 2) / (2 * alias**2))
    taps /= taps.sum()
    kernel = ndimage.correlate1d(ndimage.correlate1d(disk, taps, 0, mode="mirror"), taps, 1, mode="mirror")
    kernel = kernel.astype(np.float32)  # the generators' kernel is float32
    ref = np.stack(
        [ndimage.correlate(images[..., ch] / 255.0, kernel[None], mode="mirror") for ch in range(3)], axis=-1
    )
    assert_close_uint8(corrupt(images, "defocus_blur", severity), floor_uint8(ref))


@pytest.mark.parametrize("severity", [1, 3, 5])
def test_zoom_blur_averages_scipy_zooms_of_the_centre(images: np.ndarray, severity: int) -> None:
    factors = np.arange(1, CIFAR_ZOOM_STOPS[severity - 1], 0.01)
    ref = []
    for image in (images[:3] / 255.0).astype(np.float32):
        total = np.zeros_like(image)
        for z in factors:
            crop = int(np.ceil(32 / z))
            top = (32 - crop) // 2
            zoomed = ndimage.zoom(image[top : top + crop, top : top + crop], (z, z, 1), order=1)
            trim = (zoomed.shape[0] - 32) // 2
            total += zoomed[trim : trim + 32, trim : trim + 32]
        ref.append((image + total) / (len(factors) + 1))
    assert_close_uint8(corrupt(images[:3], "zoom_blur", severity), floor_uint8(np.stack(ref)))


@pytest.mark.parametrize("delta", [1, 2])
def test_glass_blur_shuffles_as_the_generators_loop(images: np.ndarray, delta: int) -> None:
    """The generators' own statement, run on numpy views as they ran it (a copy from the neighbour, not a swap)."""
    from skimage.filters import gaussian

    sigma, rounds = 0.4, 2
    shifts = np.random.default_rng(3).integers(-delta, delta, size=(rounds, 32 - 2 * delta, 32 - 2 * delta, 2, 2))
    batch = images[:2]
    ref = []
    for i, image in enumerate(batch):
        x = (gaussian(image / 255.0, sigma=sigma, channel_axis=-1) * 255).astype(np.uint8)
        for step in shifts:
            for a, h in enumerate(range(32 - delta, delta, -1)):
                for b, w in enumerate(range(32 - delta, delta, -1)):
                    dx, dy = step[a, b, i]
                    h_prime, w_prime = h + dy, w + dx
                    x[h, w], x[h_prime, w_prime] = x[h_prime, w_prime], x[h, w]
        ref.append(gaussian(x / 255.0, sigma=sigma, channel_axis=-1))
    blurred = (ops.gaussian(batch / 255.0, sigma) * 255).astype(np.uint8)
    ours = ops.gaussian(ops.glass_shuffle(blurred, delta, shifts) / 255.0, sigma)
    np.testing.assert_allclose(ours, np.stack(ref), atol=1e-12)


def test_elastic_displacement_is_scipy_map_coordinates(images: np.ndarray) -> None:
    rng = np.random.default_rng(5)
    batch = images[:3]
    dx, dy = (rng.normal(0, 2.0, size=(3, 32, 32)).astype(np.float32) for _ in range(2))
    ours = ops.elastic_apply(batch, np.zeros((3, 3, 2)), dx, dy)
    ref = []
    for i, image in enumerate(batch.astype(np.float32) / 255.0):
        x, y, z = np.meshgrid(np.arange(32), np.arange(32), np.arange(3))
        coords = (y + dy[i][..., None]).reshape(-1), (x + dx[i][..., None]).reshape(-1), z.reshape(-1)
        ref.append(ndimage.map_coordinates(image, coords, order=1, mode="reflect").reshape(32, 32, 3))
    np.testing.assert_array_equal(ours, floor_uint8(np.stack(ref)))


def test_elastic_affine_moving_every_point_one_pixel_right_shifts_the_image(images: np.ndarray) -> None:
    jitter = np.tile([1.0, 0.0], (2, 3, 1))
    zero = np.zeros((2, 32, 32), dtype=np.float32)
    ours = ops.elastic_apply(images[:2], jitter, zero, zero)
    shifted = np.concatenate([images[:2, :, 1:2], images[:2, :, :-1]], axis=2)  # column -1 mirrors to column 1
    np.testing.assert_array_equal(ours, floor_uint8(shifted.astype(np.float32) / 255.0))


def test_fog_with_a_given_fractal_is_the_generators_formula(images: np.ndarray) -> None:
    fractal = np.random.default_rng(2).uniform(0, 1, size=(8, 32, 32))
    ref = np.empty(images.shape)
    for i, image in enumerate(images / 255.0):
        peak = image.max()
        ref[i] = (image + 0.75 * fractal[i][..., None]) * peak / (peak + 0.75)
    assert_close_uint8(ops.fog_apply(images, 0.75, fractal), floor_uint8(ref))


def test_plasma_fractal_spans_zero_to_one_and_is_smooth() -> None:
    maps = ops.plasma_fractal(np.random.default_rng(0), 16, 32, 2.0)
    assert maps.shape == (16, 32, 32)
    np.testing.assert_allclose(maps.min(axis=(1, 2)), 0)
    np.testing.assert_allclose(maps.max(axis=(1, 2)), 1)
    noise = np.random.default_rng(0).uniform(0, 1, maps.shape)  # neighbours agree far more than in white noise
    assert np.abs(np.diff(maps, axis=2)).mean() < 0.3 * np.abs(np.diff(noise, axis=2)).mean()


# ------------------------------------------------------------------------------------------- motion blur
def imagemagick() -> list[str] | None:
    """The command of a real ImageMagick (``magick`` or ``convert``), or ``None``."""
    for name in ("magick", "convert"):
        path = shutil.which(name)
        if path is None:
            continue
        version = subprocess.run([path, "-version"], capture_output=True, text=True, check=False)
        if version.returncode == 0 and version.stdout.startswith("Version: ImageMagick"):
            return [path]
    return None


@pytest.mark.slow
def test_motion_blur_equals_imagemagick(images: np.ndarray, tmp_path: Path) -> None:
    command = imagemagick()
    if command is None:
        pytest.skip("ImageMagick is not installed (apt-get install imagemagick)")
    image = np.concatenate([images[0], images[1][:, :8]], axis=1)  # 32 x 40: rows and columns differ
    cv2.imwrite(str(tmp_path / "in.png"), image[..., ::-1])
    for radius, sigma, angle in ((6, 1, 30.0), (9, 2.5, -40.0), (14, 12, -100.0), (15, 5, 12.5)):
        out = tmp_path / "out.png"
        subprocess.run([*command, str(tmp_path / "in.png"), "-motion-blur", f"{radius}x{sigma}+{angle}", str(out)])
        ref = cv2.imread(str(out), cv2.IMREAD_UNCHANGED)[..., ::-1]
        ours = ops.magick_uint8(ops.motion_blur_float(image[None], radius, sigma, np.array([angle])))[0]
        np.testing.assert_array_equal(ours, ref)


@pytest.mark.slow
@pytest.mark.parametrize("severity", [1, 3, 5])
def test_snow_is_the_generators_recipe_with_imagemagick(images: np.ndarray, tmp_path: Path, severity: int) -> None:
    """Given the same noise and angle: scipy's zoom of the centre, the threshold, an 8-bit grey PNG blurred by
    ImageMagick, and the lift towards OpenCV's grey, as the generator chains them."""
    command = imagemagick()
    if command is None:
        pytest.skip("ImageMagick is not installed (apt-get install imagemagick)")
    params = CIFAR_SNOW[severity - 1]
    mean, std, zoom, threshold, radius, sigma, keep = params
    rng = np.random.default_rng(severity)
    noise, angles = rng.normal(mean, std, size=(2, 32, 32)), rng.uniform(-135, -45, size=2)
    ref = []
    for image, layer, angle in zip(images[:2], noise, angles, strict=True):
        crop = int(np.ceil(32 / zoom))
        top = (32 - crop) // 2
        layer = ndimage.zoom(layer[top : top + crop, top : top + crop, None], (zoom, zoom, 1), order=1)
        trim = (layer.shape[0] - 32) // 2
        layer = layer[trim : trim + 32, trim : trim + 32]
        layer[layer < threshold] = 0
        Image.fromarray((np.clip(layer[..., 0], 0, 1) * 255).astype(np.uint8), mode="L").save(tmp_path / "in.png")
        subprocess.run([*command, str(tmp_path / "in.png"), "-motion-blur", f"{radius}x{sigma}+{angle}",
                        str(tmp_path / "out.png")], check=True)  # fmt: skip
        flakes = cv2.imread(str(tmp_path / "out.png"), cv2.IMREAD_UNCHANGED)[..., None] / 255.0
        x = image.astype(np.float32) / 255.0
        x = keep * x + (1 - keep) * np.maximum(x, cv2.cvtColor(x, cv2.COLOR_RGB2GRAY)[..., None] * 1.5 + 0.5)
        ref.append(np.clip(x + flakes + np.rot90(flakes, k=2), 0, 1) * 255)
    ours = snow_apply(images[:2], params, noise, angles)
    np.testing.assert_array_equal(ours, np.stack(ref).astype(np.uint8))


@pytest.fixture(scope="module")
def imagecorruptions():
    """The ``imagecorruptions`` package (ImageNet-C's constants), importable on current numpy / setuptools: it needs
    ``pkg_resources.resource_filename`` and ``np.float_`` at import, which are lent to it for this module's tests; a
    skip where it is absent."""
    with pytest.MonkeyPatch.context() as patch:
        try:
            import pkg_resources  # noqa: F401
        except ImportError:
            shim = types.ModuleType("pkg_resources")
            shim.resource_filename = lambda package, path: path
            patch.setitem(sys.modules, "pkg_resources", shim)
        patch.setattr(np, "float_", np.float64, raising=False)
        yield pytest.importorskip("imagecorruptions", reason="pip install --no-deps imagecorruptions: compare with it")


def test_motion_blur_matches_imagecorruptions(imagecorruptions, images: np.ndarray) -> None:
    from imagecorruptions.corruptions import _motion_blur

    big = cv2.resize(images[2], (64, 64))
    for radius, sigma, angle in ((10, 3, 20.0), (20, 15, -44.0)):
        ref = _motion_blur(big, radius=radius, sigma=sigma, angle=angle)
        np.testing.assert_allclose(
            ops.motion_blur_float(big[None], radius, sigma, np.array([angle]))[0], ref, atol=1e-3
        )


@pytest.mark.parametrize(
    ("name", "exact"),
    [("contrast", 0.99), ("brightness", 1.0), ("jpeg_compression", 1.0), ("pixelate", 1.0), ("defocus_blur", 0.99)],
)
def test_imagenet_constants_match_imagecorruptions(
    imagecorruptions, images: np.ndarray, name: str, exact: float
) -> None:
    batch = np.stack([cv2.resize(im, (64, 64)) for im in images[:2]])
    for severity in (1, 3, 5):
        ref = np.stack([imagecorruptions.corrupt(im, corruption_name=name, severity=severity) for im in batch])
        assert_close_uint8(corrupt(batch, name, severity), ref, exact=exact)


# ---------------------------------------------------------------------------------- noise by its statistics
GREY = np.full((48, 32, 32, 3), 128, dtype=np.uint8)


@pytest.mark.parametrize("severity", [1, 5])
def test_gaussian_noise_has_the_published_standard_deviation(severity: int) -> None:
    diff = (corrupt(GREY, "gaussian_noise", severity, seed=1).astype(float) - 128) / 255
    sigma = CIFAR_GAUSSIAN[severity - 1]
    assert diff.std() == pytest.approx(np.hypot(sigma, 1 / 255 / np.sqrt(12)), rel=0.02)
    assert diff.mean() == pytest.approx(-0.5 / 255, abs=0.2 / 255)  # truncation to uint8 lowers by half a level


@pytest.mark.parametrize("severity", [1, 5])
def test_shot_noise_has_poisson_variance(severity: int) -> None:
    c = CIFAR_SHOT[severity - 1]
    values = corrupt(GREY, "shot_noise", severity, seed=1).astype(float) / 255
    assert values.var() == pytest.approx(128 / 255 / c, rel=0.05)  # poisson(x c) / c has variance x / c
    assert values.mean() == pytest.approx(128 / 255 - 0.5 / 255, abs=0.5 / 255)


@pytest.mark.parametrize("severity", [1, 5])
def test_impulse_noise_flips_the_published_fraction_half_salt(severity: int) -> None:
    out = corrupt(GREY, "impulse_noise", 1 if severity == 1 else 5, seed=1)
    amount = CIFAR_IMPULSE[0 if severity == 1 else 1]
    salt, pepper = (out == 255).mean(), (out == 0).mean()
    assert salt + pepper == pytest.approx(amount, rel=0.05)
    assert salt / (salt + pepper) == pytest.approx(0.5, abs=0.05)
    assert ((out == 128) | (out == 0) | (out == 255)).all()


# ----------------------------------------------------------------------------------------- severity grows
STRICT = [n for n in CORRUPTIONS if n not in ("glass_blur", "motion_blur", "frost", "elastic_transform")]


def mean_change(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(float) - b.astype(float)).mean())


@pytest.mark.parametrize("name", STRICT)
def test_mean_absolute_change_grows_with_severity(photos: np.ndarray, name: str) -> None:
    changes = [mean_change(corrupt(photos, name, s), photos) for s in range(1, 6)]
    assert all(a < b for a, b in zip(changes, changes[1:], strict=False)), changes


def test_motion_blur_grows_with_severity_at_the_same_angles(photos: np.ndarray) -> None:
    """CIFAR-10-C's severities 3 (6, 2) and 4 (8, 2) share sigma: the taps 4 adds weigh under 0.3 %, so severity 4
    only just blurs more; at the same angles it still never blurs less."""
    angles = np.random.default_rng(0).uniform(-45, 45, len(photos))
    params = ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5))
    changes = [mean_change(ops.magick_uint8(ops.motion_blur_float(photos, *p, angles)), photos) for p in params]
    assert all(a <= b for a, b in zip(changes, changes[1:], strict=False)) and changes[0] < changes[-1], changes


def test_frost_hides_more_of_the_image_with_severity(photos: np.ndarray) -> None:
    """The image weight falls and the frost weight rises (1, 0.2) ... (0.75, 0.45), so the mean change need not
    grow (a darker image under bright frost changes less), but the correlation with the clean image falls."""
    texture = frost_texture(np.random.default_rng(0), len(photos), 32, 32)
    weights = ((1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45))
    clean = photos.reshape(len(photos), -1).astype(float)
    corr = []
    for image_weight, frost_weight in weights:
        out = frost_apply(photos, image_weight, frost_weight, texture).reshape(len(photos), -1).astype(float)
        corr.append(np.mean([np.corrcoef(a, b)[0, 1] for a, b in zip(out, clean, strict=True)]))
    assert all(a > b for a, b in zip(corr, corr[1:], strict=False)), corr


def test_elastic_local_displacement_grows_with_severity(photos: np.ndarray) -> None:
    """CIFAR-10-C's affine jitter shrinks with severity (2.56 to 0.96 px) while the local displacement grows; the
    local part alone changes the image more at every severity."""
    rng = np.random.default_rng(0)
    noise = rng.uniform(-1, 1, size=(2, len(photos), 32, 32))
    none = np.zeros((len(photos), 3, 2))
    changes = []
    for alpha, sigma in ((0, 0), (1.6, 6.4), (2.56, 1.92), (3.2, 1.28), (3.2, 0.96)):
        dx, dy = (ndimage.gaussian_filter(n, (0, sigma, sigma), mode="reflect", truncate=3) * alpha for n in noise)
        changes.append(mean_change(ops.elastic_apply(photos, none, dx, dy), photos))
    assert all(a < b for a, b in zip(changes, changes[1:], strict=False)), changes


def test_glass_blur_blurs_more_within_a_round_count_and_moves_more_with_more_rounds(photos: np.ndarray) -> None:
    """Severities 1-3 shuffle once and blur with sigma 0.05, 0.25, 0.4; 4-5 shuffle twice: at the same shuffles the
    detail left falls with sigma, and two rounds move pixels further than one."""
    shifts = np.random.default_rng(0).integers(-1, 1, size=(2, 30, 30, len(photos), 2))

    def glass(sigma: float, rounds: int) -> np.ndarray:
        x = (ops.gaussian(photos / 255.0, sigma) * 255).astype(np.uint8)
        return ops.to_uint8(ops.gaussian(ops.glass_shuffle(x, 1, shifts[:rounds]) / 255.0, sigma))

    def detail(x: np.ndarray) -> float:
        return float(np.abs(np.diff(x.astype(float), axis=2)).mean())

    one = [detail(glass(s, 1)) for s in (0.05, 0.25, 0.4)]
    two = [detail(glass(s, 2)) for s in (0.25, 0.4)]
    assert one[0] > one[1] > one[2] and two[0] > two[1], (one, two)
    assert mean_change(glass(0.25, 2), photos) > mean_change(glass(0.25, 1), photos)


# ------------------------------------------------------------------------------------- the two tables
def test_imagenet_sized_images_take_imagenet_constants(images: np.ndarray) -> None:
    big = np.stack([cv2.resize(im, (48, 48)) for im in images[:2]])
    assert_close_uint8(corrupt(big, "contrast", 1), floor_uint8(contrast_ref(big, 0.4)))  # ImageNet-C's 0.4


def contrast_ref(x: np.ndarray, c: float) -> np.ndarray:
    x = x / 255.0
    means = x.mean(axis=(1, 2), keepdims=True)
    return (x - means) * c + means
