"""rexmle-grade as an evaluation library: score prediction files (or arrays) against ground-truth files directly,
without preparing a rexmle task.

Files are paired by case id:

* the case ids are the ground-truth file names without their suffix (``.nii.gz``, ``.seg.nrrd``, ``.png``...) when
  ``truth`` is a folder; when it is one file and ``pred`` a folder, that file is every case's answer (DENTEX's COCO
  file) and the ids come from the predictions;
* a prediction belongs to the case whose id is its whole name without suffix, or the longest id followed by ``_``,
  ``-`` or ``.`` (``topcow_ct_001_0000.nii.gz`` and ``sub-strokecase0001_pred.nii.gz`` pair with their ids);
* the grader's further answer columns (TopCoW task 1: ``roi_path``) come as ``extras``, a folder paired the same
  way or one file for every case;
* graders whose predictions are CSV values (``ldct-iqa``) read ``truth`` and ``pred`` as CSV files of
  ``<id column>,<value column>``.

A case without a prediction and a prediction without a case make the result ``invalid_submission`` (all listed);
everything else (validation, header rules, scoring, per-case details, warnings) is exactly what grading a prepared
task does. Submission files are read where they are; nothing is copied.
"""

from __future__ import annotations

import csv
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from rexmle_grade.errors import UserInputError
from rexmle_grade.grader import ANSWERS_CSV, Grader, TestManifest, get_grader
from rexmle_grade.grading import GradeResult, grade_rows
from rexmle_grade.io import Geometry, full_suffix, write_volume
from rexmle_grade.schema import FileKind

SEPARATORS = ("_", "-", ".")


def case_stem(path: Path) -> str:
    """A file's name without its (double) suffix: the case id it stands for."""
    suffix = full_suffix(path)
    return path.name[: len(path.name) - len(suffix)] if suffix else path.name


