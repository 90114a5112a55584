"""Surface distances in the style of DeepMind's ``surface-distance`` library (used by PANTHER's evaluation).

Definitions (``google-deepmind/surface-distance`` @ 1f805ce, ``surface_distance/metrics.py`` and
``lookup_tables.py``; our own implementation):

* **Surface elements.** Both masks are cropped to the bounding box of their union. Every voxel corner of that box
  gets an 8-bit *neighbourhood code* from the 2x2x2 voxels around it (the corner grid is shifted by half a voxel
  from the voxel centres and has one more point per axis than the box). A corner whose code is neither 0 nor 255 is
  a surface element ("surfel").
* **Surfel area.** Each code stands for the marching-cubes surface inside one 2x2x2 cell: polygons whose vertices
  are the midpoints of the cell edges that join an inside to an outside corner. The area of a code is the sum of
  the areas of the polygon triangles after scaling the cell by the voxel spacing. Two choices fix the table, and
  both are those of the DeepMind table (checked for all 256 codes at arbitrary spacings):

  - on a cell face whose corners alternate inside/outside, the corners of the *minority* side of the cell
    (inside if at most 4 of the 8 corners are inside, else outside) are cut off separately, so a code and its
    complement always have the same surface;
  - a polygon that is not planar is split into the triangles whose total area, in voxel units, is largest.

* **Distances.** For every surfel of one mask, the Euclidean distance in mm to the nearest surfel of the other mask
  (an exact EDT on the corner grid with ``sampling=spacing``); +inf when the other mask has no surface. Distances are
  sorted ascending together with their areas (ties by area), which fixes the order of the floating-point sums.
* **Robust Hausdorff** (HD95 for ``percent=95``): per direction, the distance of the first surfel whose cumulative
  area fraction reaches ``percent/100`` (no interpolation); the maximum of the two directions; +inf if a direction
  has no surfels.
* **Average surface distances**: area-weighted mean distance per direction (NaN if a direction has no surfels);
  **MASD** is their mean.
* **Surface Dice at a tolerance**: the area of surfels within the tolerance (inclusive) of the other surface, over
  the total area of both surfaces (NaN if both are empty).

``spacing`` is given per *array axis*. PANTHER's official script passes SimpleITK's ``(sx, sy, sz)`` for a
``(z, y, x)`` array; callers decide which order to pass.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

Corner = tuple[int, int, int]
Edge = tuple[Corner, Corner]
Point = tuple[float, float, float]

#: corner (i, j, k) of a 2x2x2 cell (0: the lower voxel along that axis) carries the bit 2 ** (7 - (4i + 2j + k))
CORNERS: tuple[Corner, ...] = tuple(itertools.product((0, 1), repeat=3))
_BITS = {corner: 1 << (7 - (4 * corner[0] + 2 * corner[1] + corner[2])) for corner in CORNERS}
_AREA_TIE_TOLERANCE = 1e-9  # triangulation areas closer than this (voxel units) are equal


@dataclass(frozen=True)
class SurfaceDistances:
    """Per-surfel distances to the other mask's surface (ascending, mm) with the surfel areas (mm²)."""

    gt_to_pred: np.ndarray
    gt_areas: np.ndarray
    pred_to_gt: np.ndarray
    pred_areas: np.ndarray


# ---- the neighbourhood-code table ---------------------------------------------------------------------------------
def code_of(inside: Sequence[Corner]) -> int:
    """The neighbourhood code of a cell whose ``inside`` corners belong to the mask."""
    return sum(_BITS[c] for c in set(inside))


def _inside_corners(code: int) -> frozenset[Corner]:
    return frozenset(c for c in CORNERS if code & _BITS[c])


def _face_cycle(axis: int, value: int) -> list[Corner]:
    """The four corners of one cell face, in cyclic order."""
    a, b = (ax for ax in range(3) if ax != axis)
    cycle = []
    for u, v in ((0, 0), (0, 1), (1, 1), (1, 0)):
        corner = [0, 0, 0]
        corner[axis], corner[a], corner[b] = value, u, v
        cycle.append((corner[0], corner[1], corner[2]))
    return cycle


