"""Boxes: bounding boxes of masks, and axis-aligned voxel boxes with their (boundary) IoU in closed form.

Two kinds of box live here:

* :func:`mask_bounding_box` and friends return numpy slices (array axis order) used to crop work to where a mask
  is, which is what keeps the voxel metrics fast on large volumes;
* :class:`VoxelBox` is a box of whole voxels given as a minimum corner and a size per axis, covering
  ``location .. location + size - 1`` inclusive on each axis: the TopCoW ROI convention (``roi_loc_labelsTr`` txt
  files and task-2 ``{"size": [...], "location": [...]}`` predictions, both in (x, y, z) voxel indices).

Boundary IoU (TopCoW task 2, ``topcow24_eval/metrics/box_metrics``): the band of a box is the set of its voxels
within ``d_a = ceil(ratio * size_a)`` voxels of a face along axis ``a``, i.e. the box minus the inner box
``[min_a + d_a, max_a - d_a]``. The official code enumerates voxel sets; the counts follow from inclusion-exclusion
over outer and inner boxes, so no voxel set is ever built.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BoxSlices = tuple[slice, ...]


# ---- bounding boxes of masks (numpy axis order) ------------------------------------------------------------------
def mask_bounding_box(mask: np.ndarray) -> BoxSlices | None:
    """The smallest box of slices holding every non-zero element of ``mask``; None when it has none.

    Computed from one projection per axis (``any`` over the other axes), which is far cheaper than listing the
    coordinates of a large mask.
    """
    box = []
    for axis in range(mask.ndim):
        others = tuple(a for a in range(mask.ndim) if a != axis)
        hits = np.flatnonzero(mask.any(axis=others) if others else mask)
        if hits.size == 0:
            return None
        box.append(slice(int(hits[0]), int(hits[-1]) + 1))
    return tuple(box)


def union_box(first: BoxSlices | None, second: BoxSlices | None) -> BoxSlices | None:
    """The smallest box holding both boxes (None counts as empty)."""
    if first is None:
        return second
    if second is None:
        return first
    return tuple(slice(min(a.start, b.start), max(a.stop, b.stop)) for a, b in zip(first, second, strict=True))


# ---- voxel boxes (TopCoW convention, x/y/z order) -----------------------------------------------------------------
@dataclass(frozen=True)
class VoxelBox:
    """Voxels ``location[a] .. location[a] + size[a] - 1`` (inclusive) on each axis ``a``; sizes must be >= 1."""

    location: tuple[int, ...]
    size: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.location) != len(self.size):
            raise ValueError(f"location {self.location} and size {self.size} have different lengths")
        if any(s < 1 for s in self.size):
            raise ValueError(f"box sizes must be >= 1, got {self.size}")

    @property
    def end(self) -> tuple[int, ...]:
        """The last voxel index on each axis (inclusive)."""
        return tuple(lo + s - 1 for lo, s in zip(self.location, self.size, strict=True))

    @property
    def volume(self) -> int:
        return math.prod(self.size)

    def band_widths(self, ratio: float) -> tuple[int, ...]:
        # float product then ceil, exactly as the official code
        return tuple(math.ceil(s * ratio) for s in self.size)


Range = tuple[int, int]  # inclusive (first, last); empty when first > last


def _ranges_volume(ranges: Sequence[Range]) -> int:
    return math.prod(max(0, hi - lo + 1) for lo, hi in ranges)


def _intersect(a: Sequence[Range], b: Sequence[Range]) -> list[Range]:
    return [(max(lo1, lo2), min(hi1, hi2)) for (lo1, hi1), (lo2, hi2) in zip(a, b, strict=True)]


def _outer(box: VoxelBox) -> list[Range]:
    return list(zip(box.location, box.end, strict=True))


def _inner(box: VoxelBox, ratio: float) -> list[Range]:
    return [(lo + d, hi - d) for lo, hi, d in zip(box.location, box.end, box.band_widths(ratio), strict=True)]


def _band_volume(box: VoxelBox, ratio: float) -> int:
    return box.volume - _ranges_volume(_inner(box, ratio))


def band_iou(first: VoxelBox, second: VoxelBox, ratio: float) -> float:
    """IoU of the two boxes' boundary bands of relative width ``ratio`` (0 when the union is empty).

    The inner box is contained in the outer one, so |band1 ∩ band2| = V(O1∩O2) - V(I1∩O2) - V(O1∩I2) + V(I1∩I2).
    """
    o1, o2 = _outer(first), _outer(second)
    i1, i2 = _inner(first, ratio), _inner(second, ratio)
    both = (_ranges_volume(_intersect(o1, o2)) - _ranges_volume(_intersect(i1, o2))
            - _ranges_volume(_intersect(o1, i2)) + _ranges_volume(_intersect(i1, i2)))
    union = _band_volume(first, ratio) + _band_volume(second, ratio) - both
    return both / union if union > 0 else 0.0


def boundary_iou(first: VoxelBox, second: VoxelBox, ratio: float = 0.2) -> float:
    """TopCoW ``boundary_iou``: band IoU with bands of ``ceil(0.2 * size)`` voxels."""
    return band_iou(first, second, ratio)


def box_iou(first: VoxelBox, second: VoxelBox) -> float:
    """Plain voxel IoU of two boxes (equals the official band IoU at ratio 0.5, whose band is the whole box)."""
    inter = _ranges_volume(_intersect(_outer(first), _outer(second)))
    return inter / (first.volume + second.volume - inter)


# ---- ROI text files ------------------------------------------------------------------------------------------
_NUMBER = re.compile(r"\b\d+\b")


def parse_roi_txt(text: str) -> VoxelBox:
    """Parse a TopCoW ``--- ROI Meta Data ---`` file: line 2 holds the sizes, line 3 the minimum corner (x y z).

    As the official parser, it reads every unsigned integer token of lines 2 and 3. Raises ValueError when either
    line does not hold exactly three.
    """
    lines = text.splitlines()
    if len(lines) < 3:
        raise ValueError(f"an ROI file has 3 lines (header, size, location); this one has {len(lines)}")
    size = [int(tok) for tok in _NUMBER.findall(lines[1])]
    location = [int(tok) for tok in _NUMBER.findall(lines[2])]
    if len(size) != 3 or len(location) != 3:
        raise ValueError(f"expected 3 sizes and 3 locations, got {size} and {location}")
    return VoxelBox(location=tuple(location), size=tuple(size))


def crop_slices_zyx(box: VoxelBox, size_xyz: Sequence[int]) -> BoxSlices:
    """Numpy (z, y, x) slices of an (x, y, z)-indexed ROI clipped to an image of ``size_xyz``, as the official crop.

    Per axis: start = max(0, location), end = min(size - 1, start + box size - 1) (the end follows the clipped
    start). Raises ValueError when the clipped box is empty.
    """
    slices = []
    for lo, extent, dim in zip(box.location, box.size, size_xyz, strict=True):
        start = max(0, lo)
        end = min(dim - 1, start + extent - 1)
        if end < start:
            raise ValueError(f"ROI {box} lies outside an image of size {list(size_xyz)}")
        slices.append(slice(start, end + 1))
    return tuple(reversed(slices))
