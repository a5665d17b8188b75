"""vit.tta: the views of test-time augmentation against numpy's reflect padding, and the average of probabilities."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vit.tta import averaged_logits, views


def reference_view(x: torch.Tensor, flip: bool, dy: int, dx: int, shift: int) -> torch.Tensor:
    """The image (mirrored) shifted by ``shift`` steps of ``(dy, dx)``, read from numpy's reflect padding."""
    images = x.flip(-1).numpy() if flip else x.numpy()
    padded = np.pad(images, ((0, 0), (0, 0), (dy, dy), (dx, dx)), mode="reflect")
    height, width = x.shape[-2:]
    return torch.from_numpy(
        padded[..., dy + shift * dy : dy + shift * dy + height, dx + shift * dx : dx + shift * dx + width]
    )


@pytest.mark.parametrize(("height", "width"), [(32, 32), (48, 20), (7, 9)])
def test_views_are_the_image_its_mirror_and_both_shifted_by_a_sixteenth(height, width):
    x = torch.randn(3, 2, height, width, generator=torch.Generator().manual_seed(0))
    dy, dx = max(1, round(height / 16)), max(1, round(width / 16))
    assert views(x, "none") == [x]
    flip = views(x, "flip")
    assert len(flip) == 2 and torch.equal(flip[0], x) and torch.equal(flip[1], x.flip(-1))
    got = views(x, "flip_translate")
    expected = [x, x.flip(-1)] + [reference_view(x, f, dy, dx, s) for s in (-1, 1) for f in (False, True)]
    assert len(got) == 6
    for view, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(view, reference, rtol=0, atol=0)


def test_averaged_logits_are_the_log_of_the_mean_probabilities():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 5))
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        single, averaged = averaged_logits(model, x, "flip_translate")
        probs = torch.stack([model(view).softmax(-1) for view in views(x, "flip_translate")]).mean(0)
        torch.testing.assert_close(single, model(x))
        torch.testing.assert_close(averaged.exp(), probs)
        alone, same = averaged_logits(model, x, "none")
    assert alone is same
