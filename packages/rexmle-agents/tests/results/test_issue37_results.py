"""Issue 37, results and their validity: data variants never collide or pool, unpriced calls are "unknown" (never
$0.00), the raw primary metric stands beside the percentile with plainly worded board caveats, and intervals say
when they rest on too little data (each row seeded by its own keys)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from rich.console import Console

from rexmle_agents.harness.runner import build_spec, execute_run
from rexmle_agents.harness.spec import RunSpec
from rexmle_agents.results.figures import percentile_vs_cost
from rexmle_agents.results.loader import load_run, load_runs, task_facts
from rexmle_agents.results.report import GroupReport, build_group_report, tables, to_csv, to_markdown
from rexmle_agents.results.rows import RunRow, cost_text, run_row
from rexmle_agents.results.stats import FEW_DATA_MARK, aggregate, pad_grid
from rexmle_agents.results.tables import tidy_tables

from .conftest import TASK, needs_bwrap
from .test_report import BASE, rows

# ---------------------------------------------------------------------------------------------------------------
# 1. data variants: recorded in the spec, the run id, grade.json and every table; never pooled


@pytest.fixture(scope="module")
def variant_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """LDCT-IQA prepared twice from synthetic data: easy and realistic (same cases, same split digest)."""
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    task = get_task(TASK)
    roots = {}
    for difficulty in ("easy", "realistic"):
        root = tmp_path_factory.mktemp(f"variant-{difficulty}")
        prepare_task(task, task_dirs(task, root), synthetic=True, cases=10, seed=0, difficulty=difficulty)
        roots[difficulty] = root
    return roots


def test_easy_and_realistic_data_give_different_run_ids(variant_roots: dict[str, Path]) -> None:
    easy = build_spec(TASK, agent="sample", data_root=variant_roots["easy"], group="v", sandbox="none",
                      allow_unsandboxed=True)
    realistic = build_spec(TASK, agent="sample", data_root=variant_roots["realistic"], group="v", sandbox="none",
                           allow_unsandboxed=True)
    assert easy.split_digest == realistic.split_digest  # the cases are the same: the digest alone cannot tell
    assert (easy.data_variant, realistic.data_variant) == ("synthetic-easy", "synthetic-realistic")
    assert easy.run_id != realistic.run_id


def test_a_spec_written_before_variants_keeps_its_run_id_and_reads_as_unknown() -> None:
    old = {"format_version": 1, "task_id": TASK, "task_version": "1.0.0", "split_digest": "ab", "agent": "sample",
           "agent_version": "1"}
    spec = RunSpec.model_validate(old)
    assert spec.data_variant == "unknown"
    # the id as it was computed before the field existed: every other field, nothing about the variant
    assert "data_variant" not in spec.identity()
    assert spec.run_id != RunSpec.model_validate({**old, "data_variant": "real"}).run_id


@needs_bwrap
def test_one_group_runs_both_variants_and_reports_them_apart(variant_roots: dict[str, Path],
                                                             tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    outcomes = {}
    for difficulty, root in variant_roots.items():
        outcome = execute_run(build_spec(TASK, agent="sample", data_root=root, group="v", sandbox="bwrap"), runs)
        assert outcome.state == "finished", outcome.reason
        outcomes[difficulty] = outcome
    assert outcomes["easy"].run_dir != outcomes["realistic"].run_dir  # the realistic run did not reuse the easy one
    assert len(list((runs / "v").glob("*/spec.json"))) == 2
    for difficulty, outcome in outcomes.items():
        grade = json.loads((outcome.run_dir / "grade.json").read_text())
        assert grade["labels"]["data_variant"] == f"synthetic-{difficulty}"
        assert json.loads((outcome.run_dir / "spec.json").read_text())["data_variant"] == f"synthetic-{difficulty}"
    loaded = load_runs([runs / "v"])
    report = build_group_report(loaded, replicates=50)
    overall = [r for r in report.rows if r.scope == "all" and r.reference is None]
    assert sorted(r.variant for r in overall) == ["synthetic-easy", "synthetic-realistic"]
    assert all(r.n_runs == 1 for r in overall)  # one run each: never pooled into one row of two
    assert sorted(r.variant for r in report.runs) == ["synthetic-easy", "synthetic-realistic"]
    text = to_markdown(report)
    assert "synthetic-easy data: all tasks" in text and "synthetic-realistic data: all tasks" in text
    frame = pd.read_csv(io.StringIO(to_csv(report)))
    assert set(frame["variant"]) == {"synthetic-easy", "synthetic-realistic"}
    assert set(tidy_tables(loaded).runs["variant"]) == {"synthetic-easy", "synthetic-realistic"}


def test_rows_of_two_variants_are_never_pooled() -> None:
    frame = rows({"data": "synthetic", "synthetic": True, "variant": "synthetic-easy", "percentile_counted": 1.0,
                  "percentile": 1.0},
                 {"data": "synthetic", "synthetic": True, "variant": "synthetic-realistic", "percentile_counted": 0.0,
                  "percentile": 0.0})
    facts = {t: task_facts(t) for t in frame["task_id"].unique()}
    padded, _ = pad_grid(frame, ("agent",), facts)
    made = aggregate(padded, ("agent",), competition={}, references={}, replicates=0)
    overall = {r.variant: r for r in made if r.scope == "all"}
    assert set(overall) == {"synthetic-easy", "synthetic-realistic"}
    assert overall["synthetic-easy"].mean_percentile == 1.0 and overall["synthetic-realistic"].mean_percentile == 0.0
    assert all(r.n_runs == 1 for r in overall.values())


@needs_bwrap
def test_a_run_folder_from_before_variants_is_read_as_synthetic_of_unrecorded_difficulty(
        agent_runs: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    old = tmp_path / "g" / agent_runs["sample-s0"].name
    shutil.copytree(agent_runs["sample-s0"], old)
    spec = json.loads((old / "spec.json").read_text())
    del spec["data_variant"]
    (old / "spec.json").write_text(json.dumps(spec))
    grade = json.loads((old / "grade.json").read_text())
    del grade["labels"]["data_variant"]
    (old / "grade.json").write_text(json.dumps(grade))
    run = load_run(old)
    # its difficulty is not recorded, and the data folder may have been prepared again since: never guessed
    assert run.variant == "synthetic-unknown" and run.data_kind == "synthetic"
    assert load_run(agent_runs["sample-s0"]).variant == "synthetic-easy"


# ---------------------------------------------------------------------------------------------------------------
# 2. unpriced calls: "unknown" with their count, never $0.00


def test_cost_text_says_unknown_for_uncosted_calls() -> None:
    assert cost_text(0.0, 3) == "unknown (3 uncosted calls)"
    assert cost_text(0.25, 1) == "unknown (≥ $0.25, 1 uncosted call)"
    assert cost_text(0.25, 0) == "$0.25" and cost_text(None, None) == "-"


def test_a_row_with_uncosted_calls_has_an_unknown_cost() -> None:
    frame = rows({"cost_usd": None, "uncosted_calls": 4, "seed": 0}, {"cost_usd": 0.5, "uncosted_calls": 0, "seed": 1},
                 {"agent": "mcts", "cost_usd": 0.5, "uncosted_calls": 0})
    facts = {t: task_facts(t) for t in frame["task_id"].unique()}
    padded, _ = pad_grid(frame, ("agent",), facts)
    made = {(r.keys["agent"], r.scope): r for r in aggregate(padded, ("agent",), competition={}, references={},
                                                             replicates=0)}
    assert made[("aide", "all")].cost_per_run is None and made[("aide", "all")].uncosted_calls == 4
    assert made[("mcts", "all")].cost_per_run == pytest.approx(0.5)


@needs_bwrap
def test_unpriced_runs_show_unknown_cost_everywhere(group_dir: Path, agent_runs: dict[str, Path],
                                                    tmp_path: Path) -> None:
    from rexmle_agents.results.cli import show_run, status_tables

    aide = load_run(agent_runs["aide"])
    assert aide.status.uncosted_calls and aide.status.cost_usd == 0.0  # the scripted model has no price
    row = run_row(aide)
    assert row.cost_usd is None and row.uncosted_calls == aide.status.uncosted_calls
    # runs.csv: no 0.0 for an unknown cost
    runs_csv = tidy_tables(load_runs([group_dir])).runs.set_index("run_id")
    assert pd.isna(runs_csv.loc[aide.run_id, "cost_usd"])
    # the report's tables
    report = build_group_report(load_runs([group_dir]), replicates=0)
    aide_row = next(r for r in report.rows if r.scope == "all" and r.keys["agent"] == "aide")
    assert aide_row.cost_per_run is None and aide_row.uncosted_calls > 0
    text = to_markdown(report)
    assert f"unknown ({aide_row.uncosted_calls} uncosted calls)" in text
    line = next(line for line in text.splitlines() if line.startswith("| aide |"))
    assert "$0.00" not in line
    # rexmle runs status and rexmle runs show
    console = Console(file=io.StringIO(), width=400)
    tables_, _ = status_tables(group_dir.parent, group_dir.name)
    for renderable in tables_:
        console.print(renderable)
    status_text = console.file.getvalue()
    aide_line = next(line for line in status_text.splitlines() if aide.run_id in line)
    assert "unknown" in aide_line and "$0.00" not in aide_line
    shown = Console(file=io.StringIO(), width=400)
    show_run(aide.run_dir, shown)
    budget_line = next(line for line in shown.file.getvalue().splitlines() if "│ cost" in line)
    assert "unknown" in budget_line and "$0.0000" not in budget_line
    # the cost figure: unpriced rows are left out with a note, never drawn at $0
    paths, marks = percentile_vs_cost(report, tmp_path, "synthetic-easy")
    unknown_rows = [r for r in report.rows if r.scope == "all" and r.reference is None and r.uncosted_calls]
    assert marks == 4 - len(unknown_rows) and len(unknown_rows) == 3  # sample has no model calls: $0 is true
    assert len(set(re.findall(r'id="mark-(\d+)"', paths[1].read_text()))) == marks
    assert "left out, cost unknown" in paths[1].read_text()
    # the viewer's data
    from rexmle_agents.results.view import group_page, run_page

    page = group_page(report)
    aide_cell = next(r for k in page["kinds"] for r in k["rows"] if r["keys"][0] == "aide")
    assert aide_cell["cost"] is None and aide_cell["cost_text"].startswith("unknown")
    budget = next(b for b in run_page(aide)["budgets"] if b["name"] == "cost")
    assert budget["text"].startswith("unknown")


# ---------------------------------------------------------------------------------------------------------------
# 3. the raw primary metric beside the percentile; board caveats worded plainly


def test_per_task_tables_show_the_raw_metric_beside_the_percentile() -> None:
    # on a coarse board two rows share the 0th percentile although their raw scores differ widely
    frame = rows({"task_id": "ldct-iqa", "agent": "aide", "percentile_counted": 0.0, "percentile": 0.0,
                  "primary_metric": "score", "primary_value": 2.1},
                 {"task_id": "ldct-iqa", "agent": "sample", "percentile_counted": 0.0, "percentile": 0.0,
                  "primary_metric": "score", "primary_value": 0.05},
                 {"task_id": "isles22", "agent": "aide", "percentile_counted": 0.5, "percentile": 0.5,
                  "primary_metric": "dice", "primary_value": 0.7})
    facts = {t: task_facts(t) for t in frame["task_id"].unique()}
    padded, _ = pad_grid(frame, ("agent",), facts)
    made = aggregate(padded, ("agent",), competition={}, references={("real", "ldct-iqa", "1"): (0.0, 0.5)},
                     replicates=0)
    report = GroupReport(
        sources=[], group_by=["agent"], bootstrap={"replicates": 0, "seed": 0}, runs=[], rows=made, caveats=[],
        entries=[])
    by_task = next(t for t in tables(report, "real") if t[0].endswith("by task"))
    title, columns, cells = by_task
    assert "raw primary metric" in title
    cell = {row[0]: dict(zip(columns, row, strict=True)) for row in cells}
    assert "score 2.1" in cell["aide"]["ldct-iqa"] and "score 0.05" in cell["sample"]["ldct-iqa"]
    assert "dice 0.7" in cell["aide"]["isles22"]
    assert "normalised 0.00" in cell["sample"]["ldct-iqa"]
    overall = next(r for r in made if r.scope == "all" and r.keys["agent"] == "aide")
    assert overall.primary_metric is None  # two tasks, two metrics: never averaged together
    # rows by task: the main table is per task, and carries the raw metric column
    padded, _ = pad_grid(frame, ("agent", "task"), facts)
    by_task_rows = aggregate(padded, ("agent", "task"), competition={}, references={}, replicates=0)
    report = GroupReport(sources=[], group_by=["agent", "task"], bootstrap={"replicates": 0, "seed": 0}, runs=[],
                         rows=by_task_rows, caveats=[], entries=[])
    _, columns, cells = tables(report, "real")[0]
    main = {(row[0], row[1]): dict(zip(columns, row, strict=True)) for row in cells}
    assert main[("sample", "ldct-iqa")]["raw metric"] == "score 0.05 (1 valid)"
    assert main[("aide", "ldct-iqa")]["mean pct ± s.e."] == main[("sample", "ldct-iqa")]["mean pct ± s.e."]
    assert [r.primary_mean for r in made if r.scope == "task" and r.scope_value == "ldct-iqa"
            and r.keys["agent"] == "aide"] == [pytest.approx(2.1)]


@needs_bwrap
def test_a_graded_run_row_carries_its_primary_metric(agent_runs: dict[str, Path]) -> None:
    run = load_run(agent_runs["sample-s0"])
    row = run_row(run)
    assert row.primary_metric == "score" and row.primary_higher_is_better is True
    assert row.primary_value == pytest.approx(run.grade.metrics["score"])


def test_board_caveats_say_plainly_what_the_board_is() -> None:
    from rexmle_agents.results.report import _caveat

    isles = _caveat(task_facts("isles22")).note
    assert "single team (PAT)" in isles and "not among competing teams" in isles
    assert "every row is one team's submission" not in isles  # the old wording read as the opposite
    ldct = _caveat(task_facts("ldct-iqa")).note
    assert "only 6 human rows" in ldct and "raw metric" in ldct


# ---------------------------------------------------------------------------------------------------------------
# 4. intervals: seeded per row, and marked when they rest on too little data


def _overall(frame: pd.DataFrame, by: tuple[str, ...] = ("agent",), replicates: int = 400) -> dict[str, Any]:
    facts = {t: task_facts(t) for t in frame["task_id"].unique()}
    padded, _ = pad_grid(frame, by, facts)
    made = aggregate(padded, by, competition={t: f.competition for t, f in facts.items()}, references={},
                     replicates=replicates, seed=7)
    return {r.keys["agent"]: r for r in made if r.scope == "all"}


def test_a_rows_interval_does_not_move_when_other_rows_are_added() -> None:
    mine = [{"task_id": t, "seed": s, "percentile_counted": p, "percentile": p}
            for t, s, p in (("isles22", 0, 0.2), ("isles22", 1, 0.6), ("ldct-iqa", 0, 0.9), ("ldct-iqa", 1, 0.1),
                            ("seg_a", 0, 0.4), ("seg_a", 1, 0.7))]
    alone = _overall(rows(*mine))["aide"]
    # rows sorted before "aide" draw first from a shared generator: with one, aide's interval would move
    others = [{**cell, "agent": "abacus", "percentile_counted": 0.3, "percentile": 0.3} for cell in mine]
    together = _overall(rows(*others, *mine))["aide"]
    assert (alone.ci_low, alone.ci_high) == (together.ci_low, together.ci_high)
    assert alone.ci_low < alone.ci_high


def test_two_competitions_and_two_seeds_are_marked_as_too_few() -> None:
    frame = rows({"task_id": "isles22", "seed": 0, "percentile_counted": 0.2, "percentile": 0.2},
                 {"task_id": "isles22", "seed": 1, "percentile_counted": 0.8, "percentile": 0.8},
                 {"task_id": "ldct-iqa", "seed": 0, "percentile_counted": 0.8, "percentile": 0.8},
                 {"task_id": "ldct-iqa", "seed": 1, "percentile_counted": 0.2, "percentile": 0.2})
    row = _overall(frame)["aide"]
    assert row.se_percentile == 0.0  # both seeds average 0.5: a zero s.e. that says nothing
    assert row.n_competitions == 2
    assert any("95% CI from 2 competition(s)" in w for w in row.interval_warnings)
    assert any("s.e. from 2 seeds" in w for w in row.interval_warnings)
    report = GroupReport(
        sources=[], group_by=["agent"], bootstrap={"replicates": 400, "seed": 7}, runs=[], rows=[row], caveats=[],
        entries=[])
    text = to_markdown(report)
    main = next(line for line in text.splitlines() if line.startswith("| aide |"))
    assert main.count(FEW_DATA_MARK) == 2  # beside the s.e. and beside the CI
    assert f"{FEW_DATA_MARK} real aide: 95% CI from 2 competition(s)" in text


def test_enough_competitions_and_seeds_carry_no_warning() -> None:
    tasks = ["isles22", "ldct-iqa", "seg_a", "ravir", "dentex", "usenhance"]
    cells = [{"task_id": t, "seed": s, "percentile_counted": 0.1 * (i + s), "percentile": 0.1 * (i + s)}
             for i, t in enumerate(tasks) for s in range(3)]
    row = _overall(rows(*cells))["aide"]
    assert row.n_competitions >= 5 and row.n_seeds == 3
    assert row.interval_warnings == []


def test_run_rows_built_without_a_variant_stand_for_their_data_kind() -> None:
    facts = task_facts("isles22")
    base = {**BASE, "task_id": "isles22", "competition": facts.competition}
    assert RunRow(**base).variant == "real"
    assert RunRow(**{**base, "data": "synthetic", "synthetic": True}).variant == "synthetic-unknown"


def test_two_mirrors_of_one_task_and_seed_never_share_a_run_id(tmp_path: Path) -> None:
    """A synthetic mirror prepared again (`--force` draws a new secret: other data, other labels) is another
    mirror of the same variant: its runs get other run ids, so a group never returns the old mirror's result; the
    same secret gives the same id (the digest of the secret, never the secret, is in the spec)."""
    from rexmle_agents.harness.runner import build_spec
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    task = get_task(TASK)

    def spec_on(folder: str, secret: str) -> Any:
        root = tmp_path / folder
        prepare_task(task, task_dirs(task, root), synthetic=True, cases=8, seed=0, secret=secret)
        return build_spec(TASK, agent="sample", data_root=root, sandbox="bwrap")

    first, again, other = spec_on("a", "secret-one"), spec_on("b", "secret-one"), spec_on("c", "secret-two")
    assert first.run_id == again.run_id and first.data_digest == again.data_digest
    assert other.run_id != first.run_id and other.data_digest != first.data_digest
    assert first.data_variant == other.data_variant == "synthetic-easy"  # one variant, two mirrors
    assert b"secret-one".hex() not in first.model_dump_json() and "secret-one" not in first.model_dump_json()
