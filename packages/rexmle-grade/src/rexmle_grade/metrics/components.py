"""Connected components with explicit connectivity (2-D: 4 or 8; 3-D: 6, 18 or 26)."""

from __future__ import annotations

import numpy as np
from scipy import ndimage

_STRUCTURES = {
    (2, 4): ndimage.generate_binary_structure(2, 1),
    (2, 8): ndimage.generate_binary_structure(2, 2),
    (3, 6): ndimage.generate_binary_structure(3, 1),
    (3, 18): ndimage.generate_binary_structure(3, 2),
    (3, 26): ndimage.generate_binary_structure(3, 3),
}


def structure(ndim: int, connectivity: int) -> np.ndarray:
    try:
        return _STRUCTURES[(ndim, connectivity)]
    except KeyError:
        raise ValueError(f"connectivity {connectivity} is not defined for {ndim}-D arrays") from None


def label_components(mask: np.ndarray, connectivity: int) -> tuple[np.ndarray, int]:
    """Label the connected components of a binary mask; returns (labels, count). Empty mask: count 0."""
    labels, count = ndimage.label(mask.astype(bool, copy=False), structure=structure(mask.ndim, connectivity))
    return labels, int(count)


def count_components(mask: np.ndarray, connectivity: int) -> int:
    """Betti-0: the number of connected components (0 for an empty mask)."""
    return label_components(mask, connectivity)[1]
