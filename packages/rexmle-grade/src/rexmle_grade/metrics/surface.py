"""Surface distances between binary masks, in physical units (mm), exact.

Conventions (arrays in numpy order, e.g. SimpleITK's (z, y, x); ``spacing`` per array axis in the same order):

* **Contour** (Metrics Reloaded; SimpleITK ``LabelContour(fullyConnected=True)`` after padding the image by one
  background voxel): the voxels of a mask with at least one background voxel among their 26 neighbours (3-D) or 8
  neighbours (2-D); positions outside the array count as background.
* **Directed contour distances** ``d(A->B)``: for every contour voxel of A, the Euclidean distance between voxel
  centres to the nearest contour voxel of B (0 where the contours share a voxel). The official TopCoW/TopBrain code
  samples a SignedMaurer distance map of B's contour at A's contour voxels; this is the same quantity.
* **HD95** = max(p95(d(A->B)), p95(d(B->A))) with numpy's linear-interpolation percentile; **HD** = max of both maxima.
* **Maximum Hausdorff distance** (:func:`max_hausdorff`, SimpleITK ``HausdorffDistanceImageFilter`` semantics): over
  *all* foreground voxels, the largest distance from a voxel of one mask to the nearest voxel of the other, both
  directions.

Speed: every search runs inside the bounding box of the two masks. Exact nearest-voxel distances come from a k-d
tree on the target voxels, asked first for neighbours within 16 voxels (cheap); the rest, queries far from every
target, cost a tree tens of microseconds each (a distant query sees much of a smooth surface at almost the same
distance), so when they are many (more than one per 256 box voxels, e.g. a speckled prediction over a whole scan)
one exact Euclidean feature transform of the box answers them all (about 14 bytes and 0.2 µs per box voxel).
Empty masks have no distances: callers decide what such a case scores (challenges differ).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage
from scipy.spatial import cKDTree

from rexmle_grade.metrics.boxes import mask_bounding_box, union_box

Spacing = tuple[float, ...]


def contour(mask: np.ndarray) -> np.ndarray:
    """Voxels of ``mask`` having a background voxel among their full (26 in 3-D) neighbourhood; outside = background."""
    solid = np.asarray(mask, dtype=bool)
    # erosion by the full 3x3x3 cube is a separable minimum filter, much cheaper than a structured binary erosion
    eroded = ndimage.minimum_filter(solid.view(np.uint8), size=3, mode="constant", cval=0)
    return solid & (eroded == 0)


_NEAR_VOXELS = 16  # k-d tree look-ups bounded by this radius (in voxels of the coarsest axis) are cheap
_BOX_VOXELS_PER_FAR_QUERY = 256  # fewer box voxels than this per far query: one feature transform is cheaper


def _common_box(a: np.ndarray, b: np.ndarray, spacing: Spacing) -> tuple[np.ndarray, np.ndarray]:
    """Both masks (both non-empty) cropped to the bounding box of their union, as bool arrays."""
    if a.shape != b.shape:
        raise ValueError(f"mask shapes differ: {a.shape} vs {b.shape}")
    if len(spacing) != a.ndim:
        raise ValueError(f"spacing {spacing} does not match a {a.ndim}-D mask")
    box_a, box_b = mask_bounding_box(a), mask_bounding_box(b)
    if box_a is None or box_b is None:
        raise ValueError("surface distances need two non-empty masks; score empty masks by the challenge's rule")
    box = union_box(box_a, box_b)
    return np.asarray(a[box], dtype=bool), np.asarray(b[box], dtype=bool)


def contour_voxels(mask: np.ndarray) -> np.ndarray:
    """Indices (n, ndim) of the contour voxels of ``mask``, found inside the mask's own bounding box."""
    own = mask_bounding_box(mask)
    if own is None:
        return np.zeros((0, mask.ndim), dtype=np.intp)
    return np.argwhere(contour(mask[own])) + np.array([s.start for s in own])


def nearest_distances(targets: np.ndarray, queries: np.ndarray, shape: tuple[int, ...],
                      spacing: Spacing) -> np.ndarray:
    """Exact Euclidean distance (physical units) from each query voxel to the nearest target voxel.

    ``targets`` (at least one) and ``queries`` are integer voxel indices (n, ndim) into a grid of ``shape``.
    """
    if queries.shape[0] == 0:
        return np.zeros(0)
    scale = np.asarray(spacing, dtype=np.float64)
    points = queries * scale
    tree = cKDTree(targets * scale)
    distances, _ = tree.query(points, k=1, distance_upper_bound=_NEAR_VOXELS * float(scale.max()))
    far = ~np.isfinite(distances)
    n_far = int(np.count_nonzero(far))
    if n_far * _BOX_VOXELS_PER_FAR_QUERY > np.prod(shape):
        background = np.ones(shape, dtype=bool)
        background[tuple(targets.T)] = False
        nearest = ndimage.distance_transform_edt(background, sampling=scale, return_distances=False,
                                                 return_indices=True)
        far_queries = queries[far]
        steps = nearest[(slice(None), *far_queries.T)].T - far_queries
        distances[far] = np.sqrt(((steps * scale) ** 2).sum(axis=1))
    elif n_far:
        distances[far] = tree.query(points[far], k=1)[0]
    return np.asarray(distances, dtype=np.float64)


def directed_contour_distances(a: np.ndarray, b: np.ndarray, spacing: Spacing) -> tuple[np.ndarray, np.ndarray]:
    """(d(A->B), d(B->A)): distances of each contour voxel of A to B's contour, and vice versa (both non-empty)."""
    a, b = _common_box(a, b, spacing)
    edge_a, edge_b = contour_voxels(a), contour_voxels(b)
    return (nearest_distances(edge_b, edge_a, a.shape, spacing), nearest_distances(edge_a, edge_b, a.shape, spacing))


@dataclass(frozen=True)
class HausdorffPair:
    hd95: float  # max of the two directed 95th percentiles
    hd: float  # max of the two directed maxima


def contour_hausdorff(a: np.ndarray, b: np.ndarray, spacing: Spacing) -> HausdorffPair:
    """HD95 and HD between the 26-neighbour contours of two non-empty masks (Metrics Reloaded, TopCoW/TopBrain)."""
    d_ab, d_ba = directed_contour_distances(a, b, spacing)
    hd95 = max(float(np.percentile(d_ab, 95)), float(np.percentile(d_ba, 95)))
    return HausdorffPair(hd95=hd95, hd=max(float(d_ab.max()), float(d_ba.max())))


def max_hausdorff(a: np.ndarray, b: np.ndarray, spacing: Spacing) -> float:
    """Symmetric maximum Hausdorff distance over all foreground voxels of two non-empty masks.

    Only voxels of one mask outside the other have a non-zero distance, and the nearest voxel of a mask to a point
    outside it always lies on its contour (a step towards the point along an axis would otherwise stay inside and be
    closer), so contour voxels are the only targets.
    """
    a, b = _common_box(a, b, spacing)
    worst = 0.0
    for source, target in ((a, b), (b, a)):
        outside = np.argwhere(source & ~target)
        if outside.shape[0]:
            worst = max(worst, float(nearest_distances(contour_voxels(target), outside, a.shape, spacing).max()))
    return worst


def grid_diagonal(shape: tuple[int, ...], spacing: Spacing) -> float:
    """Distance between the centres of two opposite corner voxels: the largest distance two voxels can have."""
    return float(np.sqrt(sum(((n - 1) * float(s)) ** 2 for n, s in zip(shape, spacing, strict=True))))
