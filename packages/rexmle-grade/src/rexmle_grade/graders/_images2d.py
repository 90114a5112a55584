"""Helpers shared by the 2-D graders (reading and writing 2-D prediction and answer images, per-case means).

This module registers no grader.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rexmle_grade.errors import InvalidSubmissionError, TaskDataMissingError
from rexmle_grade.grader import CaseInput, Grader, TestManifest, answer_cases, write_submission_csv
from rexmle_grade.io import PIL_FORMATS, check_labels, full_suffix, read_image_2d, read_json
from rexmle_grade.schema import FileColumn, SubmissionSchema


def expected_size(case: CaseInput) -> tuple[int, int] | None:
    """(width, height) of the test image from the public manifest, if the task recorded it."""
    return None if case.geometry is None else (int(case.geometry.size[0]), int(case.geometry.size[1]))


def read_prediction_image(case: CaseInput, column: FileColumn, *, integer: bool,
                          allowed: Iterable[int] | None = None) -> np.ndarray:
    """A single-channel 2-D prediction image of the test image's size; ``allowed`` restricts its values."""
    path = case.prediction_path(column)
    array = read_image_2d(path, what=f"{column.name} of {case.case_id!r}", expected_size=expected_size(case),
                          integer=integer)
    if allowed is not None:
        check_labels(array, frozenset(allowed), what=f"{column.name} of {case.case_id!r}", name=path.name)
    return array


def read_gray8_prediction(case: CaseInput, column: FileColumn, *, allowed: Iterable[int] | None = None) -> np.ndarray:
    """An 8-bit grayscale (PIL mode ``L``) prediction image of the test image's size; ``allowed`` restricts its
    values.

    The mode is checked before decoding because a palette (``P``) image would otherwise decode to its palette
    indices and an RGB image would need a colour conversion: neither is guessed.
    """
    from PIL import Image

    path = case.prediction_path(column)
    what = f"{column.name} of {case.case_id!r}"
    try:
        with Image.open(path, formats=PIL_FORMATS.get(full_suffix(path))) as img:
            mode = img.mode
    except (OSError, ValueError, Image.DecompressionBombError) as exc:  # OSError covers unidentified images
        raise InvalidSubmissionError(f"{what} {path.name!r} cannot be read as an image: {exc}") from None
    if mode != "L":
        raise InvalidSubmissionError(
            f"{what} {path.name!r} has PIL mode {mode!r}; an 8-bit single-channel grayscale image (mode 'L') is "
            "expected"
        )
    array = read_image_2d(path, what=what, expected_size=expected_size(case), integer=True)
    if allowed is not None:
        check_labels(array, frozenset(allowed), what=what, name=path.name)
    return array


def answer_file(case: CaseInput, column: str) -> Path:
    path = case.answer_path(column)
    if not path.is_file():
        raise TaskDataMissingError(f"answer file {str(path)!r} of case {case.case_id!r} is missing",
                                   hint="re-run `rexmle prepare TASK --force`")
    return path


def read_answer_image(case: CaseInput, column: str, *, gray: bool = False) -> np.ndarray:
    """A private answer image (``gray=True``: converted to 8-bit grayscale with PIL, as the release grader did)."""
    path = answer_file(case, column)
    try:
        if gray:
            from PIL import Image

            with Image.open(path) as img:
                return np.asarray(img if img.mode == "L" else img.convert("L"))
        return read_image_2d(path, what=f"answer {column} of {case.case_id!r}")
    except (InvalidSubmissionError, OSError) as exc:
        raise TaskDataMissingError(f"answer image {str(path)!r} cannot be read: {exc}",
                                   hint="re-run `rexmle prepare TASK --force`") from None


def read_answer_json(case: CaseInput, column: str) -> Any:
    path = answer_file(case, column)
    try:
        return read_json(path, what=f"answer {column} of {case.case_id!r}")
    except InvalidSubmissionError as exc:
        raise TaskDataMissingError(f"answer file {str(path)!r} is unreadable: {exc}",
                                   hint="re-run `rexmle prepare TASK --force`") from None


