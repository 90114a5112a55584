"""Full-reference image-quality metrics of the USenhance task: LNCC, SSIM and PSNR.

The organisers' evaluation code was never published (metrics page ``dentex_us_ldct.md`` §3); these are the
definitions of the ReX-MLE release grader, the only executable reference, kept in this one module so they can be
swapped if the official code surfaces:

* LNCC: each image min-max scaled, ``(x - min) / (max - min + 1e-8)``; local means, variances
  (``E[x²] - E[x]²``) and covariance with an 11x11 box filter whose border is reflect-101 (OpenCV's default, which
  is ``scipy.ndimage``'s ``mirror`` mode); NCC = cov / sqrt(var_a var_b) averaged over the pixels where both
  variances exceed 1e-10; with no such pixel, 1 if the scaled images are ``allclose`` and 0 otherwise;
* SSIM: ``skimage.metrics.structural_similarity`` defaults (7x7 uniform window, K1 0.01, K2 0.03, sample
  covariance) with the joint data range ``max(max a, max b) - min(min a, min b)``;
* PSNR: ``10 log10(range² / MSE)`` with the same joint data range.

Conventions of ours (not the release's): everything is computed in float64 (the release used float32, whose
rounding noise can exceed the 1e-10 variance floor in flat regions); PSNR is capped at :data:`PSNR_CAP_DB` so an
identical image scores 100 dB instead of +inf and means stay finite; SSIM of two identical constant images (data
range 0, where the formula is 0/0) is 1.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

LNCC_WINDOW = 11
LNCC_VARIANCE_FLOOR = 1e-10
MINMAX_EPS = 1e-8
PSNR_CAP_DB = 100.0


def _pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"expected two 2-D images of one shape, got {a.shape} and {b.shape}")
    return a, b


def joint_data_range(a: np.ndarray, b: np.ndarray) -> float:
    return float(max(a.max(), b.max()) - min(a.min(), b.min()))


def minmax_scale(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image, dtype=np.float64)
    low = image.min()
    return (image - low) / (image.max() - low + MINMAX_EPS)


def lncc(prediction: np.ndarray, reference: np.ndarray, *, window: int = LNCC_WINDOW) -> float:
    """Local normalised cross-correlation (see module docstring)."""
    a, b = _pair(prediction, reference)
    a, b = minmax_scale(a), minmax_scale(b)

    def box(x: np.ndarray) -> np.ndarray:
        return ndimage.uniform_filter(x, size=window, mode="mirror")

    mean_a, mean_b = box(a), box(b)
    var_a = box(a * a) - mean_a * mean_a
    var_b = box(b * b) - mean_b * mean_b
    cov = box(a * b) - mean_a * mean_b
    valid = (var_a > LNCC_VARIANCE_FLOOR) & (var_b > LNCC_VARIANCE_FLOOR)
    if not valid.any():
        return 1.0 if np.allclose(a, b) else 0.0
    return float(np.mean(cov[valid] / np.sqrt(var_a[valid] * var_b[valid])))


def ssim(prediction: np.ndarray, reference: np.ndarray) -> float:
    """SSIM with skimage defaults and the joint data range (1 for two identical constant images)."""
    from skimage.metrics import structural_similarity  # imported when used: the grader registry imports every grader

    a, b = _pair(prediction, reference)
    data_range = joint_data_range(a, b)
    if data_range == 0:
        return 1.0
    return float(structural_similarity(a, b, data_range=data_range))


def psnr(prediction: np.ndarray, reference: np.ndarray, *, cap_db: float = PSNR_CAP_DB) -> float:
    """PSNR in dB with the joint data range, capped at ``cap_db`` (identical images score ``cap_db``)."""
    from skimage.metrics import peak_signal_noise_ratio

    a, b = _pair(prediction, reference)
    if np.array_equal(a, b):
        return cap_db
    value = peak_signal_noise_ratio(b, a, data_range=joint_data_range(a, b))
    return float(min(value, cap_db))
