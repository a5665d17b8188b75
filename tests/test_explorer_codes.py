"""The attention explorer's stored codes: square-root quantisation decoded within its bound, six bits that keep entropy
and distance, pages refused when too many images would not fit, and the finest bits that fit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from explorer_data import MEAN, STD, decode_bound, decode_rows, one_image_page, stored

from vit.explain.render import explorer
from vit.explain.render.explorer import ExplorerTooLarge, explorer_payload, render_explorer, write_explorer
from vit.explain.render.explorer_codes import quantize_rows
from vit.explain.stats import patch_distances, row_entropy


@pytest.fixture
def pixels():
    torch.manual_seed(1)
    return torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)


@pytest.mark.parametrize("bits", [6, 8, 3])
def test_quantize_rows_codes_the_square_root_and_decodes_within_its_bound(bits):
    torch.manual_seed(0)
    attn = torch.rand(2, 5, 7) ** 6
    attn[0, 1, :2] = 5.0  # a sink on the prefix keys
    attn[1, 2, 2:] = 0.0  # every patch key at zero
    attn[1, 3, :2] = 2e4 * attn[1, 3, 2:].sum()  # a sink: 0.99995 on the prefix, float16 would round 1 - it to 0
    attn = attn / attn.sum(-1, keepdim=True)
    codes, share = quantize_rows(attn, prefix=2, bits=bits)
    assert codes.dtype == np.uint8 and share.shape == (2, 5) and share.dtype == np.float16
    levels = 2**bits - 1
    for i in range(2):
        for q in range(5):
            row = attn[i, q].double().numpy()
            for keys in (slice(2, None), slice(0, 2)):
                top = row[keys].max()
                expected = np.rint(levels * np.sqrt(row[keys] / top)) if top > 0 else np.zeros_like(row[keys])
                np.testing.assert_array_equal(codes[i, q, keys], expected)
            front = row[:2].sum() / row.sum()  # the smaller share, float16 (11 bits, subnormal below 2^-14)
            small, sign = (front, 1.0) if front <= 0.5 else (1 - front, -1.0)
            assert np.copysign(1.0, share[i, q]) == sign  # negative, even when 0: the patches' share
            assert abs(float(share[i, q])) == pytest.approx(small, rel=2**-11, abs=2**-25)
    decoded = decode_rows(codes, share, 2, bits)
    truth = attn.double().numpy()
    np.testing.assert_allclose(decoded.sum(-1), 1.0, atol=1e-12)
    bound = decode_bound(truth, 2, bits)
    assert np.all(np.abs(decoded - truth) <= bound)
    for keys in (slice(0, 2), slice(2, None)):  # within a few steps of each key group's own maximum
        assert np.all(bound[..., keys] <= 4 / levels * truth[..., keys].max(-1, keepdims=True) + 1e-6)
    assert decoded[1, 2, 2:].max() == 0 and decoded[0, 1, :2].sum() > 0.9
    np.testing.assert_allclose(decoded[1, 3, 2:].sum(), truth[1, 3, 2:].sum(), rtol=2**-10, atol=2**-24)  # sink
    assert quantize_rows(attn[..., 2:], prefix=0, bits=bits)[1] is None
    with pytest.raises(ValueError, match="bits must be an integer from 2 to 8, got 9"):
        quantize_rows(attn, bits=9)


def test_six_bits_keep_entropy_and_distance_of_peaked_rows():
    """Rows like a trained model's (a few strong keys, a long tail): the statistics the page shows stay close."""
    torch.manual_seed(0)
    logits = torch.randn(64, 64) * 3
    attn = logits.softmax(-1)
    codes, _ = quantize_rows(attn, bits=6)
    decoded = torch.from_numpy(decode_rows(codes, None, 0, 6))
    distances = patch_distances((8, 8), (4, 4)).double()
    assert (row_entropy(decoded) - row_entropy(attn.double())).abs().max() < 0.05  # nats; log 64 = 4.16
    assert ((decoded - attn.double()) * distances).sum(-1).abs().max() < 0.2  # pixels, on a 32-pixel image


