"""Every figure is written (PNG and SVG) and holds the expected number of marks (bars, points): the SVG is read
back and its ``mark-N`` ids counted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rexmle_agents.results.figures import (
    OKABE_ITO,
    percentile_by_task,
    percentile_vs_budget,
    percentile_vs_cost,
    search_curve,
    valid_rate_by_type,
    write_figures,
)
from rexmle_agents.results.loader import load_run, load_runs
from rexmle_agents.results.report import build_group_report
from rexmle_agents.results.trajectory import trajectory


def marks(svg: Path, prefix: str = "mark") -> int:
    return len(set(re.findall(rf'id="{prefix}-(\d+)"', svg.read_text())))


@pytest.fixture(scope="module")
def report(group_dir: Path):
    return build_group_report(load_runs([group_dir]), replicates=50)


def test_the_group_figures_have_a_mark_per_row_and_column(report, tmp_path: Path) -> None:
    rows = 4  # sample, aide, mcts, rdloop; one task, one task type
    # the scripted model of aide, mcts and rdloop has no price: their cost is unknown, left out of the cost figure
    for make, expected in ((percentile_by_task, rows), (valid_rate_by_type, rows), (percentile_vs_budget, rows),
                           (percentile_vs_cost, 1)):
        paths, counted = make(report, tmp_path, "synthetic-easy")
        assert [p.suffix for p in paths] == [".png", ".svg"] and all(p.stat().st_size > 1000 for p in paths)
        assert counted == expected and marks(paths[1]) == expected, make.__name__
        assert "SYNTHETIC DATA" in paths[1].read_text()
        assert paths[0].read_bytes().startswith(b"\x89PNG")


def test_a_search_curve_has_a_point_per_scored_node(agent_runs: dict[str, Path], tmp_path: Path) -> None:
    path = trajectory(load_run(agent_runs["aide"]))
    scored = [n for n in path.nodes if n.metric is not None and not n.buggy]
    assert len(scored) >= 3
    paths, counted = search_curve(path, tmp_path, "aide")
    assert counted == len(scored) == marks(paths[1]) == marks(paths[1], "step-mark")
    best = [b for _, _, b in path.search_curve()]
    assert best == sorted(best)  # higher is better here: the best so far never falls


def test_write_figures_draws_every_figure_and_the_search_curves(report, group_dir: Path, tmp_path: Path) -> None:
    made = write_figures(report, load_runs([group_dir]), tmp_path, max_curves=2)
    assert {k for k in made if not k.startswith("search-")} == {
        "percentile-by-task-synthetic-easy", "valid-rate-by-type-synthetic-easy", "percentile-vs-budget-synthetic-easy",
        "percentile-vs-cost-synthetic-easy"}
    assert len([k for k in made if k.startswith("search-")]) == 2
    assert len(list(tmp_path.glob("*.svg"))) == len(list(tmp_path.glob("*.png"))) == len(made)


def test_the_palette_is_okabe_ito() -> None:
    assert OKABE_ITO[:3] == ("#E69F00", "#56B4E9", "#009E73") and len(set(OKABE_ITO)) == 8
