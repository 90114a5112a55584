"""The shipped labelled example runs: still readable in the current run format, labels whose evidence is in the
runs, and the same verdicts when the scripted agents make the runs again through the real harness."""

from __future__ import annotations

import csv
import os
import shutil
from importlib import resources
from pathlib import Path

import pytest

from rexmle_agents.analysis.detectors import detect
from rexmle_agents.analysis.evidence import run_text, task_brief
from rexmle_agents.analysis.examples import EXAMPLES, LABELS_FILE, make_example_runs
from rexmle_agents.analysis.factors import ASSETS, load_rubrics
from rexmle_agents.analysis.failures import run_failures
from rexmle_agents.results.loader import load_runs

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("CI"),
                                 reason="bubblewrap is not installed (apt-get install -y bubblewrap)")


def shipped_labels() -> list[dict[str, str]]:
    with resources.files(ASSETS).joinpath(LABELS_FILE).open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_the_example_runs_match_the_current_run_format(example_group) -> None:
    runs = load_runs([example_group])
    assert len(runs) == len(EXAMPLES) and not runs.refused
    for run in runs.runs:
        run.journal()
        assert run.problems == [], run.run_id
        assert run.grade is not None and run.synthetic is True


def test_every_run_and_factor_is_labelled_by_both_raters_with_evidence_in_the_run(example_runs) -> None:
    labels = shipped_labels()
    runs = {run.run_id: run for run in example_runs.values()}
    ids = load_rubrics().ids
    for rater in ("dev-a", "dev-b"):
        assert {(row["run"], row["factor"]) for row in labels if row["rater"] == rater} == \
            {(run_id, factor) for run_id in runs for factor in ids}
    texts = {run_id: run_text(run) for run_id, run in runs.items()}
    for row in labels:
        if row["demonstrated"] == "yes":
            quote = texts[row["run"]].verify(int(row["node"]), row["quote"])
            assert quote.verified, (row, quote.problem)


def _fingerprint(run) -> dict[str, object]:
    text = run_text(run)
    verdicts = detect(text, task_brief(run.spec.task_id).modality, load_rubrics().label)
    return {"nodes": [n.id for n in text.nodes],
            "detected": sorted(v.factor for v in verdicts if v.demonstrated),
            "outcomes": [(o.outcome, o.error_type) for o in run_failures(run).outcomes]}


@needs_bwrap
def test_a_fresh_run_of_an_example_gives_the_shipped_verdicts(example_runs, tmp_path: Path) -> None:
    made = make_example_runs(tmp_path / "runs", tmp_path / "data", names=["ldct-rich"])
    fresh = load_runs(made).runs[0]
    assert fresh.run_id == example_runs["ldct-rich"].run_id
    assert _fingerprint(fresh) == _fingerprint(example_runs["ldct-rich"])


@pytest.mark.slow
@needs_bwrap
def test_every_example_made_again_gives_the_shipped_verdicts(example_runs, tmp_path: Path) -> None:
    made = {run.run_id: run for run in load_runs(make_example_runs(tmp_path / "runs", tmp_path / "data")).runs}
    for name, shipped in example_runs.items():
        assert _fingerprint(made[shipped.run_id]) == _fingerprint(shipped), name
