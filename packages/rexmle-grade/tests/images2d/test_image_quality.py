"""USenhance LNCC / SSIM / PSNR: the release's worked examples, hand cases and loop-based references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rexmle_grade.metrics.image_quality import PSNR_CAP_DB, joint_data_range, lncc, psnr, ssim


def ramp() -> np.ndarray:
    """The release examples' ground truth: 16x16, every row 0, 10, ..., 150, the lower 8 rows reversed."""
    image = np.tile(np.arange(16) * 10.0, (16, 1))
    image[8:] = image[8:, ::-1]
    return image


def checkerboard() -> np.ndarray:
    return np.where(np.add.outer(np.arange(16), np.arange(16)) % 2 == 0, -5.0, 5.0)


@pytest.mark.parametrize(("make_prediction", "expected"), [
    (lambda g: g + 10, (1.0, 0.9898, 24.0824)),
    (lambda g: g + checkerboard(), (0.9862, 0.9786, 30.1030)),
    (lambda g: np.full_like(g, 75.0), (0.0, 0.0325, 10.2482)),
])
def test_release_worked_examples(make_prediction, expected):
    gt = ramp()
    prediction = make_prediction(gt)
    got = (lncc(prediction, gt), ssim(prediction, gt), psnr(prediction, gt))
    assert got == pytest.approx(expected, abs=5e-5)


def test_psnr_by_hand_and_cap():
    gt = ramp()
    # MSE 100 with joint range 160 -> 10 log10(160^2 / 100)
    assert psnr(gt + 10, gt) == pytest.approx(10 * math.log10(160**2 / 100))
    assert joint_data_range(gt + 10, gt) == 160
    assert psnr(gt, gt) == PSNR_CAP_DB
    big = np.zeros((1000, 1000))
    big[0, 0] = 255.0  # one pixel off: MSE 255^2 / 1e6, so 10 log10(1e6) = 60 dB, under the cap
    assert psnr(big, np.zeros_like(big)) == pytest.approx(60.0)


def test_identical_and_constant_images():
    flat = np.full((12, 12), 40.0)
    assert ssim(flat, flat) == 1.0
    assert lncc(flat, flat) == 1.0  # no local variance anywhere, scaled images identical
    assert lncc(flat, flat + 1) == 1.0  # min-max scaling maps both to zeros
    gt = ramp()
    assert lncc(gt, gt) == pytest.approx(1.0)
    assert ssim(gt, gt) == pytest.approx(1.0)
    assert lncc(-gt, gt) == pytest.approx(-1.0)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="one shape"):
        lncc(np.zeros((8, 8)), np.zeros((8, 9)))


# ---- loop-based references -------------------------------------------------------------------------------------
def reflect101(i: int, n: int) -> int:
    while not 0 <= i < n:
        i = -i if i < 0 else 2 * (n - 1) - i
    return i


def reference_lncc(a: np.ndarray, b: np.ndarray, window: int = 11) -> float:
    def scale(x: np.ndarray) -> np.ndarray:
        return (x - x.min()) / (x.max() - x.min() + 1e-8)

    a, b = scale(a.astype(float)), scale(b.astype(float))
    height, width = a.shape
    half = window // 2
    values = []
    for r in range(height):
        for c in range(width):
            sa = sb = saa = sbb = sab = 0.0
            for dr in range(-half, half + 1):
                for dc in range(-half, half + 1):
                    x = a[reflect101(r + dr, height), reflect101(c + dc, width)]
                    y = b[reflect101(r + dr, height), reflect101(c + dc, width)]
                    sa, sb, saa, sbb, sab = sa + x, sb + y, saa + x * x, sbb + y * y, sab + x * y
            count = window * window
            ma, mb = sa / count, sb / count
            va, vb, cov = saa / count - ma * ma, sbb / count - mb * mb, sab / count - ma * mb
            if va > 1e-10 and vb > 1e-10:
                values.append(cov / math.sqrt(va * vb))
    if not values:
        return 1.0 if np.allclose(a, b) else 0.0
    return float(np.mean(values))


def reference_ssim(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(float), b.astype(float)
    data_range = max(a.max(), b.max()) - min(a.min(), b.min())
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    height, width = a.shape
    values = []
    for r in range(3, height - 3):
        for c in range(3, width - 3):
            x, y = a[r - 3:r + 4, c - 3:c + 4].ravel(), b[r - 3:r + 4, c - 3:c + 4].ravel()
            mx, my = x.mean(), y.mean()
            vx, vy = x.var(ddof=1), y.var(ddof=1)
            cxy = ((x - mx) * (y - my)).sum() / (x.size - 1)
            values.append((2 * mx * my + c1) * (2 * cxy + c2) / ((mx * mx + my * my + c1) * (vx + vy + c2)))
    return float(np.mean(values))


def reference_psnr(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(float), b.astype(float)
    mse = float(((a - b) ** 2).mean())
    data_range = max(a.max(), b.max()) - min(a.min(), b.min())
    return min(10 * math.log10(data_range**2 / mse), PSNR_CAP_DB) if mse else PSNR_CAP_DB


@pytest.mark.parametrize("seed", range(6))
def test_match_loop_references(seed):
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(9, 16)), int(rng.integers(9, 16)))
    reference = rng.integers(0, 256, size=shape).astype(np.uint8)
    reference[:4, :5] = 17  # a flat patch exercises the variance floor
    prediction = np.clip(reference.astype(int) + rng.integers(-40, 41, size=shape), 0, 255).astype(np.uint8)
    if seed == 5:
        prediction[:] = 0
        prediction[:6, :6] = 200
    assert lncc(prediction, reference) == pytest.approx(reference_lncc(prediction, reference), abs=1e-6)
    assert ssim(prediction, reference) == pytest.approx(reference_ssim(prediction, reference), abs=1e-6)
    assert psnr(prediction, reference) == pytest.approx(reference_psnr(prediction, reference), abs=1e-6)
