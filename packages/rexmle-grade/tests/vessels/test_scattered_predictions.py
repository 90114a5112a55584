"""Predictions sprinkled with many small islands far from the vessel: exact distances without whole-box work."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from rexmle_grade.metrics.surface import (
    contour,
    contour_hausdorff,
    contour_voxels,
    max_hausdorff,
    nearest_distances,
    order_statistics,
)


def tube_with_noise(spacing_seed: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
    """A curved tube (ground truth), a slightly shifted thinner tube plus random noise voxels (prediction)."""
    shape = (120, 160, 160)
    z, y, x = np.ogrid[: shape[0], : shape[1], : shape[2]]
    cy, cx = 80 + 25 * np.sin(z / 20.0), 70 + 15 * np.cos(z / 15.0)
    gt = ((y - cy) ** 2 + (x - cx) ** 2) < 6.0**2
    pred = ((y - cy - 1) ** 2 + (x - cx) ** 2) < 5.5**2
    pred |= np.random.default_rng(spacing_seed).random(shape) < noise
    return gt, pred


def edt_distances(target: np.ndarray, where: np.ndarray, spacing: tuple[float, ...]) -> np.ndarray:
    """Reference: exact Euclidean distance transform of the whole grid to ``target``, read at ``where``."""
    return ndimage.distance_transform_edt(~target, sampling=spacing)[where]


@pytest.mark.parametrize("spacing", [(1.0, 1.0, 1.0), (0.6, 0.45, 0.45)])
def test_scattered_noise_matches_whole_grid_distance_transform(spacing: tuple[float, ...]) -> None:
    gt, pred = tube_with_noise(int(spacing[0] * 10), 0.02)
    edge_gt, edge_pred = contour(gt), contour(pred)
    d_gp, d_pg = edt_distances(edge_pred, edge_gt, spacing), edt_distances(edge_gt, edge_pred, spacing)
    pair = contour_hausdorff(gt, pred, spacing)
    assert pair.hd95 == pytest.approx(max(np.percentile(d_gp, 95), np.percentile(d_pg, 95)), abs=1e-9)
    assert pair.hd == pytest.approx(max(d_gp.max(), d_pg.max()), abs=1e-9)
    expected_max = max(edt_distances(pred, gt, spacing).max(), edt_distances(gt, pred, spacing).max())
    assert max_hausdorff(gt, pred, spacing) == pytest.approx(expected_max, abs=1e-9)


def test_order_statistics_equal_the_sorted_distances_at_every_rank() -> None:
    # small grid, many ties (isotropic spacing) and anisotropic spacing: every rank of the full sorted array
    gt, pred = tube_with_noise(3, 0.01)
    gt, pred = gt[:40], pred[:40]
    for spacing in ((1.0, 1.0, 1.0), (0.9, 0.5, 0.7)):
        targets, queries = contour_voxels(gt), contour_voxels(pred)
        full = np.sort(nearest_distances(targets, queries, gt.shape, spacing))
        ranks = [np.arange(0, full.size, 97), np.array([full.size - 1]), np.array([0, 1]),
                 np.array([full.size // 2, full.size // 2 + 1])]
        for group, found in zip(ranks, order_statistics(targets, queries, ranks, spacing), strict=True):
            assert found == pytest.approx(full[group], abs=1e-9)