def require_same_shape(prediction: np.ndarray, reference: np.ndarray, case: CaseInput, column: FileColumn) -> None:
    """Guard for tasks whose manifest carries no size: the prediction must match the answer pixel for pixel."""
    if prediction.shape != reference.shape:
        raise InvalidSubmissionError(
            f"{column.name} of {case.case_id!r} is {prediction.shape[1]}x{prediction.shape[0]} (width x height); "
            f"the test image is {reference.shape[1]}x{reference.shape[0]}"
        )


def manifest_image_size(manifest: TestManifest, case_id: str) -> tuple[int, int]:
    """(width, height) of a test image, needed to write a sample prediction image."""
    width, height = manifest.geometry_of(case_id).size[:2]
    return int(width), int(height)


def write_file_submission(dest: Path, schema: SubmissionSchema, column: FileColumn, case_ids: Iterable[str],
                          write_file: Callable[[str, Path], None]) -> None:
    """Write one prediction file per case (``write_file(case_id, path)``) at the column's template path, and the
    ``submission.csv`` naming them."""
    rows = []
    for case_id in case_ids:
        relative = column.path_for(case_id)
        path = dest / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(case_id, path)
        rows.append({schema.id_column: case_id, column.name: relative})
    write_submission_csv(dest, schema, rows)


def write_tiff(path: Path, array: np.ndarray) -> None:
    import tifffile

    tifffile.imwrite(path, array, compression="zlib")


def write_png(path: Path, array: np.ndarray) -> None:
    from PIL import Image

    Image.fromarray(np.ascontiguousarray(array)).save(path)


class ImageAnswerGrader(Grader):
    """A grader whose one prediction column holds an image in the format of its answer images: the gold submission
    rewrites each answer image, the sample one a blank image of the test image's size.

    Subclasses set :attr:`write_image` (``staticmethod(write_tiff)`` or ``staticmethod(write_png)``), the answer
    column and the blank image; ``column`` is the prediction column, set in ``__init__`` with ``schema``.
    """

    column: FileColumn
    write_image: Callable[[Path, np.ndarray], None]
    answer_image_column: str
    answer_gray: bool = False  # answers in any PIL mode, compared as 8-bit grayscale
    gold_dtype: type[np.integer] | None = None  # when the submission format needs another dtype than the answer's
    blank_dtype: type[np.integer] = np.uint8
    blank_value: int = 0

    def write_gold_submission(self, private_dir: Path, public_dir: Path, dest: Path) -> None:
        cases = {c.case_id: c for c in answer_cases(self, private_dir, public_dir)}

        def answer(case_id: str, path: Path) -> None:
            image = read_answer_image(cases[case_id], self.answer_image_column, gray=self.answer_gray)
            self.write_image(path, image if self.gold_dtype is None else image.astype(self.gold_dtype))

        write_file_submission(dest, self.schema, self.column, cases, answer)

    def write_sample_submission(self, public_dir: Path, dest: Path) -> None:
        manifest = TestManifest.read(public_dir)

        def blank(case_id: str, path: Path) -> None:
            width, height = manifest_image_size(manifest, case_id)
            self.write_image(path, np.full((height, width), self.blank_value, dtype=self.blank_dtype))

        write_file_submission(dest, self.schema, self.column, manifest.ids, blank)


MAX_LISTED_PER_FILE = 20


def is_finite_number(value: Any) -> bool:
    """A JSON number (not a boolean) that is finite as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond the float range
        return False


def enough_problems(problems: Sequence[str]) -> bool:
    """True once one file has more problems than :func:`raise_problems` lists: stop checking it, so that a document
    of millions of wrong entries costs a few messages, not millions."""
    return len(problems) > MAX_LISTED_PER_FILE


def raise_problems(problems: Sequence[str], what: str) -> None:
    """Raise the problems found in one file (the first :data:`MAX_LISTED_PER_FILE` of them), if any."""
    if problems:
        extra = ([f"... and more problems in {what} (checking stopped after {MAX_LISTED_PER_FILE})"]
                 if enough_problems(problems) else [])
        raise InvalidSubmissionError([*problems[:MAX_LISTED_PER_FILE], *extra])


def mean_over_cases(cases: Sequence[Mapping[str, Any]], keys: Iterable[str]) -> dict[str, float]:
    """Arithmetic mean over the cases of each per-case value."""
    return {key: float(np.mean([float(c[key]) for c in cases])) for key in keys}
