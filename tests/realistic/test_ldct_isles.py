"""The two realistic mirrors that came first (LDCT-IQA and ISLES'22) on the difficulty ladder of issue 36: the
sample submission below the heuristic (a robust noise level and a line; one DWI threshold over the brain median),
the heuristic clearly below the quick trained baseline (timm-regress; monai-seg). Their generators' own tests:
packages/rexmle-tasks/tests/test_synthetic_difficulty.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from rexmle_baselines.ladder import measure_ladder


@pytest.mark.parametrize(("task_id", "margin"), [("ldct-iqa", 0.2), ("isles22", 0.05)])
def test_the_heuristic_is_above_the_sample(task_id: str, margin: float, tmp_path: Path) -> None:
    ladder = measure_ladder(task_id, tmp_path, secret="ladder", rungs=("sample", "heuristic"))
    assert ladder.ordered(margin), ladder.rungs


# margins: LDCT's score is the sum of three correlations (0-3): the heuristic measured 0.3-1.5 over secrets and
# the trained rung 2.4-2.7; ISLES's Dice: the heuristic 0.18-0.55, monai-seg quick 0.60-0.75
@pytest.mark.slow
@pytest.mark.parametrize(("task_id", "margin"), [("ldct-iqa", 0.5), ("isles22", 0.05)])
def test_the_ladder_holds_with_the_trained_baseline(task_id: str, margin: float, tmp_path: Path) -> None:
    ladder = measure_ladder(task_id, tmp_path, secret="ladder", work_root=tmp_path / "work")
    assert len(ladder.rungs) == 3 and ladder.ordered(margin), ladder.rungs
