"""Classification accuracy measures."""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def balanced_accuracy(y_true: Sequence[Hashable], y_pred: Sequence[Hashable]) -> float:
    """Mean over the classes present in ``y_true`` of the fraction of their cases predicted exactly.

    Same as scikit-learn's ``balanced_accuracy_score(adjusted=False)``: predicted classes that never occur in
    ``y_true`` add no class of their own, they only count as misses.
    """
    if len(y_true) != len(y_pred):
        raise ValueError(f"y_true has {len(y_true)} entries but y_pred has {len(y_pred)}")
    if not y_true:
        raise ValueError("balanced accuracy needs at least one case")
    hits: dict[Hashable, list[bool]] = {}
    for truth, guess in zip(y_true, y_pred, strict=True):
        hits.setdefault(truth, []).append(truth == guess)
    return sum(sum(found) / len(found) for found in hits.values()) / len(hits)
