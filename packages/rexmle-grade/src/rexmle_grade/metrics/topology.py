"""Topology metrics for tubular structures: clDice, Betti-0 error, and label adjacency (26-neighbourhood).

Axis order: masks are numpy arrays in SimpleITK order (z, y, x). scikit-image's Lee thinning is not symmetric in
its axes, and the TopCoW/TopBrain evaluators skeletonise arrays transposed to (x, y, z), so :func:`skeleton`
transposes before thinning; with another order per-case clDice changes by up to ~0.01.
"""

from __future__ import annotations

import itertools

import numpy as np
from skimage.morphology import skeletonize

from rexmle_grade.metrics.boxes import mask_bounding_box
from rexmle_grade.metrics.components import count_components

# one offset of each +/- pair of the 26-neighbourhood: checking (v, v + o) for these covers every adjacent pair once
_HALF_NEIGHBOURHOOD = [o for o in itertools.product((-1, 0, 1), repeat=3) if o > (0, 0, 0)]


def skeleton(mask: np.ndarray) -> np.ndarray:
    """Skeleton of a binary (z, y, x) mask (scikit-image ``skeletonize``: Lee 1994 in 3-D, Zhang in 2-D).

    Thinning runs on the mask's bounding box in reversed axis order (x, y, z); the skeleton of that crop equals the
    skeleton of the whole array, because thinning pads with background and visits voxels in the same relative order.
    """
    out = np.zeros(mask.shape, dtype=bool)
    box = mask_bounding_box(mask)
    if box is not None:
        reversed_crop = np.ascontiguousarray(np.asarray(mask[box], dtype=bool).T)
        out[box] = skeletonize(reversed_crop).T
    return out


def _skeleton_in(source: np.ndarray, other: np.ndarray) -> float:
    """|S(source) ∩ other| / |S(source)|, 0 for an empty skeleton (clDice's topology precision/sensitivity)."""
    box = mask_bounding_box(source)
    if box is None:
        return 0.0
    skel = skeleton(source[box])
    total = np.count_nonzero(skel)
    if total == 0:
        return 0.0
    return np.count_nonzero(skel & np.asarray(other[box], dtype=bool)) / total


def cldice(gt: np.ndarray, pred: np.ndarray) -> float:
    """Centreline Dice (Shit et al. 2021) of two binary masks as the TopCoW/TopBrain evaluators compute it.

    Tprec = |S(P) ∩ G| / |S(P)|, Tsens = |S(G) ∩ P| / |S(G)| (each 0 for an empty skeleton);
    clDice = 2·Tprec·Tsens / (Tprec + Tsens), 0 when both are 0.
    """
    if gt.shape != pred.shape:
        raise ValueError(f"mask shapes differ: {gt.shape} vs {pred.shape}")
    tprec = _skeleton_in(pred, gt)
    tsens = _skeleton_in(gt, pred)
    if tprec + tsens == 0:
        return 0.0
    return 2.0 * tprec * tsens / (tprec + tsens)


def betti0(mask: np.ndarray) -> int:
    """Number of 26-connected (3-D; 8-connected in 2-D) components of a binary mask; 0 when empty."""
    box = mask_bounding_box(mask)
    if box is None:
        return 0
    return count_components(mask[box], 26 if mask.ndim == 3 else 8)


def betti0_error(gt: np.ndarray, pred: np.ndarray) -> int:
    """|β0(pred) − β0(gt)| with full connectivity."""
    return abs(betti0(pred) - betti0(gt))


def label_adjacency(labels: np.ndarray) -> dict[int, frozenset[int]]:
    """For every non-zero label of a 3-D label map, the other non-zero labels touching it (26-neighbourhood).

    Label m touches l when some voxel of m lies in the 26-dilation of mask l minus l (TopCoW's per-component
    neighbour search and TopBrain's ``get_neighbor_per_mask`` give the same sets). Only foreground voxels are
    visited: each is compared with its neighbours at the 13 offsets of one half of the neighbourhood (the other
    half is covered by symmetry), by gathering from a zero-padded flat copy of the foreground box.
    """
    if labels.ndim != 3:
        raise ValueError(f"label adjacency is defined here for 3-D label maps, got {labels.ndim}-D")
    box = mask_bounding_box(labels)
    if box is None:
        return {}
    padded = np.pad(labels[box], 1)
    flat = padded.ravel()
    where = np.flatnonzero(flat)
    own = flat[where]
    present = [int(v) for v in np.unique(own)]
    code_base = present[-1] + 1
    steps = np.array(padded.strides) // padded.itemsize
    codes = []
    for offset in _HALF_NEIGHBOURHOOD:
        other = flat[where + int(np.dot(offset, steps))]
        touching = (other != 0) & (other != own)
        codes.append(np.unique(own[touching].astype(np.int64) * code_base + other[touching]))
    neighbours: dict[int, set[int]] = {label: set() for label in present}
    for code in np.unique(np.concatenate(codes)):
        first_label, second_label = divmod(int(code), code_base)
        neighbours[first_label].add(second_label)
        neighbours[second_label].add(first_label)
    return {label: frozenset(found) for label, found in neighbours.items()}
