"""Voxel-overlap metrics on binary masks: Dice and IoU (Jaccard), with explicit empty-mask conventions.

Challenges disagree on what two empty masks score (ISLES'22: Dice 1; TopCoW/TopBrain: a label absent from both
is not scored; a label present on one side only: 0), so the value for an empty union is a required argument.
"""

from __future__ import annotations

import numpy as np


def _counts(a: np.ndarray, b: np.ndarray) -> tuple[int, int, int]:
    if a.shape != b.shape:
        raise ValueError(f"mask shapes differ: {a.shape} vs {b.shape}")
    a = a.astype(bool, copy=False)
    b = b.astype(bool, copy=False)
    return int(np.count_nonzero(a & b)), int(np.count_nonzero(a)), int(np.count_nonzero(b))


def dice(a: np.ndarray, b: np.ndarray, *, empty: float) -> float:
    """2|A∩B| / (|A|+|B|) on binary masks; ``empty`` when both masks are empty."""
    inter, na, nb = _counts(a, b)
    return empty if na + nb == 0 else 2.0 * inter / (na + nb)


def iou(a: np.ndarray, b: np.ndarray, *, empty: float) -> float:
    """|A∩B| / |A∪B| on binary masks; ``empty`` when both masks are empty."""
    inter, na, nb = _counts(a, b)
    union = na + nb - inter
    return empty if union == 0 else inter / union


def dice_from_counts(intersection: float, size_sum: float, *, empty: float) -> float:
    """Dice from pooled counts (e.g. micro Dice over many images)."""
    return empty if size_sum == 0 else 2.0 * intersection / size_sum