def _listed(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def _existing(path: str | Path, what: str) -> Path:
    path = Path(path).expanduser()
    if not path.exists():
        raise UserInputError(f"{what} {str(path)!r} does not exist", hint="give a file or a folder of files")
    return path


def pair_by_id(ids: list[str], files: list[Path]) -> tuple[dict[str, list[Path]], list[Path]]:
    """({id: files of that case}, files of no case): a file belongs to the id equal to its stem, or else to the
    longest id its stem starts with followed by a separator."""
    paired: dict[str, list[Path]] = {i: [] for i in ids}
    unpaired = []
    by_length = sorted(ids, key=len, reverse=True)
    for path in files:
        stem = case_stem(path)
        owner = stem if stem in paired else next(
            (i for i in by_length if stem.startswith(i) and stem[len(i)] in SEPARATORS), None)
        if owner is None:
            unpaired.append(path)
        else:
            paired[owner].append(path)
    return paired, unpaired


def _value_rows(path: Path, grader: Grader, what: str) -> list[dict[str, str]]:
    with _existing(path, what).open(newline="", encoding="utf-8-sig") as fh:
        rows = [{k.strip(): (v or "").strip() for k, v in row.items() if k is not None} for row in csv.DictReader(fh)]
    needed = grader.schema.column_names
    if not rows or any(c not in rows[0] for c in needed):
        raise UserInputError(f"{what} {str(path)!r} needs a header with the columns {needed} and one row per case",
                             hint=f"e.g. {','.join(needed)}")
    return [{c: row[c] for c in needed} for row in rows]


def score_files(grader_id: str | Grader, truth: str | Path, pred: str | Path, *, workers: int = 1,
                progress: Callable[[int, int], None] | None = None, **extras: str | Path) -> GradeResult:
    """Score the prediction file(s) ``pred`` against the ground-truth file(s) ``truth`` (see module docstring).

    ``extras`` name the grader's further answer columns (e.g. ``roi_path=...`` for TopCoW task 1). Bad predictions
    give an ``invalid_submission`` result; a wrong call (unknown grader, missing folder, unknown extra) raises
    :class:`~rexmle_grade.errors.UserInputError`.
    """
    grader = get_grader(grader_id) if isinstance(grader_id, str) else grader_id
    schema = grader.schema
    truth_path, pred_path = _existing(truth, "ground truth"), _existing(pred, "prediction")
    first, *others = grader.answer_columns
    unknown = sorted(set(extras) - set(others))
    missing = [c for c in others if c not in extras]
    if unknown or missing:
        raise UserInputError(f"grader {grader.grader_id!r} takes the extra answer(s) {others or 'none'}; got "
                             f"{sorted(extras) or 'none'}",
                             hint=" ".join(f"--extra {c}=DIR_OR_FILE" for c in others) or "drop the --extra options")
    with tempfile.TemporaryDirectory(prefix="rexmle-files-") as scratch:
        private_dir = Path(scratch)
        if not schema.file_columns:
            # the answer column of a value grader is named as its submission column: both CSVs have one layout
            rows = _value_rows(pred_path, grader, "prediction CSV")
            answers = {r[schema.id_column]: r for r in _value_rows(truth_path, grader, "ground-truth CSV")}
            return _grade(grader, rows, answers, pred_path.parent, private_dir, workers, progress)
        (column,) = schema.file_columns
        pred_root = pred_path if pred_path.is_dir() else pred_path.parent
        predictions = _listed(pred_path) if pred_path.is_dir() else [pred_path]
        if truth_path.is_dir():
            truth_files = {case_stem(p): p for p in _listed(truth_path)}
        elif pred_path.is_dir():  # one answer file for the whole set (DENTEX's COCO file)
            truth_files = {case_stem(p): truth_path for p in predictions}
        else:
            truth_files = {case_stem(truth_path): truth_path}
        ids = sorted(truth_files)
        answers: dict[str, dict[str, str]] = {i: {schema.id_column: i, first: str(truth_files[i].resolve())}
                                              for i in ids}
        for name, value in extras.items():
            extra = _existing(value, f"extra {name}")
            files, _ = pair_by_id(ids, _listed(extra)) if extra.is_dir() else ({i: [extra] for i in ids}, [])
            for case_id in ids:
                if len(files[case_id]) != 1:
                    raise UserInputError(f"extra {name} {str(extra)!r} has {len(files[case_id])} files for case "
                                         f"{case_id!r}; one is expected")
                answers[case_id][name] = str(files[case_id][0].resolve())
        paired, unpaired = pair_by_id(ids, predictions)
        fixed = {c.name: c.choices[0] for c in schema.value_columns if c.choices and len(c.choices) == 1}
        rows = []
        for case_id, files in paired.items():
            rows += [{schema.id_column: case_id, **fixed, column.name: str(f.relative_to(pred_root))} for f in files]
        # a file of no case becomes a row of its own id, which the checks report as not a test case
        rows += [{schema.id_column: case_stem(f), **fixed, column.name: str(f.relative_to(pred_root))}
                 for f in unpaired]
        return _grade(grader, rows, answers, pred_root, private_dir, workers, progress, ids=ids)


def _grade(grader: Grader, rows: list[dict[str, str]], answers: dict[str, dict[str, str]], submission_dir: Path,
           private_dir: Path, workers: int, progress: Callable[[int, int], None] | None,
           ids: list[str] | None = None) -> GradeResult:
    # graders that read answers.csv themselves at aggregation (DENTEX) find it where a prepared task keeps it
    with (private_dir / ANSWERS_CSV).open("w", newline="") as fh:
        columns = [grader.schema.id_column, *grader.answer_columns]
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(answers.values())
    manifest = TestManifest(ids=tuple(ids if ids is not None else answers))
    if not rows:
        return GradeResult(grader_id=grader.grader_id, status="invalid_submission",
                           problems=["no prediction file was found"])
    return grade_rows(grader, rows, manifest, submission_dir, private_dir, answers, workers=workers,
                      progress=progress)


ARRAY_KINDS = (FileKind.LABEL_VOLUME, FileKind.LABEL_IMAGE, FileKind.INSTANCE_IMAGE, FileKind.GRAY_IMAGE)


def score_arrays(grader_id: str | Grader, truth: np.ndarray | Mapping[str, np.ndarray],
                 pred: np.ndarray | Mapping[str, np.ndarray], *,
                 geometry: Geometry | Mapping[str, Geometry] | None = None, **extras: str | Path) -> GradeResult:
    """Score in-memory predictions: one array each (case id ``case``) or {case id: array} mappings.

    3-D arrays are (z, y, x) with ``geometry`` (SimpleITK order; default: unit spacing, zero origin, identity
    direction), 2-D arrays (height, width). Only graders whose predictions and ground truths are label or
    grayscale images allow it; their arrays are written to a scratch folder and scored by :func:`score_files`.
    """
    grader = get_grader(grader_id) if isinstance(grader_id, str) else grader_id
    columns = grader.schema.file_columns
    if len(columns) != 1 or columns[0].kind not in ARRAY_KINDS:
        raise UserInputError(f"grader {grader.grader_id!r} scores {columns[0].kind.value if columns else 'values'} "
                             "predictions, not arrays", hint="use score_files with the prediction files")
    column = columns[0]
    truths = {"case": truth} if isinstance(truth, np.ndarray) else dict(truth)
    preds = {"case": pred} if isinstance(pred, np.ndarray) else dict(pred)
    volume = column.kind is FileKind.LABEL_VOLUME
    suffix = ".nii.gz" if volume and ".nii.gz" in column.suffixes else column.suffixes[0]
    with tempfile.TemporaryDirectory(prefix="rexmle-arrays-") as scratch:
        root = Path(scratch)
        for folder, arrays in (("truth", truths), ("pred", preds)):
            (root / folder).mkdir()
            for case_id, array in arrays.items():
                path = root / folder / f"{case_id}{suffix}"
                if volume:
                    grid = geometry.get(case_id) if isinstance(geometry, Mapping) else geometry
                    write_volume(path, np.asarray(array), grid or Geometry(size=tuple(reversed(np.shape(array)))))
                else:
                    _write_image_2d(path, np.asarray(array))
        return score_files(grader, root / "truth", root / "pred", **extras)


def _write_image_2d(path: Path, array: np.ndarray) -> None:
    if full_suffix(path) in (".tif", ".tiff"):
        import tifffile

        tifffile.imwrite(path, array)
        return
    from PIL import Image

    Image.fromarray(np.ascontiguousarray(array)).save(path)
