"""Prediction headers follow the official evaluations: ignored (TopCoW, TopBrain: accepted with a warning, scored on
the ground truth's grid), checked (PANTHER's spacing), used (ISLES'22: every difference rejected); and the vessel
graders verify the private label files they read."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from rexmle_grade.files import score_files
from rexmle_grade.grader import HeaderUse, TestManifest, get_grader, grader_ids, write_submission_csv
from rexmle_grade.grading import grade_submission
from rexmle_grade.io import Geometry, write_volume
from rexmle_grade.validation import validate_submission

IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)
SHAPE = (6, 9, 10)  # (z, y, x)
GRID = Geometry(size=tuple(reversed(SHAPE)), spacing=(0.5, 0.5, 0.8), origin=(10.0, -4.0, 2.0), direction=IDENTITY)
OTHER_SPACING_AND_ORIGIN = Geometry(size=GRID.size, spacing=(1.0, 1.0, 1.0), origin=(0.0, 0.0, 0.0),
                                    direction=IDENTITY)
ROI = "--- ROI Meta Data ---\nSize (Voxels): 8 7 5\nLocation (Voxels): 1 1 0\n"
CASE = "topcow_ct_001"


def vessel_label() -> np.ndarray:
    label = np.zeros(SHAPE, np.uint8)
    label[1:5, 4, 1:9] = 1  # a basilar-like rod
    label[2, 1:8, 5] = 4
    label[3, 6, 2:5] = 8
    return label


def vessel_prediction() -> np.ndarray:
    pred = vessel_label()
    pred[1, 4, 1:3] = 0  # imperfect, so that the metrics are not trivially the best values
    pred[4, 2, 2] = 4
    return pred


def make_task(tmp_path: Path, grader_id: str, label: np.ndarray, *, answer_suffix: str = ".nii.gz",
              case: str = CASE) -> tuple[Path, Path]:
    """A prepared task of one case (public manifest with the test image's grid, private answers)."""
    grader = get_grader(grader_id)
    public, private = tmp_path / "public", tmp_path / "private"
    public.mkdir(parents=True)
    TestManifest(ids=(case,), geometry={case: GRID}).write(public)
    write_volume(private / "labels" / f"{case}{answer_suffix}", label, GRID)
    answers = {"label_path": f"labels/{case}{answer_suffix}", "roi_path": "rois/roi.txt"}
    (private / "rois").mkdir()
    (private / "rois" / "roi.txt").write_text(ROI)
    columns = [grader.schema.id_column, *grader.answer_columns]
    (private / "answers.csv").write_text(",".join(columns) + "\n" + ",".join(
        [case, *(answers[c] for c in grader.answer_columns)]) + "\n")
    return public, private


def submit(tmp_path: Path, grader_id: str, pred: np.ndarray, geometry: Geometry, name: str,
           case: str = CASE) -> Path:
    grader = get_grader(grader_id)
    row = grader.schema.example_row(case)
    dest = tmp_path / name
    write_submission_csv(dest, grader.schema, [row])
    write_volume(dest / row["predicted_mask_path"], pred, geometry)
    return dest


@pytest.mark.parametrize("grader_id", ["topcow-track1-task1", "topbrain-track1"])
def test_ignored_header_scores_like_the_ground_truth_grid_with_a_warning(grader_id: str, tmp_path: Path) -> None:
    public, private = make_task(tmp_path, grader_id, vessel_label())
    same = submit(tmp_path, grader_id, vessel_prediction(), GRID, "same_header")
    other = submit(tmp_path, grader_id, vessel_prediction(), OTHER_SPACING_AND_ORIGIN, "other_header")
    grader = get_grader(grader_id)
    reference = grade_submission(grader, same, public, private)
    assert reference.status == "valid" and not reference.warnings, reference
    assert reference.metrics["dice"] < 1.0
    report = validate_submission(grader, other, public)
    assert report.ok, report.problems
    result = grade_submission(grader, other, public, private)
    assert result.status == "valid", result.problems or result.error
    assert result.metrics == reference.metrics  # distances use the ground truth's spacing, not the prediction's
    for warnings in (report.warnings, result.warnings):
        assert len(warnings) == 2, warnings
        assert any("spacing [1.0, 1.0, 1.0]" in w for w in warnings) and any("origin" in w for w in warnings)
        assert all(CASE in w and "ground truth's grid" in w for w in warnings)


@pytest.mark.parametrize("grader_id", ["topcow-track1-task1", "topbrain-track1"])
def test_a_prediction_of_another_size_is_still_rejected(grader_id: str, tmp_path: Path) -> None:
    public, private = make_task(tmp_path, grader_id, vessel_label())
    bigger = Geometry(size=(11, 9, 6), spacing=GRID.spacing, origin=GRID.origin, direction=IDENTITY)
    bad = submit(tmp_path, grader_id, np.zeros((6, 9, 11), np.uint8), bigger, "bigger")
    result = grade_submission(get_grader(grader_id), bad, public, private)
    assert result.status == "invalid_submission" and any("size" in p for p in result.problems), result.problems


@pytest.mark.parametrize("field_name", ["spacing", "origin", "direction"])
def test_isles22_still_rejects_every_header_difference(field_name: str, tmp_path: Path) -> None:
    lesion = np.zeros(SHAPE, np.uint8)
    lesion[2:4, 3:6, 3:6] = 1
    public, private = make_task(tmp_path, "isles22", lesion, case="sub-strokecase0001")
    changed = {"spacing": (0.25, 0.25, 0.4), "origin": (0.0, 0.0, 0.0),
               "direction": (0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0)}[field_name]
    forged = Geometry(**{**GRID.__dict__, field_name: changed})
    bad = submit(tmp_path, "isles22", lesion, forged, "forged", case="sub-strokecase0001")
    grader = get_grader("isles22")
    assert grader.header_rule.official is HeaderUse.USES
    report = validate_submission(grader, bad, public)
    assert not report.ok and any(field_name in p for p in report.problems), report.problems
    result = grade_submission(grader, bad, public, private)
    assert result.status == "invalid_submission" and any(field_name in p for p in result.problems)
    # the same holds when files are scored directly, without a test manifest
    files = score_files(grader, private / "labels", bad / "predictions")
    assert files.status == "invalid_submission" and any(field_name in p for p in files.problems), files


def test_panther_checks_the_spacing_and_ignores_origin_and_direction(tmp_path: Path) -> None:
    tumour = np.zeros(SHAPE, np.uint8)
    tumour[2:4, 3:6, 3:6] = 1
    public, private = make_task(tmp_path, "panther-task1", tumour, answer_suffix=".mha", case="10000_0001")
    grader = get_grader("panther-task1")
    gold = grade_submission(grader, submit(tmp_path, "panther-task1", tumour, GRID, "gold", "10000_0001"), public,
                            private)
    moved = Geometry(size=GRID.size, spacing=GRID.spacing, origin=(0.0, 0.0, 0.0), direction=IDENTITY)
    result = grade_submission(grader, submit(tmp_path, "panther-task1", tumour, moved, "moved", "10000_0001"),
                              public, private)
    assert result.status == "valid" and result.metrics == gold.metrics
    assert len(result.warnings) == 1 and "origin" in result.warnings[0]
    rescaled = Geometry(size=GRID.size, spacing=(0.6, 0.5, 0.8), origin=GRID.origin, direction=IDENTITY)
    bad = grade_submission(grader, submit(tmp_path, "panther-task1", tumour, rescaled, "rescaled", "10000_0001"),
                           public, private)
    assert bad.status == "invalid_submission" and any("spacing" in p for p in bad.problems), bad.problems


def test_every_grader_documents_its_header_rule() -> None:
    for grader_id in grader_ids():
        grader = get_grader(grader_id)
        assert grader.header_rule.convention in grader.conventions, grader_id
        assert sum("Prediction headers" in c for c in grader.conventions) == 1, grader_id
    volume_rules = {g: get_grader(g).header_rule.official for g in grader_ids()
                    if any(c.kind.value == "label_volume" for c in get_grader(g).schema.file_columns)}
    assert volume_rules == {"isles22": HeaderUse.USES, "panther-task1": HeaderUse.CHECKS,
                            "panther-task2": HeaderUse.CHECKS, "seg_a": HeaderUse.NOT_PUBLIC,
                            "topbrain-track1": HeaderUse.IGNORES, "topbrain-track2": HeaderUse.IGNORES,
                            "topcow-track1-task1": HeaderUse.IGNORES, "topcow-track2-task1": HeaderUse.IGNORES}


def truncate_gzip_payload(path: Path) -> None:
    """Rewrite a .nii.gz as a valid gzip stream holding only the first half of its NIfTI bytes (header intact)."""
    with gzip.open(path) as fh:
        data = fh.read()
    path.write_bytes(gzip.compress(data[: 352 + (len(data) - 352) // 2]))


@pytest.mark.parametrize("grader_id", ["topbrain-track1", "topcow-track1-task1"])
def test_truncated_private_label_is_a_grader_error(grader_id: str, tmp_path: Path) -> None:
    public, private = make_task(tmp_path, grader_id, vessel_label())
    submission = submit(tmp_path, grader_id, vessel_prediction(), GRID, "submission")
    truncate_gzip_payload(private / "labels" / f"{CASE}.nii.gz")
    result = grade_submission(get_grader(grader_id), submission, public, private)
    assert result.status == "grader_error", (result.status, result.metrics)
    assert "truncated" in (result.error or "") and CASE in (result.error or "")


def test_cli_validate_and_run_show_the_header_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from rexmle_grade import cli, targets
    from rexmle_grade.report import GradingReport
    from rexmle_grade.targets import GradingTarget

    public, private = make_task(tmp_path, "topbrain-track1", vessel_label())
    other = submit(tmp_path, "topbrain-track1", vessel_prediction(), OTHER_SPACING_AND_ORIGIN, "other_header")
    target = GradingTarget(task_id="topbrain-track1", task_version="1", grader_id="topbrain-track1",
                           public_dir=public, private_dir=private, leaderboard=None)
    monkeypatch.setattr(targets, "resolve_target", lambda task_id, root=None: target)
    assert cli.main(["grade", "validate", "topbrain-track1", str(other)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "valid" in printed and "warning:" in printed and "origin [0.0, 0.0, 0.0]" in printed
    out = tmp_path / "report.json"
    assert cli.main(["grade", "run", "topbrain-track1", str(other), "-o", str(out)]) == 0
    entry = GradingReport.read(out).entries[0]
    assert entry.status == "valid" and len(entry.warnings) == 2
    assert "topbrain-track1 warnings:" in capsys.readouterr().out
