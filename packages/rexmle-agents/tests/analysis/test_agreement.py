"""Agreement with human raters: the label file format (and its errors), Cohen's kappa, and the report on the
shipped labelled examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from rexmle_agents.analysis.agreement import agreement_report, cohen_kappa, read_labels
from rexmle_agents.analysis.examples import ExampleJudge, example_labels
from rexmle_agents.analysis.factors import load_rubrics
from rexmle_agents.analysis.pipeline import analyse_runs
from rexmle_agents.results.loader import load_runs
from rexmle_grade.errors import UserInputError

IDS = load_rubrics().ids
HEADER = "rater,run,factor,demonstrated,node,quote,note\n"


def test_cohen_kappa() -> None:
    assert cohen_kappa([True, True, False, False], [True, False, False, False]) == pytest.approx(0.5)
    assert cohen_kappa([True, False] * 5, [True, False] * 5) == pytest.approx(1.0)
    assert cohen_kappa([True, False, True, False], [False, True, False, True]) == pytest.approx(-1.0)
    assert cohen_kappa([False] * 4, [False] * 4) is None  # no variation: undefined, not 1
    assert cohen_kappa([], []) is None


@pytest.mark.parametrize(("row", "message"), [
    ("ana,r1,no_such_factor,yes,,,", "unknown factor"),
    ("ana,r1,post_processing,perhaps,,,", "demonstrated must be yes or no"),
    ("judge,r1,post_processing,yes,,,", "rater 'judge' is not allowed"),
    ("ana,r1,post_processing,yes,four,,", "node must be a node number"),
])
def test_bad_label_files_say_what_and_where(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "labels.csv"
    path.write_text(HEADER + row + "\n")
    with pytest.raises(UserInputError) as error:
        read_labels([path], IDS)
    assert message in error.value.message
    if "factor" not in message:
        assert f"{path}:2" in error.value.message


def test_a_label_twice_and_a_missing_column_are_refused(tmp_path: Path) -> None:
    twice = tmp_path / "twice.csv"
    twice.write_text(HEADER + "ana,r1,post_processing,yes,,,\nana,r1,post_processing,no,,,\n")
    with pytest.raises(UserInputError, match="twice"):
        read_labels([twice], IDS)
    missing = tmp_path / "missing.csv"
    missing.write_text("rater,run,factor\nana,r1,post_processing\n")
    with pytest.raises(UserInputError, match="demonstrated"):
        read_labels([missing], IDS)


def test_agreement_on_the_labelled_examples(example_group, make_judge, tmp_path: Path) -> None:
    result = analyse_runs(load_runs([example_group]), tmp_path / "a", judge=make_judge(ExampleJudge()),
                          figures=False, view=False)
    labels = read_labels([example_labels(tmp_path / "labels.csv")], IDS)
    extra = tmp_path / "extra.csv"
    extra.write_text(HEADER + "carl,isles22.aide,post_processing,yes,,,\ncarl,nowhere,post_processing,no,,,\n")
    report = agreement_report(result.analyses, labels + read_labels([extra], IDS), IDS, result.manifest,
                              replicates=200)
    assert report.raters == ["judge", "detectors", "carl", "dev-a", "dev-b"]
    assert report.items["judge"] == 65 and report.items["detectors"] == 30 and report.items["dev-a"] == 65
    assert report.unmatched == ["carl: nowhere (post_processing)"]  # a unique run-id start is enough
    rows = {(r.factor, r.rater_a, r.rater_b): r for r in report.rows}
    overall = rows[("all", "judge", "dev-a")]
    assert overall.n == 65 and overall.kappa is not None and 0.5 < overall.kappa < 1.0
    assert overall.ci_low is not None and overall.ci_low <= overall.kappa <= overall.ci_high
    assert rows[("state_of_the_art", "dev-a", "dev-b")].kappa is None  # everyone said no: undefined
    assert rows[("state_of_the_art", "dev-a", "dev-b")].agreement == 1.0
    # the example judge counts a failed download as external data; both people do not: listed with the evidence
    wrong = [d for d in report.disagreements if d.factor == "external_data" and d.rater_b == "dev-a"]
    assert len(wrong) == 1 and wrong[0].a is True and "urlretrieve" in wrong[0].evidence_a
    assert ("fast_iteration", "dev-a", "dev-b") in rows and rows[("fast_iteration", "dev-a", "dev-b")].agreement < 1
