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

Speed: every search runs inside the bounding box of the two masks, and no work is proportional to the box volume
beyond a few boolean passes. HD95, HD and the maximum Hausdorff distance are order statistics of nearest-voxel
distances (:func:`order_statistics`): queries within 16 voxels of a target are answered exactly by a bounded k-d tree
on the target voxels (cheap); far queries (tens of microseconds each in a tree: a distant query sees much of a smooth
surface at almost the same distance; a speckled prediction over a whole scan has millions) first get cheap bounds
from block centres, re-bounded with smaller blocks while many stay undecided, and only those that may hold a wanted
rank are measured exactly. :func:`nearest_distances` still returns every distance (exact feature transform of the
box when far queries are many).
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
    # erosion by the full 3x3x3 cube is separable: an erosion by 3 voxels along each axis in turn (outside = background)
    eroded = solid.copy()
    for axis in range(solid.ndim):
        if solid.shape[axis] < 3:
            return solid.copy()
        step = eroded.copy()
        head = [slice(None)] * solid.ndim
        tail = [slice(None)] * solid.ndim
        head[axis], tail[axis] = slice(1, None), slice(None, -1)
        eroded[tuple(head)] &= step[tuple(tail)]
        eroded[tuple(tail)] &= step[tuple(head)]
        head[axis], tail[axis] = 0, -1
        eroded[tuple(head)] = False
        eroded[tuple(tail)] = False
    return solid & ~eroded


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


# far queries are bounded, then re-bounded while many remain undecided, by (query block, target block) sizes in
# voxels per axis: the distance between block centres, +- both half block diagonals (block 1: the voxel itself)
_BOUND_LEVELS = ((8, 4), (1, 4), (1, 2))
_FEW_TO_MEASURE = 4096  # undecided far queries: fewer than this are measured exactly, more are re-bounded first
_QUERY_CHUNK = 1 << 18  # k-d tree queries per call: bounds the memory of the look-ups


def _tree_distances(tree: cKDTree, points: np.ndarray, bound: float = np.inf) -> np.ndarray:
    """Nearest-point distances from ``tree`` for ``points``, in chunks (inf beyond ``bound``)."""
    out = np.empty(points.shape[0])
    for start in range(0, points.shape[0], _QUERY_CHUNK):
        out[start:start + _QUERY_CHUNK] = tree.query(points[start:start + _QUERY_CHUNK], k=1,
                                                     distance_upper_bound=bound)[0]
    return out


