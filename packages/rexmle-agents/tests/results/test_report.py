"""The paper's table: padding, percentiles (invalid = 0, no board = left out), standard errors, the hierarchical
bootstrap, the normalised score, synthetic never mixed with real; and `rexmle report` over real run folders."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from rexmle_agents.results.loader import load_runs, task_facts
from rexmle_agents.results.report import build_group_report, parse_by, to_csv, to_markdown
from rexmle_agents.results.rows import RunRow
from rexmle_agents.results.stats import (
    ExpertPin,
    aggregate,
    expert_bounds,
    hierarchical_bootstrap,
    pad_grid,
    reference_percentiles,
)
from rexmle_grade.cli import main
from rexmle_grade.errors import UserInputError

BASE = dict(run_id="r", group="g", run_dir="", data="real", synthetic=False, task_version="1", competition="",
            task_type="segmentation", dim="3d", agent="aide", agent_version="1", model="openai/gpt-5", config="-",
            agent_config="{}", budget="12h", seed=0, state="finished", reason="", limit=None, graded=True,
            grade_status="valid", valid=True, percentile=0.5, percentile_counted=0.5, mean_position=3.0,
            position_counted=3.0, board_rows=10, gold=False, silver=False, bronze=False, any_medal=False,
            above_median=False, time_budget_s=43200.0, time_used_s=100.0, exec_timeout_s=3600.0, steps=3,
            max_steps=None, model_calls=5, tokens=1000, input_tokens=800, output_tokens=200, cost_usd=0.5,
            uncosted_calls=0, max_tokens=None, max_cost_usd=None, sandbox="bwrap", network="none",
            heldout_reachable="no", selection_k=0, gpus=1, gpu_names="", cpus=8, cpu_model="", memory_gb=32.0,
            host="h", rexmle_versions="", grader_id="", leaderboard_version=None, started_at=None,
            finished_at="2026-01-01T00:00:00+00:00", problems=0)


def rows(*cells: dict[str, Any]) -> pd.DataFrame:
    out = []
    for n, cell in enumerate(cells):
        task = cell.get("task_id", "isles22")
        facts = task_facts(task)
        values = {**BASE, "run_id": f"r{n}", "task_id": task, "competition": facts.competition,
                  "task_type": facts.task_type, "dim": facts.dim, "board_rows": facts.board_rows, **cell}
        if cell.get("valid") is False:
            values.update(percentile=None, percentile_counted=0.0 if values["board_rows"] else None,
                          position_counted=float(values["board_rows"] + 1) if values["board_rows"] else None)
        if values["board_rows"] is None:
            values.update(percentile=None, percentile_counted=None, position_counted=None, mean_position=None)
        out.append(RunRow(**values).model_dump())
    return pd.DataFrame(out)


def table(frame: pd.DataFrame, by: tuple[str, ...] = ("agent", "model"), references: Any = None) -> dict:
    facts = {t: task_facts(t) for t in frame["task_id"].unique()}
    padded, _ = pad_grid(frame, by, facts)
    result = aggregate(padded, by, competition={t: f.competition for t, f in facts.items()},
                       references=references or {}, replicates=200, seed=1)
    return {(r.data, tuple(r.keys.values()), r.scope, r.scope_value): r for r in result}


def test_missing_seeds_and_tasks_are_padded_as_failures() -> None:
    frame = rows({"task_id": "isles22", "seed": 0, "percentile_counted": 0.8, "percentile": 0.8},
                 {"task_id": "isles22", "seed": 1, "percentile_counted": 0.6, "percentile": 0.6},
                 {"task_id": "seg_a", "seed": 0, "percentile_counted": 0.4, "percentile": 0.4},
                 {"task_id": "seg_a", "seed": 0, "agent": "mcts", "percentile_counted": 1.0, "percentile": 1.0})
    rows_ = table(frame)
    aide = rows_[("real", ("aide", "openai/gpt-5"), "all", "all")]
    assert (aide.n_runs, aide.n_missing, aide.n_valid) == (4, 1, 3)  # seg_a seed 1 is missing
    assert aide.mean_percentile == pytest.approx((0.8 + 0.6 + 0.4 + 0.0) / 4)
    assert aide.valid_rate == pytest.approx(0.75)
    # per seed: seed 0 = (0.8 + 0.4) / 2, seed 1 = (0.6 + 0) / 2 -> s.e. = std / sqrt(2)
    assert aide.se_percentile == pytest.approx(np.std([0.6, 0.3], ddof=1) / np.sqrt(2))
    mcts = rows_[("real", ("mcts", "openai/gpt-5"), "all", "all")]
    assert (mcts.n_runs, mcts.n_missing) == (2, 1)  # isles22 was never run by mcts: a failure, not a gap
    assert mcts.mean_percentile == pytest.approx(0.5)
    assert rows_[("real", ("mcts", "openai/gpt-5"), "task", "isles22")].mean_position == 11.0  # N + 1


def test_a_task_without_a_board_counts_in_the_valid_rate_only() -> None:
    frame = rows({"task_id": "isles22", "percentile_counted": 0.6, "percentile": 0.6},
                 {"task_id": "ravir", "valid": True}, {"task_id": "ravir", "seed": 1, "valid": False},
                 {"task_id": "isles22", "seed": 1, "percentile_counted": 0.2, "percentile": 0.2})
    row = table(frame)[("real", ("aide", "openai/gpt-5"), "all", "all")]
    assert row.mean_percentile == pytest.approx(0.4) and row.n_board_tasks == 1
    assert row.valid_rate == pytest.approx(0.75) and row.tasks_without_board == ["ravir"]


def test_synthetic_and_real_results_are_never_in_one_row() -> None:
    frame = rows({"percentile_counted": 1.0, "percentile": 1.0, "data": "synthetic", "synthetic": True},
                 {"percentile_counted": 0.0, "percentile": 0.0, "valid": True})
    result = table(frame)
    overall = {k[0]: v for k, v in result.items() if k[2] == "all"}
    assert set(overall) == {"synthetic", "real"}
    assert overall["synthetic"].mean_percentile == 1.0 and not overall["synthetic"].comparable_with_board
    assert overall["real"].mean_percentile == 0.0 and overall["real"].comparable_with_board


def test_the_bootstrap_resamples_competitions_first() -> None:
    # competition A holds three tasks at 1.0, B one task at 0.0: drawing two competitions gives AA (1.0),
    # AB or BA (3 tasks at 1, one at 0: 0.75) or BB (0.0) -- never what resampling tasks alone would give
    tasks = [("a1", np.array([1.0])), ("a2", np.array([1.0])), ("a3", np.array([1.0])), ("b1", np.array([0.0]))]
    comp = {"a1": "A", "a2": "A", "a3": "A", "b1": "B"}
    reps = hierarchical_bootstrap(tasks, comp, replicates=4000, rng=np.random.default_rng(0))
    values, counts = np.unique(np.round(reps, 6), return_counts=True)
    assert list(values) == [0.0, 0.75, 1.0]
    assert counts / counts.sum() == pytest.approx([0.25, 0.5, 0.25], abs=0.03)
    flat = hierarchical_bootstrap(tasks, {t: t for t in comp}, replicates=4000, rng=np.random.default_rng(0))
    assert len(np.unique(np.round(flat, 6))) > 3  # each task its own competition: a plain task bootstrap
    seeds = hierarchical_bootstrap([("t", np.array([0.0, 1.0]))], {}, replicates=2000, rng=np.random.default_rng(0))
    assert set(np.round(seeds, 6)) == {0.0, 0.5, 1.0}  # one task: only its seeds are resampled


def test_the_normalised_score_puts_the_sample_at_0_and_the_best_baseline_at_1() -> None:
    frame = rows({"agent": "sample", "model": "-", "percentile_counted": 0.2, "percentile": 0.2},
                 {"agent": "baseline", "model": "-", "percentile_counted": 0.6, "percentile": 0.6},
                 {"agent": "aide", "percentile_counted": 0.5, "percentile": 0.5})

    class Calibrated:
        task_id, percentile, synthetic, valid, task_version = "isles22", 0.8, False, True, "1"
        baseline, config, time_budget_s, seed = "nnunet", "full", None, 0

    facts = {"isles22": task_facts("isles22")}
    padded, _ = pad_grid(frame, ("agent", "model"), facts)
    pins = {"isles22": ExpertPin(task_id="isles22", baseline="nnunet", config="full")}
    references = reference_percentiles(padded, expert_bounds([Calibrated()], pins))
    assert references == {("real", "isles22", "1"): (pytest.approx(0.2), 0.8)}
    result = table(frame, references=references)
    assert result[("real", ("aide", "openai/gpt-5"), "all", "all")].normalised == pytest.approx(0.5)
    assert result[("real", ("sample", "-"), "all", "all")].normalised == pytest.approx(0.0)


def test_the_bootstrap_of_unequal_seed_counts_averages_each_task_over_its_own_seeds() -> None:
    # one task run with two seeds, one with a single seed: every replicate is a mean of those values, so a constant
    # score bootstraps to exactly itself, and nothing falls outside the values' range
    constant = hierarchical_bootstrap([("a", np.array([0.5, 0.5])), ("b", np.array([0.5]))], {"a": "C", "b": "C"},
                                      replicates=500, rng=np.random.default_rng(3))
    assert np.allclose(constant, 0.5)
    spread = hierarchical_bootstrap([("a", np.array([0.1, 0.3])), ("b", np.array([0.9]))], {"a": "C", "b": "C"},
                                    replicates=2000, rng=np.random.default_rng(4))
    assert spread.min() >= 0.1 - 1e-12 and spread.max() <= 0.9 + 1e-12
    # each drawn task is a mean of its resampled seeds (a: 0.1, 0.2 or 0.3; b: 0.9), a replicate the mean of two
    assert set(np.round(spread, 6)) <= {0.1, 0.15, 0.2, 0.25, 0.3, 0.5, 0.55, 0.6, 0.9}


def test_rows_by_task_keep_the_task_type_and_dimension_scopes_but_no_redundant_task_scope() -> None:
    frame = rows({"task_id": "isles22", "percentile_counted": 0.4, "percentile": 0.4},
                 {"task_id": "ldct-iqa", "percentile_counted": 0.8, "percentile": 0.8})
    result = table(frame, by=("agent", "task"))
    scopes = {(k[1], k[2]) for k in result}
    assert (("aide", "isles22"), "task") not in scopes
    assert {(("aide", "isles22"), "all"), (("aide", "isles22"), "task_type"), (("aide", "isles22"), "dim")} <= scopes
    by_agent = table(frame)
    assert {k[3] for k in by_agent if k[2] == "task"} == {"isles22", "ldct-iqa"}


def test_a_task_whose_baseline_is_no_better_than_the_sample_is_left_out_of_the_normalised_score() -> None:
    frame = rows({"agent": "aide", "percentile_counted": 0.5, "percentile": 0.5})
    result = table(frame, references={("real", "isles22", "1"): (0.4, 0.4)})  # expert = sample: no scale
    row = result[("real", ("aide", "openai/gpt-5"), "all", "all")]
    assert row.normalised is None and row.normalised_tasks == 0


def test_medal_and_above_median_rates_are_shares_of_the_runs_on_a_board() -> None:
    frame = rows({"seed": 0, "above_median": True, "any_medal": True, "bronze": True},
                 {"seed": 1, "above_median": True}, {"seed": 2}, {"seed": 3},
                 {"task_id": "ravir", "seed": 0, "above_median": False})  # no board: not in the shares
    row = table(frame)[("real", ("aide", "openai/gpt-5"), "all", "all")]
    assert row.above_median == 2 and row.above_median_rate == pytest.approx(0.5)
    assert row.medals == 1 and row.bronze == 1 and row.medal_rate == pytest.approx(0.25)


def test_a_calibration_record_counts_its_percentile_only_when_valid() -> None:
    from rexmle_agents.results.stats import calibration_rows

    class Record:
        baseline, synthetic = "nnunet", False

        def __init__(self, valid: bool, percentile: float | None, seed: int = 0, config: str = "full",
                     seconds: float = 10.0) -> None:
            self.valid, self.percentile, self.seed, self.config, self.seconds = valid, percentile, seed, config, seconds
            self.task_id = "isles22"

    facts = {"isles22": task_facts("isles22")}
    made = calibration_rows([Record(True, 0.7), Record(False, 0.8, config="budget"),
                             Record(True, None, config="quick")], facts)
    assert [r.mean_percentile for r in made] == [0.7, 0.0, 0.0]  # an invalid submission scores as the last place
    assert [r.n_valid for r in made] == [1, 0, 1]
    # three seeds of one configuration make one reference row: their mean, median and s.e. over seeds
    (seeds,) = calibration_rows([Record(True, 0.6, 0, seconds=10.0), Record(True, 0.9, 1, seconds=20.0),
                                 Record(False, None, 2, seconds=30.0)], facts)
    assert (seeds.n_seeds, seeds.n_runs, seeds.n_valid) == (3, 3, 2) and seeds.valid_rate == pytest.approx(2 / 3)
    assert seeds.mean_percentile == pytest.approx(0.5) and seeds.median_percentile == pytest.approx(0.6)
    assert seeds.se_percentile == pytest.approx(np.std([0.6, 0.9, 0.0], ddof=1) / np.sqrt(3))
    assert seeds.time_used_s == pytest.approx(20.0) and seeds.keys["config"] == "config=full"


def test_rows_by_another_key_and_bad_keys() -> None:
    frame = rows({"budget": "12h", "percentile_counted": 0.2, "percentile": 0.2},
                 {"budget": "24h", "percentile_counted": 0.4, "percentile": 0.4})
    result = table(frame, by=("agent", "budget"))
    assert result[("real", ("aide", "24h"), "all", "all")].mean_percentile == pytest.approx(0.4)
    with pytest.raises(UserInputError, match="unknown row key"):
        parse_by("agent,colour")


# ---------------------------------------------------------------------------------------------------------------
# real run folders


def test_the_group_report_of_real_runs(group_dir: Path) -> None:
    report = build_group_report(load_runs([group_dir]), replicates=100)
    overall = {r.keys["agent"]: r for r in report.rows if r.scope == "all" and r.reference is None}
    assert set(overall) == {"sample", "aide", "mcts", "rdloop"}
    assert all(r.data == "synthetic" and not r.comparable_with_board for r in report.rows)
    assert overall["sample"].n_runs == 2 and overall["sample"].n_seeds == 2 and overall["sample"].valid_rate == 1.0
    assert overall["aide"].steps_per_run == 5 and overall["aide"].time_budget_s == 120
    assert len(report.entries) == 5 and all(e.synthetic for e in report.entries)
    assert {r.sandbox for r in report.runs} == {"bwrap"} and {r.network for r in report.runs} == {"none"}
    assert all(r.cpus and r.cpu_model and r.rexmle_versions for r in report.runs)
    caveat = next(c for c in report.caveats if c.task_id == "ldct-iqa")
    assert caveat.board_rows == 6 and "only 6 human rows" in caveat.note


def test_report_command_formats(group_dir: Path, tmp_path: Path, capsys) -> None:
    assert main(["report", str(group_dir), "--format", "csv", "--bootstrap", "50"]) == 0
    frame = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert set(frame["agent"]) == {"sample", "aide", "mcts", "rdloop"}
    assert {"valid_rate", "mean_percentile", "se_percentile", "ci_low", "ci_high", "normalised"} <= set(frame)
    assert set(frame["scope"]) == {"all", "task_type", "dim", "task"}
    assert main(["report", str(group_dir), "--format", "md", "-o", str(tmp_path / "t.md")]) == 0
    text = (tmp_path / "t.md").read_text()
    assert "SYNTHETIC DATA" in text and "| aide |" in text and "ldct-iqa: 6 human rows" in text
    assert main(["report", str(group_dir), "--format", "json", "-o", str(tmp_path / "r.json"),
                 "--tables", str(tmp_path / "tables")]) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["kind"] == "rexmle-group-report" and len(data["runs"]) == 5
    nodes = pd.read_csv(tmp_path / "tables" / "nodes.csv")
    assert set(nodes["kind"]) == {"tree", "steps"} and nodes["final"].sum() == 5
    calls = pd.read_csv(tmp_path / "tables" / "model_calls.csv")
    assert len(calls) > 10 and set(calls["agent"]) == {"aide", "mcts", "rdloop"}
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == [
        "grades.csv", "metrics.csv", "model_calls.csv", "nodes.csv", "runs.csv"]
    assert main(["report", str(group_dir), "--by", "agent,seed", "--format", "csv"]) == 0
    assert set(pd.read_csv(io.StringIO(capsys.readouterr().out))["seed"].dropna()) == {0, 1}


def test_to_markdown_and_csv_agree(group_dir: Path) -> None:
    report = build_group_report(load_runs([group_dir]), replicates=0)
    assert all(r.ci_low is None for r in report.rows)
    assert len(pd.read_csv(io.StringIO(to_csv(report)))) == len(report.rows)
    assert to_markdown(report).count("\n| sample |") == 4  # all tasks, by type, by dimension, by task


def test_the_terminal_table_keeps_its_width_when_written_to_a_file(group_dir: Path) -> None:
    """`rexmle report > report.txt` (no terminal to fit): the wide table keeps its natural width instead of being
    folded by rich's default 80 columns into one-letter columns; a terminal still gets a table that fits it."""
    import io

    from rich.console import Console

    from rexmle_agents.results.report import render_terminal

    report = build_group_report(load_runs([group_dir]), replicates=0)
    written = io.StringIO()
    render_terminal(report, Console(file=written, width=80, force_terminal=False))
    header = next(line for line in written.getvalue().splitlines() if "agent" in line and "┃" in line)
    assert "mean pct ± s.e." in header and len(header) > 80
    shown = io.StringIO()
    render_terminal(report, Console(file=shown, width=80, force_terminal=True, color_system=None))
    assert max(len(line) for line in shown.getvalue().splitlines() if "┃" in line) <= 80
