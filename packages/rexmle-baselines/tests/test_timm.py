"""The timm baselines: ``timm-regress`` on LDCT-IQA and ``timm-cls`` on TopCoW task 3, quick runs on synthetic tasks
that must validate, grade and beat the sample submission; divergence and bad weights paths stop with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from rexmle_baselines.api import run_baseline
from rexmle_baselines.base import TrainingDivergedError
from rexmle_grade.errors import UserInputError

pytest.importorskip("timm")


def test_timm_regress_quick_scores_ldct_slices_better_than_the_constant_sample(prepared, tmp_path: Path) -> None:
    public = prepared.public("ldct-iqa", cases=24)
    run = run_baseline("timm-regress", "ldct-iqa", public_dir=public, out=tmp_path / "sub", work_dir=tmp_path / "w")
    assert run.valid, run.problems
    metrics = prepared.beats_sample("ldct-iqa", run.submission_dir)
    assert metrics["score"] > 1.5  # noise level is learnable: |PLCC| + |SROCC| + |KROCC| well above chance


@pytest.mark.slow
@pytest.mark.parametrize("task_id", ["topcow-track1-task3", "topcow-track2-task3"])
def test_timm_cls_quick_classifies_topcow_variants_better_than_the_sample(task_id: str, prepared,
                                                                         tmp_path: Path) -> None:
    public = prepared.public(task_id, cases=24)
    run = run_baseline("timm-cls", task_id, public_dir=public, out=tmp_path / "sub", work_dir=tmp_path / "w")
    assert run.valid, run.problems
    prepared.beats_sample(task_id, run.submission_dir)


def test_a_huge_learning_rate_stops_with_the_epoch_and_last_finite_loss(prepared, tmp_path: Path) -> None:
    public = prepared.public("ldct-iqa", cases=24)
    with pytest.raises(TrainingDivergedError, match=r"at epoch \d+") as caught:
        run_baseline("timm-regress", "ldct-iqa", public_dir=public, work_dir=tmp_path / "w",
                     overrides={"lr": 1e30, "epochs": 4})
    assert caught.value.epoch >= 1


def test_a_missing_local_weights_file_is_refused_without_download(prepared, tmp_path: Path) -> None:
    public = prepared.public("ldct-iqa", cases=24)
    with pytest.raises(UserInputError, match="do not exist"):
        run_baseline("timm-regress", "ldct-iqa", public_dir=public, work_dir=tmp_path / "w",
                     overrides={"pretrained": str(tmp_path / "absent.safetensors")})
