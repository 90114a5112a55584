"""``analyse_runs`` end to end on the example runs: what it writes, the cost budget stopping it with what it made
written, a second analysis reusing paid verdicts, and the viewer showing each factor's evidence at its node."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from rexmle_agents.analysis.examples import ExampleJudge
from rexmle_agents.analysis.pipeline import analyse_runs, load_analyses
from rexmle_agents.results.loader import load_runs


def test_a_detector_only_analysis_writes_every_output(example_group, tmp_path) -> None:
    out = tmp_path / "analysis"
    result = analyse_runs(load_runs([example_group]), out)
    manifest, analyses = load_analyses(out)
    assert manifest is not None and manifest.complete and manifest.judge is None and manifest.prompt_version is None
    assert len(analyses) == 5 and {v.source for a in analyses for v in a.verdicts} == {"detector"}
    for name in ("verdicts", "comparison", "runs", "steps", "capabilities", "failures", "disagreements"):
        assert (out / f"{name}.csv").is_file(), name
    failures = pd.read_csv(out / "failures.csv")
    assert set(failures["agent"]) == {"aide", "rdloop", "sample"}
    assert {"error:network", "error:timeout", "error:invalid_submission"} <= set(failures.columns)
    assert result.figures["capability-comparison-synthetic"] > 0
    assert (out / "figures" / "capability-comparison-synthetic.svg").read_text().count('id="mark-') == \
        result.figures["capability-comparison-synthetic"]


def test_the_cost_budget_stops_the_analysis_with_partial_results_written(example_group, make_judge, tmp_path) -> None:
    runs = load_runs([example_group])
    out = tmp_path / "analysis"
    judge = make_judge(ExampleJudge(), max_cost=0.01)
    result = analyse_runs(runs, out, judge=judge, figures=False, view=False)  # never raises: see the manifest
    manifest, analyses = load_analyses(out)
    assert manifest is not None and not manifest.complete and "money budget spent" in manifest.stopped
    assert 0.01 <= manifest.usage.cost_usd < 0.02 and manifest.usage.calls == len(judge.model.backend.requests)
    assert len(analyses) == len(runs)  # every run's file is written, detectors and failures included
    statuses = [v.status for a in analyses for v in a.verdicts if v.source == "judge"]
    judged = sum(s in ("demonstrated", "not_demonstrated", "unverified") for s in statuses)
    assert judged > 0 and statuses.count("not_run") > 0 and judged + statuses.count("not_run") + \
        statuses.count("error") == len(statuses)
    assert all(len([v for v in a.verdicts if v.source == "detector"]) == 6 for a in analyses)
    assert result.manifest == manifest
    # the same analysis with more money goes on where it stopped: paid verdicts are reused, not bought again
    again = make_judge(ExampleJudge(), max_cost=10.0)
    second = analyse_runs(runs, out, judge=again, figures=False, view=False)
    assert second.manifest.complete and second.manifest.reused_verdicts == judged
    assert len(again.model.backend.requests) < 5 * 13 + 5


def test_a_changed_prompt_or_run_is_judged_again(example_group, make_judge, tmp_path) -> None:
    runs = load_runs([example_group])
    out = tmp_path / "analysis"
    quick = {"figures": False, "view": False}
    analyse_runs(runs, out, judge=make_judge(ExampleJudge()), **quick)
    fewer = make_judge(ExampleJudge(), chunk_chars=20_000)  # other settings: nothing may be reused
    assert analyse_runs(runs, out, judge=fewer, **quick).manifest.reused_verdicts == 0
    assert analyse_runs(runs, out, judge=make_judge(ExampleJudge()), reuse=False, **quick).manifest.reused_verdicts == 0


def test_the_viewer_shows_each_factors_evidence_next_to_its_node(example_group, make_judge, tmp_path) -> None:
    out = tmp_path / "analysis"
    analyse_runs(load_runs([example_group]), out, judge=make_judge(ExampleJudge()), figures=False)
    page = (out / "view.html").read_text()
    block = re.search(r'<script type="application/json" id="rexmle-data">(.*?)</script>', page, re.DOTALL)
    assert block is not None and "<" not in block.group(1)  # run text cannot become markup
    data = json.loads(block.group(1))
    rich = next(r for r in data["runs"].values() if r["task"] == "ldct-iqa" and r["seed"] == 1)
    caps = rich["capabilities"]
    assert caps["judge"] == "scripted/judge" and len(caps["factors"]) == 13
    augmentation = next(f for f in caps["factors"] if f["factor"] == "data_augmentation")
    assert augmentation["judge"] == augmentation["detector"] == "demonstrated" and augmentation["nodes"] == [0]
    quoted = caps["evidence"]["0"]
    assert any(q["quote"] == "image = np.fliplr(image)" and q["verified"] and q["where"] == "code" for q in quoted)
    rejected = [q for q in caps["evidence"]["1"] if not q["verified"]]
    assert rejected and rejected[0]["factor"] == "Seed and fold ensembles" and rejected[0]["problem"]


def test_the_evidence_in_chromium(example_group, example_runs, make_judge, tmp_path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (bash tools/setup.sh "
                                                                 "--dev installs it)")
    chromium = os.environ.get("REXMLE_CHROMIUM", "/usr/bin/chromium")
    if not Path(chromium).is_file():
        pytest.skip(f"{chromium} is missing: apt-get install -y chromium (bash tools/setup.sh --dev does it as root)")
    out = tmp_path / "analysis"
    analyse_runs(load_runs([example_group]), out, judge=make_judge(ExampleJudge()), figures=False)
    rich = example_runs["ldct-rich"].run_id
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{(out / 'view.html').as_uri()}#run={rich}")
        assert page.locator("h2", has_text="success factors").count() == 1
        page.locator("a.run", has_text="0").first.click()  # a node named in the factor table shows its quotes
        items = page.locator("ul.evidence li")
        assert items.count() >= 2 and "image = np.fliplr(image)" in page.locator("ul.evidence").inner_text()
        page.locator('svg .node[data-node="1"]').click()
        assert page.locator("ul.evidence li.unverified").count() == 1  # the paraphrase, marked as not found
        browser.close()
    assert errors == []