def test_too_many_images_are_refused_with_how_many_fit(tmp_path, random_vit, pixels, monkeypatch):
    model = random_vit(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4)
    one = one_image_page(model, pixels)
    with pytest.raises(ExplorerTooLarge, match=r"^3 images are too many .* about \d+ fit") as err:
        write_explorer(
            tmp_path / "e.html",
            explorer_payload(model, pixels, mean=MEAN, std=STD, max_bytes=one + 1_200, batch_size=1, bits=6),
        )
    assert "\n" not in str(err.value)
    assert not (tmp_path / "e.html").exists() and not list(tmp_path.iterdir())
    seen, real = [], explorer.explain  # with a subset note: the first that fit, each image explained once
    monkeypatch.setattr(explorer, "explain", lambda m, x, *a, **kw: seen.append(len(x)) or real(m, x, *a, **kw))
    data = explorer_payload(model, pixels, mean=MEAN, std=STD, max_bytes=one + 1_200, batch_size=1, subset_note=str,
                            bits=6)  # fmt: skip
    kept = len(data["images"])
    assert 1 <= kept < 3 and data["note"] == str(kept) and sum(seen) == kept + 1
    with pytest.raises(ValueError, match="map 'bad' has shape"):
        write_explorer(
            tmp_path / "e.html", explorer_payload(model, pixels, mean=MEAN, std=STD, maps={"bad": torch.zeros(3, 2, 2)})
        )


def test_auto_bits_are_the_finest_that_fit_and_the_page_says_so(tmp_path, random_vit):
    torch.manual_seed(0)
    model = random_vit(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=4).eval()
    images = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    long_names = ["first", *(f"{i}: " + "a long file name " * 1_000 for i in range(1, 6))]  # the first undersizes

    def page(pixels, bits, max_bytes=None, names=long_names):
        data = explorer_payload(model, pixels, mean=MEAN, std=STD, max_bytes=max_bytes, bits=bits, attribution=False,
                                names=names)  # fmt: skip
        return data, len(render_explorer(data).encode())

    size = {bits: page(images, bits)[1] for bits in (6, 5, 4, 3)}
    assert size[6] > size[5] > size[4] > size[3]
    data, _ = page(images, "auto")  # no limit: the finest
    assert data["bits"] == 6 and data["note"] is None
    for bits in (5, 4, 3):
        limit = size[bits] + 200  # room for the page's note on the bits
        assert page(images[:1].repeat(6, 1, 1, 1), 6, names=["first"] * 6)[1] < limit  # as the first sizes them
        data, written = page(images, "auto", limit)
        assert data["bits"] == bits and written <= limit < size[bits + 1]  # the finest that fits, one step at a time
        assert data["note"] == (f"The attention is stored at {bits} bits per value instead of 6 to keep the explorer "
                                f"under {limit / 1e3:.0f} kB: the small maps are coarser.")  # fmt: skip
        assert stored(data, 1)[0].max() <= 2**bits - 1
    with pytest.raises(ExplorerTooLarge, match=r"^6 images are too many .* over the \d+ kB limit; about [1-5] fit"):
        page(images, "auto", size[3] // 2)  # not even 3 bits fit: refused as without "auto"
    _, written = page(images, 6, size[6] + 50)  # the limit holds to the byte: the page is counted as it is written
    assert written <= size[6] + 50
    with pytest.raises(ExplorerTooLarge):
        page(images, 6, size[6] - 1)
    from vit.callbacks import AttentionRolloutLogger

    with pytest.raises(ValueError, match='explorer_bits must be "auto" or an integer from 2 to 8, got 6.0'):
        AttentionRolloutLogger(num_images=1, statistics=False, faithfulness_every_n=0, explorer_bits=6.0)
