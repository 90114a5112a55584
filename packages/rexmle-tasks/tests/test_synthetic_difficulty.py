"""``--difficulty easy|realistic`` of the synthetic mirrors, and the validation metric every description names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from rexmle_grade.errors import UserInputError
from rexmle_tasks.pipeline import check_difficulty, prepare_task, requested_source, task_dirs
from rexmle_tasks.registry import all_tasks, get_task


def test_a_realistic_mirror_is_prepared_recorded_and_kept_apart_from_the_easy_one(tmp_path: Path) -> None:
    task = get_task("ldct-iqa")
    dirs = task_dirs(task, tmp_path)
    info = prepare_task(task, dirs, synthetic=True, cases=8, seed=1, difficulty="realistic")
    assert info.difficulty == "realistic" and info.source["difficulty"] == "realistic"
    assert json.loads((dirs.root / "prepared.json").read_text())["difficulty"] == "realistic"
    assert json.loads((dirs.raw / ".rexmle-source.json").read_text())["difficulty"] == "realistic"
    with pytest.raises(UserInputError, match="realistic"):
        prepare_task(task, dirs, synthetic=True, cases=8, seed=1)  # the easy mirror was asked for: not the same
    easy = prepare_task(task, dirs, synthetic=True, cases=8, seed=1, force=True)
    assert easy.difficulty is None and "difficulty" not in json.loads((dirs.root / "prepared.json").read_text())


def test_the_easy_source_record_is_what_it_was_before_difficulties() -> None:
    task = get_task("ldct-iqa")
    assert requested_source(task, synthetic=True, cases=None, seed=0) == {"synthetic": True, "cases": 12, "seed": 0}


@pytest.fixture
def easy_only_family(monkeypatch: pytest.MonkeyPatch) -> str:
    """RAVIR's family standing in for a plug-in family whose mirror has only the easy difficulty."""
    monkeypatch.setattr(type(get_task("ravir").family()), "synthetic_difficulties", ("easy",))
    return "ravir"


def test_every_built_in_family_has_a_realistic_mirror() -> None:
    for task in all_tasks().values():
        assert "realistic" in task.family().synthetic_difficulties, task.id


def test_the_realistic_mirror_has_its_own_default_size() -> None:
    task = get_task("ldct-iqa")
    assert requested_source(task, synthetic=True, cases=None, seed=0, difficulty="realistic")["cases"] == 120
    assert requested_source(task, synthetic=True, cases=None, seed=0)["cases"] == 12
    assert requested_source(task, synthetic=True, cases=30, seed=0, difficulty="realistic")["cases"] == 30


def test_a_difficulty_needs_synthetic_data_and_a_family_that_has_it(easy_only_family: str) -> None:
    with pytest.raises(UserInputError, match="unknown synthetic difficulty"):
        check_difficulty(get_task("ldct-iqa"), "hard", synthetic=True)
    with pytest.raises(UserInputError, match="synthetic data only"):
        check_difficulty(get_task("isles22"), "realistic", synthetic=False)
    with pytest.raises(UserInputError, match="has no 'realistic' difficulty"):
        check_difficulty(get_task(easy_only_family), "realistic", synthetic=True)
    check_difficulty(get_task("isles22"), "realistic", synthetic=True)


def correlation_of_the_image_std(make: object, n: int = 80) -> float:
    rng = np.random.default_rng(5)
    pairs = [make(rng) for _ in range(n)]  # type: ignore[operator]
    return abs(stats.spearmanr([image.std() for image, _ in pairs], [score for _, score in pairs])[0])


def test_on_realistic_ldct_an_image_statistic_no_longer_ranks_the_slices() -> None:
    from rexmle_tasks.families.ldct import realistic_slice, synthetic_slice

    assert correlation_of_the_image_std(synthetic_slice) > 0.85
    assert correlation_of_the_image_std(realistic_slice) < 0.45


def best_global_threshold_dice(make: object, n: int = 6) -> float:
    rng = np.random.default_rng(2)
    cases = [make(rng) for _ in range(n)]  # type: ignore[operator]
    dwi = [c["dwi"][0].astype(float) for c in cases]
    masks = [c["mask"][0] > 0 for c in cases]

    def dice(threshold: float) -> float:
        return float(np.mean([2 * (d > threshold)[m].sum() / ((d > threshold).sum() + m.sum())
                              for d, m in zip(dwi, masks, strict=True)]))

    return max(dice(t) for t in np.linspace(50, 800, 31))


def test_on_realistic_isles_thresholding_dwi_is_far_from_the_reference() -> None:
    from rexmle_tasks.families.isles import _realistic_stroke_case, _stroke_case

    assert best_global_threshold_dice(_stroke_case) > 0.95
    assert best_global_threshold_dice(_realistic_stroke_case) < 0.5


def test_a_realistic_isles_case_has_the_confounders() -> None:
    from rexmle_tasks.families.isles import _realistic_stroke_case

    rng = np.random.default_rng(0)
    cases = [_realistic_stroke_case(rng) for _ in range(4)]
    scales = [np.median(c["dwi"][0][c["dwi"][0] > 0]) for c in cases]
    assert max(scales) / min(scales) > 1.3  # scanners differ in the unnormalised DWI scale
    for case in cases:
        dwi, mask = case["dwi"][0].astype(float), case["mask"][0] > 0
        assert mask.any() and mask.shape == dwi.shape
        assert mask.mean() < 0.02  # class imbalance: lesions are a small part of the brain


def test_every_grader_names_a_ranked_validation_metric_and_every_description_says_it() -> None:
    from rexmle_tasks.description import validation_metric_text

    for task in all_tasks().values():
        metric = task.grader.validation_metric
        assert metric.ranked, task.id
        assert f"`{metric.name}`" in validation_metric_text(task.grader)
    assert get_task("seg_a").grader.validation_metric.name == "dsc_50pc"
    assert "The leaderboard also ranks by `lesion_f1`" in validation_metric_text(get_task("isles22").grader)


def test_the_prepared_description_names_the_validation_metric(tmp_path: Path) -> None:
    task = get_task("ldct-iqa")
    dirs = task_dirs(task, tmp_path)
    prepare_task(task, dirs, synthetic=True, cases=6, seed=0)
    text = (dirs.public / "description.md").read_text()
    assert "## Validation metric\n\nMeasure `score` (higher is better" in text


def test_the_prepare_command_takes_a_difficulty(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               easy_only_family: str) -> None:
    from rexmle_grade.cli import main

    code = main(["--data-dir", str(tmp_path), "prepare", "ldct-iqa", "--difficulty", "realistic"])
    assert code == 2 and "synthetic data only" in capsys.readouterr().err
    code = main(["--data-dir", str(tmp_path), "prepare", "ldct-iqa", "--synthetic", "--cases", "6",
                 "--difficulty", "realistic"])
    assert code == 0 and "realistic" in capsys.readouterr().out
    code = main(["--data-dir", str(tmp_path), "prepare", easy_only_family, "--synthetic", "--difficulty", "realistic"])
    assert code == 2 and "has no 'realistic' difficulty" in capsys.readouterr().err
