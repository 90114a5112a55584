"""The normalised score's 1 is a pinned expert (one named baseline, config and budget, the mean over all its
calibration seeds), stated in the report; task versions never share a row; known issues are shown to users (``tasks
info``, reports) and never to agents (public/, checked by ``rexmle tasks check``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rexmle_agents.harness.runner import build_spec, execute_run
from rexmle_agents.results.loader import load_runs, task_facts
from rexmle_agents.results.report import build_group_report, default_pins, to_markdown
from rexmle_agents.results.rows import RunRow
from rexmle_agents.results.stats import (
    Calibrated,
    ExpertPin,
    aggregate,
    calibration_rows,
    expert_bounds,
    pad_grid,
    reference_percentiles,
)
from rexmle_baselines.calibration import CalibrationResult
from rexmle_grade.cli import main

from .conftest import TASK, needs_bwrap

BASE: dict[str, Any] = dict(
    run_id="r", group="g", run_dir="", data="real", variant="real", synthetic=False, task_version="1.0.0",
    competition="", task_type="", dim="", agent="aide", agent_version="1", model="m", config="-", agent_config="{}",
    budget="1h", seed=0, state="finished", reason="", limit=None, graded=True, grade_status="valid", valid=True,
    percentile=0.5, percentile_counted=0.5, mean_position=3.0, position_counted=3.0, board_rows=10, gold=False,
    silver=False, bronze=False, any_medal=False, above_median=False, time_budget_s=3600.0, time_used_s=100.0,
    exec_timeout_s=600.0, steps=3, max_steps=None, model_calls=5, tokens=1000, input_tokens=800, output_tokens=200,
    cost_usd=0.5, uncosted_calls=0, max_tokens=None, max_cost_usd=None, sandbox="bwrap", network="none",
    heldout_reachable="no", selection_k=0, gpus=1, gpu_names="", cpus=8, cpu_model="", memory_gb=32.0, host="h",
    rexmle_versions="", grader_id="", leaderboard_version=None, started_at=None,
    finished_at="2026-01-01T00:00:00+00:00", problems=0)


def frame(*cells: dict[str, Any]) -> pd.DataFrame:
    out = []
    for n, cell in enumerate(cells):
        facts = task_facts(cell.get("task_id", "isles22"))
        values = {**BASE, "run_id": f"r{n}", "task_id": facts.task_id, "competition": facts.competition,
                  "task_type": facts.task_type, "dim": facts.dim, "board_rows": facts.board_rows, **cell}
        values["percentile"] = values["percentile_counted"]
        out.append(RunRow(**values).model_dump())
    return pd.DataFrame(out)


def record(seed: int, percentile: float, *, task: str = "isles22", baseline: str = "nnunet", config: str = "full",
           budget: float | None = None, synthetic: bool = False, version: str = "1.0.0") -> CalibrationResult:
    return CalibrationResult(task_id=task, task_version=version, baseline=baseline, config=config, params={},
                             seed=seed, device="cuda", versions={}, hardware={}, seconds=60.0, valid=True,
                             metrics={}, percentile=percentile, synthetic=synthetic,
                             recorded_at=f"2026-12-0{seed + 1}T00:00:00+00:00", time_budget_s=budget)


PIN = ExpertPin(task_id="isles22", baseline="nnunet", config="full")
# the pinned expert's three seeds (mean 0.8), and records that scored higher but are not the pin: another config,
# another budget, another baseline
CALIBRATION = [record(0, 0.6), record(1, 0.8), record(2, 1.0), record(0, 1.0, config="budget"),
               record(0, 1.0, budget=600.0), record(0, 1.0, baseline="monai-seg")]


def table(runs: pd.DataFrame, references: Any) -> list:
    facts = {t: task_facts(t) for t in runs["task_id"].unique()}
    padded, _ = pad_grid(runs, ("agent",), facts)
    return aggregate(padded, ("agent",), competition={t: f.competition for t, f in facts.items()},
                     references=references, replicates=0)


def test_the_normalised_score_is_against_the_pinned_experts_seed_mean_by_hand() -> None:
    runs = frame(*({"agent": "sample", "seed": s, "percentile_counted": p} for s, p in ((0, 0.1), (1, 0.2), (2, 0.3))),
                 *({"agent": "aide", "seed": s, "percentile_counted": p} for s, p in ((0, 0.4), (1, 0.5), (2, 0.6))))
    [bound] = expert_bounds(CALIBRATION, {"isles22": PIN})
    assert bound.seeds == [0, 1, 2] and bound.mean_percentile == pytest.approx(0.8)  # every seed, not the best
    padded, _ = pad_grid(runs, ("agent",), {"isles22": task_facts("isles22")})
    references = reference_percentiles(padded, [bound])
    assert references == {("real", "isles22", "1.0.0"): (pytest.approx(0.2), pytest.approx(0.8))}
    rows = {r.keys["agent"]: r for r in table(runs, references) if r.scope == "all"}
    # (0.5 - 0.2) / (0.8 - 0.2); the best single record of any config (1.0) would have given 0.375
    assert rows["aide"].normalised == pytest.approx(0.5)
    assert rows["sample"].normalised == pytest.approx(0.0)
    assert "nnunet/full (config budget) pin v1" in bound.describe() and "over 3 seed(s)" in bound.describe()


def test_a_bound_on_another_task_version_is_not_used_and_few_seeds_are_stated() -> None:
    runs = frame({"agent": "sample", "percentile_counted": 0.2}, {"agent": "aide", "percentile_counted": 0.5})
    bounds = expert_bounds([record(0, 0.9, version="0.9.0")], {"isles22": PIN})
    assert [b.task_version for b in bounds] == ["0.9.0"]
    padded, _ = pad_grid(runs, ("agent",), {"isles22": task_facts("isles22")})
    assert reference_percentiles(padded, bounds) == {}
    assert {r.normalised for r in table(runs, {}) if r.scope == "all"} == {None}
    assert "only 1 seed(s), fewer than 3: not enough for a claim" in bounds[0].describe()


def test_three_calibration_seeds_are_all_counted_in_their_row() -> None:
    rows = calibration_rows(CALIBRATION, {"isles22": task_facts("isles22")})
    pinned = [r for r in rows if r.keys["agent"] == "baseline:nnunet" and r.keys["config"] == "config=full"
              and r.keys["budget"] == "-"]
    assert len(pinned) == 1 and pinned[0].n_runs == 3 and pinned[0].n_seeds == 3
    assert pinned[0].mean_percentile == pytest.approx(0.8)
    # a record with another budget is its own row, never pooled with the pin's seeds
    assert any(r.keys["budget"] == "600s" and r.n_runs == 1 for r in rows)


def test_two_runs_of_one_task_at_different_versions_never_share_a_row() -> None:
    runs = frame({"agent": "aide", "seed": 0, "task_version": "1.0.0", "percentile_counted": 0.4},
                 {"agent": "aide", "seed": 0, "task_version": "1.1.0", "percentile_counted": 0.8},
                 {"agent": "aide", "seed": 0, "task_id": "ldct-iqa", "percentile_counted": 0.6})
    rows = [r for r in table(runs, {}) if r.scope == "all"]
    by_split = {r.task_versions: r for r in rows}
    assert set(by_split) == {"isles22 1.0.0", "isles22 1.1.0", ""}
    assert by_split["isles22 1.0.0"].mean_percentile == pytest.approx(0.4)
    assert by_split["isles22 1.1.0"].mean_percentile == pytest.approx(0.8)
    assert by_split[""].mean_percentile == pytest.approx(0.6) and by_split[""].n_tasks == 1  # no padded isles22
    assert all(r.n_runs == 1 for r in rows)
    # one version per task: nothing is split
    same = frame({"agent": "aide", "task_version": "1.0.0"}, {"agent": "aide", "task_id": "ldct-iqa"})
    assert [r.task_versions for r in table(same, {}) if r.scope == "all"] == [""]


@pytest.fixture(scope="module")
def sample_group(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install -y bubblewrap)")
    runs = tmp_path_factory.mktemp("pinned-runs")
    for seed in (0, 1, 2):
        outcome = execute_run(build_spec(TASK, agent="sample", data_root=data_root, group="p", seed=seed), runs)
        assert outcome.state == "finished", outcome.reason
    return runs / "p"


@needs_bwrap
def test_the_report_states_the_pin_versions_network_and_known_issues(sample_group: Path) -> None:
    loaded = load_runs([sample_group])
    variant = loaded.runs[0].variant
    pin = default_pins([TASK])[TASK]
    calibration = [Calibrated(record(s, p, task=TASK, baseline=pin.baseline, synthetic=True), variant)
                   for s, p in ((0, 0.7), (1, 0.8), (2, 0.9))]
    report = build_group_report(loaded, calibration=calibration, replicates=0)
    text = " ".join(to_markdown(report).split())
    assert f"expert bound (normalised 1): {pin.baseline}/full (config budget) pin v1, task 1.0.0" in text
    assert "mean 80.0% over 3 seed(s) (s0 70.0%, s1 80.0%, s2 90.0%)" in text
    assert f"{TASK}: task version(s) 1.0.0" in text and "no run had network" in text
    assert f"{TASK} known issue: [public-test-labels] Test labels are public upstream" in text
    [caveat] = report.caveats
    assert caveat.expert_pin == pin and caveat.task_versions == ["1.0.0"] and caveat.known_issues
    [pinned] = [r for r in report.rows if r.reference == "calibration"]
    assert pinned.n_runs == 3 and pinned.n_seeds == 3
    from rexmle_agents.results.view import group_page

    notes = group_page(report)["task_notes"]  # the HTML view shows the same lines
    assert any(line.startswith(f"{TASK} known issue: [public-test-labels]") for line in notes)
    [overall] = [r for r in report.rows if r.reference is None and r.scope == "all"]
    assert overall.mean_percentile is not None and overall.mean_percentile < 0.8
    assert overall.normalised == pytest.approx(0.0) and overall.normalised_tasks == 1  # the sample agent is the 0


@needs_bwrap
def test_a_run_at_another_task_version_gets_a_row_of_its_own_in_the_report(sample_group: Path,
                                                                           tmp_path: Path) -> None:
    group = tmp_path / "p"
    shutil.copytree(sample_group, group)
    edited = sorted(p for p in group.iterdir() if (p / "spec.json").is_file())[0]
    spec = json.loads((edited / "spec.json").read_text())
    spec["task_version"] = "1.1.0"
    (edited / "spec.json").write_text(json.dumps(spec))
    report = build_group_report(load_runs([group]), calibration=[], replicates=0)
    overall = {r.task_versions: r for r in report.rows if r.reference is None and r.scope == "all"}
    assert set(overall) == {f"{TASK} 1.0.0", f"{TASK} 1.1.0"}
    assert overall[f"{TASK} 1.1.0"].n_runs == 1 and overall[f"{TASK} 1.0.0"].n_runs == 2
    assert f"{TASK} 1.1.0" in to_markdown(report)
    assert report.caveats[0].task_versions == ["1.0.0", "1.1.0"]


def test_tasks_info_shows_the_changelog_and_known_issues(capsys) -> None:
    assert main(["tasks", "info", "isles22"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "known issues" in text and "[public-test-labels]" in text and "team PAT" in text
    assert "changelog 1.0.0 (2026-11-22)" in text


def test_every_task_records_a_changelog_of_its_version_and_known_issues() -> None:
    from rexmle_tasks.registry import all_tasks, get_task

    for task_id in all_tasks():
        meta = get_task(task_id).meta
        assert meta.changelog and meta.changelog[0].version == meta.version, task_id
        assert any(i.kind == "public-test-labels" for i in meta.known_issues), task_id


def test_known_issues_never_reach_public_and_the_check_catches_a_quote(data_root: Path, tmp_path: Path,
                                                                       capsys) -> None:
    from rexmle_tasks.check import check_known_issues
    from rexmle_tasks.pipeline import task_dirs
    from rexmle_tasks.registry import get_task

    task = get_task(TASK)
    public = task_dirs(task, data_root).public
    texts = [issue.text for issue in task.meta.known_issues]
    for path in public.rglob("*"):
        if path.is_file() and path.stat().st_size < 4 << 20:
            content = path.read_bytes().decode("utf-8", errors="replace")
            assert not any(t in content for t in texts), path
    assert check_known_issues(task, public) == []
    assert main(["--data-dir", str(data_root), "tasks", "check", TASK]) == 0
    assert "clean" in capsys.readouterr().out
    # a copy of the public folder that quotes one: the check names it
    planted = tmp_path / "public"
    shutil.copytree(public, planted)
    (planted / "notes.md").write_text(f"hint: {texts[0]}\n")
    assert check_known_issues(task, planted) == [
        f"public/notes.md quotes the task's known issue {texts[0][:60]!r}..."]


@needs_bwrap
def test_every_calibration_seed_read_from_a_data_folder_is_kept(sample_group: Path, tmp_path: Path) -> None:
    import dataclasses

    from rexmle_agents.results.loader import RunSet
    from rexmle_agents.results.report import load_calibration
    from rexmle_agents.results.rows import run_row
    from rexmle_baselines.calibration import store_result

    for seed, pct in ((0, 0.6), (1, 0.8), (2, 1.0)):
        store_result(tmp_path / "calibration", record(seed, pct, task=TASK, baseline="timm-regress"))
    run = load_runs([sample_group]).runs[0]
    moved = dataclasses.replace(run, spec=run.spec.model_copy(update={"data_root": str(tmp_path)}))
    found = load_calibration(RunSet(sources=[], runs=[moved]), [run_row(moved)])
    assert sorted((r.seed, r.percentile) for r in found if r.baseline == "timm-regress") == [
        (0, 0.6), (1, 0.8), (2, 1.0)]
    [bound] = expert_bounds(found, default_pins([TASK]))
    assert bound.seeds == [0, 1, 2] and bound.mean_percentile == pytest.approx(0.8)