def _block_centres(voxels: np.ndarray, block: int, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(centres in mm of the distinct blocks holding ``voxels``, block number of each voxel, half block diagonal)."""
    if block == 1:
        return voxels * scale, np.arange(voxels.shape[0]), 0.0
    blocks = voxels // block
    extent = blocks.max(axis=0) + 1
    keys, inverse = np.unique(np.ravel_multi_index(tuple(blocks.T), tuple(extent)), return_inverse=True)
    unique = np.stack(np.unravel_index(keys, tuple(extent)), axis=1)
    centres = (unique * block + (block - 1) / 2.0) * scale
    return centres, inverse.reshape(-1), float(np.sqrt((((block - 1) / 2.0 * scale) ** 2).sum()))


def order_statistics(targets: np.ndarray, queries: np.ndarray, ranks: list[np.ndarray],
                     spacing: Spacing) -> list[np.ndarray]:
    """Exact values at each group of ``ranks`` (0-based, ascending) of the sorted nearest distances, queries to targets.

    Same numbers as sorting :func:`nearest_distances`, without computing every far distance: queries within
    ``_NEAR_VOXELS`` of a target are answered exactly by a bounded k-d tree look-up; every other query gets bounds
    [D - r, D + r] from the distance D between the centre of its block and the nearest centre of a target block (r: the
    two half block diagonals, triangle inequality). For each group, only queries whose bounds meet the window between
    the bounds of its ranks stay undecided; while many do, they are re-bounded with smaller blocks; the last few are
    measured exactly, and the others are merely counted above or below the window.
    """
    scale = np.asarray(spacing, dtype=np.float64)
    tree = cKDTree(targets * scale)
    exact = _tree_distances(tree, queries * scale, _NEAR_VOXELS * float(scale.max()))
    far = ~np.isfinite(exact)
    if not far.any():
        ordered = np.sort(exact)
        return [ordered[np.asarray(group, dtype=np.intp)] for group in ranks]
    lower, upper = exact.copy(), exact.copy()
    coarse: dict[int, tuple[cKDTree, float]] = {}

    def bound(which: np.ndarray, query_block: int, target_block: int) -> None:
        """Tighten the bounds of the far queries ``which`` (indices) with blocks of the given sizes."""
        if target_block not in coarse:
            t_centres, _, t_radius = _block_centres(targets, target_block, scale)
            coarse[target_block] = (cKDTree(t_centres), t_radius)
        t_tree, t_radius = coarse[target_block]
        q_centres, q_block, q_radius = _block_centres(queries[which], query_block, scale)
        centre_distance = _tree_distances(t_tree, q_centres)[q_block]
        slack = q_radius + t_radius + 1e-9 * (1.0 + centre_distance)  # rounding of the bounds, generously
        lower[which] = np.maximum(lower[which], centre_distance - slack)
        upper[which] = np.minimum(upper[which], centre_distance + slack)

    lower[far], upper[far] = 0.0, np.inf
    bound(np.flatnonzero(far), *_BOUND_LEVELS[0])
    results = []
    for group in ranks:
        group = np.asarray(group, dtype=np.intp)
        for level in (*_BOUND_LEVELS[1:], None):
            low = float(np.partition(lower, group)[group].min())  # <= every wanted order statistic
            high = float(np.partition(upper, group)[group].max())  # >= every wanted order statistic
            undecided = np.flatnonzero(far & (upper >= low) & (lower <= high))
            if level is None or undecided.size < _FEW_TO_MEASURE:
                break
            bound(undecided, *level)
        if undecided.size:
            exact[undecided] = lower[undecided] = upper[undecided] = _tree_distances(tree, queries[undecided] * scale)
            far[undecided] = False
        below = upper < low  # surely below the window
        inside = ~below & (lower <= high)  # exact now, or surely above the window
        values = np.sort(exact[inside & ~far])
        n_below = int(np.count_nonzero(below)) + int(np.count_nonzero(values < low))
        positions = group - n_below
        values = values[values >= low]
        if positions.min() < 0 or positions.max() >= values.size:  # impossible while the bounds hold
            raise AssertionError("surface distance bounds violated")
        results.append(values[positions])
    return results


@dataclass(frozen=True)
class HausdorffPair:
    hd95: float  # max of the two directed 95th percentiles
    hd: float  # max of the two directed maxima


def _p95_and_max(targets: np.ndarray, queries: np.ndarray, spacing: Spacing) -> tuple[float, float]:
    """(numpy linear p95, max) of the nearest distances from queries to targets, bit-identical to the full array."""
    n = queries.shape[0]
    centre = int(np.floor(0.95 * (n - 1)))
    ranks = np.unique(np.clip(np.array([centre - 1, centre, centre + 1, centre + 2]), 0, n - 1))
    values, (largest,) = order_statistics(targets, queries, [ranks, np.array([n - 1])], spacing)
    # a sorted stand-in with the exact values at every rank numpy's percentile may read: same interpolation, same bits
    stand_in = np.empty(n)
    stand_in[:ranks[0]] = values[0]
    for i, rank in enumerate(ranks):
        stand_in[rank:] = values[i]
    return float(np.percentile(stand_in, 95)), float(largest)


def contour_hausdorff(a: np.ndarray, b: np.ndarray, spacing: Spacing) -> HausdorffPair:
    """HD95 and HD between the 26-neighbour contours of two non-empty masks (Metrics Reloaded, TopCoW/TopBrain)."""
    a, b = _common_box(a, b, spacing)
    edge_a, edge_b = contour_voxels(a), contour_voxels(b)
    p95_ab, max_ab = _p95_and_max(edge_b, edge_a, spacing)
    p95_ba, max_ba = _p95_and_max(edge_a, edge_b, spacing)
    return HausdorffPair(hd95=max(p95_ab, p95_ba), hd=max(max_ab, max_ba))


def max_hausdorff(a: np.ndarray, b: np.ndarray, spacing: Spacing) -> float:
    """Symmetric maximum Hausdorff distance over all foreground voxels of two non-empty masks.

    Only voxels of one mask outside the other have a non-zero distance, and the nearest voxel of a mask to a point
    outside it always lies on its contour (a step towards the point along an axis would otherwise stay inside and be
    closer), so contour voxels are the only targets. Every voxel outside the other mask is a query (the farthest one
    need not lie on its own mask's contour), but only the few that may be the farthest are measured exactly.
    """
    a, b = _common_box(a, b, spacing)
    worst = 0.0
    for source, target in ((a, b), (b, a)):
        outside = np.argwhere(source & ~target)
        if outside.shape[0]:
            last = np.array([outside.shape[0] - 1])
            worst = max(worst, float(order_statistics(contour_voxels(target), outside, [last], spacing)[0][0]))
    return worst


def grid_diagonal(shape: tuple[int, ...], spacing: Spacing) -> float:
    """Distance between the centres of two opposite corner voxels: the largest distance two voxels can have."""
    return float(np.sqrt(sum(((n - 1) * float(s)) ** 2 for n, s in zip(shape, spacing, strict=True))))
