"""The command line around results: the group report rebuilt from every run folder, plans, `runs status` /
`runs show`, and the bad input a new user meets first (one line, exit code 2, nothing written)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rexmle_agents.cli import parse_agent_config
from rexmle_agents.plans import expand, load_plan, shipped_plans
from rexmle_grade.cli import main

TASK = "ldct-iqa"
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("CI"),
                                reason="bubblewrap is not installed (apt-get install -y bubblewrap)")


def one_line_error(capsys) -> str:
    """The error printed: one message (the console may fold it at its width) and a hint, no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err and "validation error" not in err.lower(), err
    assert err.startswith("error: ") and err.count("error: ") == 1 and err.count("hint: ") == 1, err
    return " ".join(err.split())


def test_the_group_report_is_rebuilt_from_every_run_folder(data_root: Path, tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    base = ["--data-dir", str(data_root), "run", "--agent", "sample", "--task", TASK, "--runs-dir", str(runs),
            "--group", "demo"]
    assert main([*base, "--seeds", "2"]) == 0
    report = json.loads((runs / "demo" / "report.json").read_text())
    assert len(report["entries"]) == 2
    capsys.readouterr()
    # one run again (it is finished: only re-read): the report still holds both, not only the run just made
    assert main([*base, "--seed", "0"]) == 0
    report = json.loads((runs / "demo" / "report.json").read_text())
    assert sorted(r["seed"] for r in report["runs"]) == [0, 1] and len(report["entries"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "SYNTHETIC DATA" in out and "rexmle report" in out
    # status: model, tokens, cost and a total per group; show: the trajectory
    assert main(["runs", "status", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "tokens" in out and "cost" in out and "total: 2 run(s)" in " ".join(out.split())
    run_id = report["runs"][0]["run_id"]
    assert main(["runs", "show", run_id[:20], "--runs-dir", str(runs)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "step 1 copy_sample" in out and "FINAL" in out and "grade: valid" in out


def test_a_model_without_its_key_is_refused_before_anything_is_written(data_root: Path, tmp_path: Path, capsys,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code = main(["--data-dir", str(data_root), "run", "--agent", "aide", "--task", TASK, "--model", "openai/gpt-5",
                 "--runs-dir", str(tmp_path)])
    assert code == 2
    assert "OPENAI_API_KEY is not set" in one_line_error(capsys)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(("option", "value", "says"), [("--time-limit", "0", "--time-limit 0.0: input should be "
                                                                             "greater than 0"),
                                                       ("--exec-timeout", "0", "--exec-timeout 0.0"),
                                                       ("--max-cost", "-1", "--max-cost -1.0"),
                                                       ("--memory-gb", "0", "--memory-gb 0.0")])
def test_a_value_out_of_range_is_one_line(data_root: Path, tmp_path: Path, capsys, option: str, value: str,
                                          says: str) -> None:
    code = main(["--data-dir", str(data_root), "run", "--agent", "sample", "--task", TASK, "--runs-dir",
                 str(tmp_path), option, value])
    assert code == 2
    assert says in one_line_error(capsys)
    assert not any(tmp_path.iterdir())


def test_every_unprepared_task_is_listed(data_root: Path, tmp_path: Path, capsys) -> None:
    code = main(["--data-dir", str(data_root), "run", "--agent", "sample", "--tasks", f"{TASK},isles22,seg_a",
                 "--runs-dir", str(tmp_path)])
    assert code == 2
    err = one_line_error(capsys)
    assert "2 of 3 task(s) are not prepared: isles22, seg_a" in err
    assert "rexmle prepare isles22 --synthetic && rexmle prepare seg_a --synthetic" in err


def test_shipped_agent_configs_resolve_by_name(capsys) -> None:
    assert parse_agent_config(["@paper-aide.yaml"])["num_drafts"] == 5
    assert parse_agent_config(["@paper-mcts"])["workers"] == 3
    assert main(["run", "--agent", "aide", "--task", TASK, "--agent-config", "@paper-nothing.yaml"]) == 2
    assert "@paper-aide.yaml" in one_line_error(capsys)


def test_the_shipped_plans_expand_to_the_papers_grids() -> None:
    from rexmle_agents.cli import select_tasks

    papers = {"paper-main", "ablation-time-budget", "ablation-backend", "ablation-expert-report"}
    assert papers <= set(shipped_plans())
    for name in shipped_plans():  # every shipped plan loads (the originals' plans included)
        load_plan(name)
    counts = {}
    for name in sorted(papers):
        plan = load_plan(name)
        requests = expand(plan, select_tasks=select_tasks, read_config=lambda ref: parse_agent_config([ref]))
        counts[name] = len(requests)
        assert "ravir" not in {r.task_id for r in requests} and len({r.task_id for r in requests}) == 20
    assert counts == {"paper-main": 3 * 3 * 20 * 3, "ablation-time-budget": 2 * 20 * 3,
                      "ablation-backend": 5 * 20 * 3, "ablation-expert-report": 2 * 20 * 3}
    main_grid = expand(load_plan("paper-main"), select_tasks=select_tasks,
                       read_config=lambda ref: parse_agent_config([ref]))
    assert {r.agent for r in main_grid} == {"aide", "mcts", "rdloop"}
    assert len({r.models["default"] for r in main_grid}) == 3
    budgets = expand(load_plan("ablation-time-budget"), select_tasks=select_tasks,
                     read_config=lambda ref: parse_agent_config([ref]))
    assert {r.options.time_limit for r in budgets} == {"12h", "24h"}


def test_a_plan_runs_with_one_command_and_reports_with_another(data_root: Path, tmp_path: Path, capsys,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    plan = tmp_path / "tiny.yaml"
    plan.write_text("format: 1\nname: tiny\ngroup: tiny\nseeds: 1\noptions: {time_limit: 10m}\n"
                    f"runs:\n  - agent: sample\n    tasks: {TASK}\n    time_limits: [5m, 10m]\n"
                    "report: {by: [agent, budget]}\n")
    runs = tmp_path / "runs"
    assert main(["--data-dir", str(data_root), "run", "--plan", str(plan), "--dry-run", "--runs-dir", str(runs)]) == 0
    assert "2 run(s)" in capsys.readouterr().out and not runs.exists()
    assert main(["--data-dir", str(data_root), "run", "--plan", str(plan), "--runs-dir", str(runs)]) == 0
    assert len(list((runs / "tiny").glob("*/grade.json"))) == 2
    capsys.readouterr()
    assert main(["report", "--plan", str(plan), "--runs-dir", str(runs), "--format", "csv", "--bootstrap", "0"]) == 0
    out = capsys.readouterr().out
    assert "agent,budget,data" in out and "sample,5m,synthetic" in out and "sample,10m,synthetic" in out
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    plan.write_text(plan.read_text().replace("agent: sample", "agent: aide\n    models: [openai/gpt-5, "
                                                              "google/gemini-2.5-pro]"))
    assert main(["--data-dir", str(data_root), "run", "--plan", str(plan), "--runs-dir", str(runs)]) == 2
    assert "needs GEMINI_API_KEY, OPENAI_API_KEY" in one_line_error(capsys)
    assert main(["run", "--plan", "paper-mian"]) == 2
    assert "did you mean 'paper-main'" in one_line_error(capsys)