def _polygons(inside: frozenset[Corner]) -> list[list[Edge]]:
    """Marching-cubes polygons of one cell: cycles of cut edges (each edge stands for its midpoint)."""
    separate_inside = len(inside) <= 4
    neighbours: dict[Edge, list[Edge]] = {}
    for axis, value in itertools.product(range(3), (0, 1)):
        ring = _face_cycle(axis, value)
        sides = [(ring[n], ring[(n + 1) % 4]) for n in range(4)]
        cut = [tuple(sorted(side)) for side in sides if (side[0] in inside) != (side[1] in inside)]
        if len(cut) == 2:
            segments = [(cut[0], cut[1])]
        elif len(cut) == 4:
            # corner ring[n + 1] lies between cut sides n and n + 1; pair the sides around the corners to isolate
            if (ring[1] in inside) == separate_inside:
                segments = [(cut[0], cut[1]), (cut[2], cut[3])]
            else:
                segments = [(cut[1], cut[2]), (cut[3], cut[0])]
        else:
            segments = []
        for p, q in segments:
            neighbours.setdefault(p, []).append(q)
            neighbours.setdefault(q, []).append(p)
    cycles: list[list[Edge]] = []
    visited: set[Edge] = set()
    for start in neighbours:  # every cut edge lies on two faces, so each has exactly two neighbours
        if start in visited:
            continue
        cycle, previous, current = [start], None, start
        visited.add(start)
        while True:
            step = [n for n in neighbours[current] if n != previous and n not in visited]
            if not step:
                break
            previous, current = current, step[0]
            cycle.append(current)
            visited.add(current)
        cycles.append(cycle)
    return cycles


def _area_vector(p: Point, q: Point, r: Point) -> Point:
    """Half the cross product (q - p) x (r - p): normal to the triangle, as long as its area."""
    u = (q[0] - p[0], q[1] - p[1], q[2] - p[2])
    v = (r[0] - p[0], r[1] - p[1], r[2] - p[2])
    return (0.5 * (u[1] * v[2] - u[2] * v[1]), 0.5 * (u[2] * v[0] - u[0] * v[2]), 0.5 * (u[0] * v[1] - u[1] * v[0]))


def _largest_triangulation(points: Sequence[Point]) -> list[tuple[int, int, int]]:
    """The triangulation of a (possibly non-planar) polygon with the largest total area (dynamic programming)."""
    n = len(points)
    best = [[0.0] * n for _ in range(n)]
    split = [[0] * n for _ in range(n)]
    for length in range(2, n):
        for i in range(n - length):
            j = i + length
            options = [best[i][k] + best[k][j] + math.hypot(*_area_vector(points[i], points[k], points[j]))
                       for k in range(i + 1, j)]
            largest = max(options)
            choice = next(m for m, area in enumerate(options) if area > largest - _AREA_TIE_TOLERANCE)
            best[i][j], split[i][j] = options[choice], i + 1 + choice

    def collect(i: int, j: int) -> list[tuple[int, int, int]]:
        if j - i < 2:
            return []
        k = split[i][j]
        return [*collect(i, k), (i, k, j), *collect(k, j)]

    return collect(0, n - 1)


@functools.cache
def code_area_vectors() -> np.ndarray:
    """Area vectors (half cross products, voxel units) of every surface triangle of each code: (256, T, 3)."""
    per_code: list[list[Point]] = []
    for code in range(256):
        vectors: list[Point] = []
        for cycle in _polygons(_inside_corners(code)):
            points = [((a[0] + b[0]) / 2, (a[1] + b[1]) / 2, (a[2] + b[2]) / 2) for a, b in cycle]
            vectors += [_area_vector(points[i], points[j], points[k]) for i, j, k in _largest_triangulation(points)]
        per_code.append(vectors)
    table = np.zeros((256, max(len(v) for v in per_code), 3))
    for code, vectors in enumerate(per_code):
        if vectors:
            table[code, : len(vectors)] = vectors
    table.setflags(write=False)
    return table


def neighbour_code_areas(spacing: Sequence[float]) -> np.ndarray:
    """Surface area (mm²) of each of the 256 neighbourhood codes for voxel ``spacing`` (per array axis)."""
    s0, s1, s2 = (float(s) for s in spacing)
    # an area vector scales with the cofactors of diag(spacing): (s1 s2, s0 s2, s0 s1), multiplied in this order
    scaled = code_area_vectors() * np.array([s1, s0, s0]) * np.array([s2, s2, s1])
    return np.linalg.norm(scaled, axis=2).sum(axis=1)


# ---- surfels and distances --------------------------------------------------------------------------------------
def neighbourhood_codes(mask: np.ndarray) -> np.ndarray:
    """The code of every voxel corner of a 3-D mask: shape ``mask.shape + 1`` (corner c lies between voxels c-1, c)."""
    padded = np.pad(mask.astype(np.uint8, copy=False), 1)
    n0, n1, n2 = (size + 1 for size in mask.shape)
    codes = np.zeros((n0, n1, n2), dtype=np.uint8)
    for (i, j, k), bit in _BITS.items():
        codes |= padded[i : i + n0, j : j + n1, k : k + n2] * np.uint8(bit)
    return codes


