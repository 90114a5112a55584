"""``rexmle analyse``: the default command, record/replay of the judge, the cost budget (exit code 2 with what was
made written, then continued), the agreement command on the shipped labels, and bad input as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rexmle_agents.analysis.examples import ExampleJudge, example_labels
from rexmle_agents.analysis.factors import load_rubrics
from rexmle_agents.analysis.judge import Judge
from rexmle_agents.analysis.pipeline import analyse_runs
from rexmle_agents.models import Model, RecordingBackend, ScriptedBackend
from rexmle_agents.results.loader import load_runs
from rexmle_grade.cli import main

PRICED = "anthropic/claude-haiku-4-5"  # a priced model name for a recorded (scripted) judge: replay needs no key


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error: ") == 1, err
    return " ".join(err.split())


def test_analyse_runs_without_a_judge_is_the_default_command(example_group, tmp_path, capsys) -> None:
    out = tmp_path / "a"
    assert main(["analyse", str(example_group), "-o", str(out), "--no-view", "--no-figures"]) == 0
    printed = capsys.readouterr().out
    assert "share of runs demonstrating each factor" in printed and "failure analysis" in printed
    assert "import_error" in (out / "failures.csv").read_text() and (out / "manifest.json").is_file()


@pytest.mark.parametrize(("args", "message"), [
    (["--factors", "augmentation"], "unknown factor 'augmentation'"),
    (["--max-cost", "1"], "--max-cost, --record and --replay need a judge"),
])
def test_bad_options_are_one_line(example_group, tmp_path, capsys, args, message) -> None:
    assert main(["analyse", str(example_group), "-o", str(tmp_path / "a"), *args]) == 2
    assert message in one_line_error(capsys)


@pytest.fixture
def cassette(example_group, tmp_path) -> Path:
    """Every judge call of the example runs, recorded under a priced model name."""
    path = tmp_path / "judge.jsonl"
    backend = RecordingBackend(ScriptedBackend(ExampleJudge(name=PRICED), name=PRICED), path)
    analyse_runs(load_runs([example_group]), tmp_path / "recording", judge=Judge(Model(backend), load_rubrics()),
                 figures=False, view=False)
    return path


def test_the_budget_stops_the_command_and_the_same_command_goes_on(example_group, cassette, tmp_path,
                                                                   capsys) -> None:
    out = tmp_path / "a"
    base = ["analyse", str(example_group), "-o", str(out), "--judge", PRICED, "--replay", str(cassette), "--no-view",
            "--no-figures"]
    assert main([*base, "--max-cost", "0.01"]) == 2
    assert "stopped early: money budget spent" in one_line_error(capsys)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is False and manifest["judge"]["model"] == PRICED
    assert len(list((out / "runs").glob("*.json"))) == 5
    calls = (out / "judge-calls.jsonl").read_text().splitlines()
    assert json.loads(calls[-1])["run_totals"]["cost_usd"] >= 0.01
    assert main([*base, "--max-cost", "5"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["reused_verdicts"] > 0


def test_agreement_on_the_shipped_labels(example_group, cassette, tmp_path, capsys) -> None:
    out = tmp_path / "a"
    assert main(["analyse", str(example_group), "-o", str(out), "--judge", PRICED, "--replay", str(cassette),
                 "--no-view", "--no-figures"]) == 0
    labels = example_labels(tmp_path / "labels.csv")
    capsys.readouterr()
    assert main(["analyse", "agreement", str(out), "--labels", str(labels), "--bootstrap", "100"]) == 0
    table = capsys.readouterr().out
    assert "Cohen's kappa" in table and "undef." in table and "disagreements:" in table
    assert main(["analyse", "agreement", str(out), "-l", str(labels), "--format", "csv", "--bootstrap", "0"]) == 0
    pairs = {tuple(line.split(",")[1:3]) for line in capsys.readouterr().out.splitlines()[1:]}
    assert {("judge", "detectors"), ("judge", "dev-a"), ("detectors", "dev-b"), ("dev-a", "dev-b")} <= pairs
    assert main(["analyse", "agreement", str(out), "-l", str(labels), "--format", "json", "--bootstrap", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["judge_model"] == PRICED and report["disagreements"]
    overall = next(r for r in report["rows"] if r["factor"] == "all" and r["rater_a"] == "dev-a")
    assert overall["rater_b"] == "dev-b" and 0 < overall["kappa"] < 1


def test_agreement_needs_an_analysis(tmp_path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    labels = example_labels(tmp_path / "labels.csv")
    assert main(["analyse", "agreement", str(tmp_path / "empty"), "--labels", str(labels)]) == 2
    assert "no run analyses" in one_line_error(capsys)


@pytest.mark.slow
def test_the_examples_command_runs_the_whole_method_offline(tmp_path, capsys) -> None:
    assert main(["analyse", "examples", str(tmp_path / "ex")]) == 0
    printed = capsys.readouterr().out
    assert "Cohen's kappa" in printed and "scripted/example-judge" in printed
    assert (tmp_path / "ex" / "analysis" / "view.html").is_file()
    assert (tmp_path / "ex" / "analysis" / "figures" / "capability-comparison-synthetic.png").is_file()