def _as_3d_bool(mask: np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(mask)
    if array.ndim != 3:
        raise ValueError(f"{name} must be a 3-D array, got shape {array.shape}")
    return array.astype(bool, copy=False)


def surface_distances(gt: np.ndarray, pred: np.ndarray, spacing: Sequence[float]) -> SurfaceDistances:
    """Distances between the surfaces of two 3-D binary masks (``spacing`` in mm per array axis)."""
    gt = _as_3d_bool(gt, "gt")
    pred = _as_3d_bool(pred, "pred")
    if gt.shape != pred.shape:
        raise ValueError(f"mask shapes differ: {gt.shape} vs {pred.shape}")
    if len(spacing) != 3:
        raise ValueError(f"spacing needs 3 values (one per array axis), got {list(spacing)}")
    sampling = tuple(float(s) for s in spacing)
    empty = np.zeros(0)
    boxes = ndimage.find_objects((gt | pred).astype(np.uint8))
    if not boxes:
        return SurfaceDistances(empty, empty, empty, empty)
    box = boxes[0]
    areas = neighbour_code_areas(sampling)
    codes_gt = neighbourhood_codes(gt[box])
    codes_pred = neighbourhood_codes(pred[box])
    border_gt = (codes_gt != 0) & (codes_gt != 255)
    border_pred = (codes_pred != 0) & (codes_pred != 255)

    def to_surface(border: np.ndarray, targets: np.ndarray) -> np.ndarray:
        if not border.any():
            return np.full(int(np.count_nonzero(targets)), np.inf)
        return ndimage.distance_transform_edt(~border, sampling=sampling)[targets]

    gt_to_pred = to_surface(border_pred, border_gt)
    pred_to_gt = to_surface(border_gt, border_pred)
    gt_areas = areas[codes_gt[border_gt]]
    pred_areas = areas[codes_pred[border_pred]]
    order_gt = np.lexsort((gt_areas, gt_to_pred))
    order_pred = np.lexsort((pred_areas, pred_to_gt))
    return SurfaceDistances(gt_to_pred=gt_to_pred[order_gt], gt_areas=gt_areas[order_gt],
                            pred_to_gt=pred_to_gt[order_pred], pred_areas=pred_areas[order_pred])


# ---- summaries --------------------------------------------------------------------------------------------------
def _directed_percentile(distances: np.ndarray, areas: np.ndarray, percent: float) -> float:
    if distances.size == 0:
        return math.inf
    cumulative = np.cumsum(areas) / np.sum(areas)
    index = int(np.searchsorted(cumulative, percent / 100.0))
    return float(distances[min(index, distances.size - 1)])


def robust_hausdorff(sd: SurfaceDistances, percent: float) -> float:
    """Area-weighted percentile Hausdorff distance (mm): max over both directions; +inf if a surface is empty."""
    return max(_directed_percentile(sd.gt_to_pred, sd.gt_areas, percent),
               _directed_percentile(sd.pred_to_gt, sd.pred_areas, percent))


def _weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.sum(values * weights) / np.sum(weights))


def average_surface_distances(sd: SurfaceDistances) -> tuple[float, float]:
    """Area-weighted mean distance (mm) gt→pred and pred→gt; NaN for a direction without surfels."""
    return _weighted_mean(sd.gt_to_pred, sd.gt_areas), _weighted_mean(sd.pred_to_gt, sd.pred_areas)


def mean_average_surface_distance(sd: SurfaceDistances) -> float:
    """MASD: the mean of the two directed average surface distances (mm)."""
    gt_to_pred, pred_to_gt = average_surface_distances(sd)
    return (gt_to_pred + pred_to_gt) / 2.0


def surface_dice(sd: SurfaceDistances, tolerance_mm: float) -> float:
    """Surface Dice at ``tolerance_mm`` (distances ≤ tolerance count); NaN when both surfaces are empty."""
    close_gt = np.sum(sd.gt_areas[sd.gt_to_pred <= tolerance_mm])
    close_pred = np.sum(sd.pred_areas[sd.pred_to_gt <= tolerance_mm])
    with np.errstate(invalid="ignore", divide="ignore"):
        return float((close_gt + close_pred) / (np.sum(sd.gt_areas) + np.sum(sd.pred_areas)))
