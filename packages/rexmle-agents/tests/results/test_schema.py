"""The published run-format schema: the shipped files match the records, real run folders of every agent validate
against the files (with an independent JSON Schema validator), one time format, the status fix, and older folders
read or refused with a clear message."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from rexmle_agents.results.loader import RunFormatError, load_run, load_runs
from rexmle_agents.results.report import build_group_report
from rexmle_agents.results.schemas import SCHEMAS, load_schema, stale_files

TASK, GROUP = "ldct-iqa", "g"  # as conftest.py makes them
# every kind the harness, the ledger and the scaffolds write in these runs
EXPECTED_KINDS = {"run_started", "step_started", "step_finished", "exec_started", "exec_finished", "code_written",
                  "validation", "snapshot", "final_selected", "agent_state", "model_call", "scaffold_summary",
                  "final_collected", "run_finished", "graded", "log"}


def validator(name: str) -> jsonschema.protocols.Validator:
    schema = load_schema(name)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def validate_folder(run_dir: Path) -> set[str]:
    """Validate every record of a run folder against the shipped files; returns the event kinds seen."""
    validator("spec").validate(json.loads((run_dir / "spec.json").read_text()))
    validator("status").validate(json.loads((run_dir / "status.json").read_text()))
    validator("grade").validate(json.loads((run_dir / "grade.json").read_text()))
    events = validator("journal-event")
    kinds = set()
    for number, line in enumerate((run_dir / "journal.jsonl").read_text().splitlines(), start=1):
        event = json.loads(line)
        errors = sorted(events.iter_errors(event), key=lambda e: e.path)
        assert not errors, f"{run_dir.name} line {number} ({event.get('kind')}): {errors[0].message}"
        kinds.add(event["kind"])
    return kinds


def test_the_shipped_schema_files_are_those_the_records_generate() -> None:
    assert stale_files() == [], "run: python -m rexmle_agents.results.schemas --write"
    assert set(SCHEMAS) == {"spec", "status", "journal-event", "grade", "cluster", "group-report"}
    kinds = {d["properties"]["kind"]["const"] for d in load_schema("journal-event")["$defs"].values()
             if "kind" in d.get("properties", {})}
    assert EXPECTED_KINDS | {"run_resumed", "step_interrupted", "budget_exhausted", "agent_error", "warning"} <= kinds


def test_run_folders_of_every_agent_validate_against_the_published_schema(agent_runs: dict[str, Path]) -> None:
    seen: set[str] = set()
    for run_dir in agent_runs.values():
        seen |= validate_folder(run_dir)
        run = load_run(run_dir)
        run.journal()
        assert run.problems == [], run.problems
    assert seen >= EXPECTED_KINDS, EXPECTED_KINDS - seen
    report = build_group_report(load_runs([next(iter(agent_runs.values())).parent]), replicates=50)
    validator("group-report").validate(json.loads(report.model_dump_json()))


def test_the_schema_rejects_what_the_format_does_not_allow(agent_runs: dict[str, Path]) -> None:
    events = validator("journal-event")
    line = json.loads((agent_runs["aide"] / "journal.jsonl").read_text().splitlines()[1])
    assert events.is_valid(line)
    assert not events.is_valid({**line, "kind": "no_such_event"})
    assert not events.is_valid({k: v for k, v in line.items() if k != "time"})
    status = json.loads((agent_runs["aide"] / "status.json").read_text())
    assert validator("status").is_valid(status)
    assert not validator("status").is_valid({**status, "state": "exploded"})


def test_every_event_carries_its_time_as_unix_seconds(agent_runs: dict[str, Path]) -> None:
    events = [json.loads(line) for line in (agent_runs["aide"] / "journal.jsonl").read_text().splitlines()]
    assert [e for e in events if e["kind"] == "model_call"], "the scripted model was called"
    assert all(isinstance(e["time"], float) for e in events)
    times = [e["time"] for e in events]
    assert times == sorted(times) and times[-1] - times[0] < 600


def test_status_started_at_is_the_first_attempts_start_not_the_last_write(agent_runs: dict[str, Path]) -> None:
    for name, run_dir in agent_runs.items():
        status = json.loads((run_dir / "status.json").read_text())
        started = dt.datetime.fromisoformat(status["started_at"])
        finished = dt.datetime.fromisoformat(status["finished_at"])
        first_event = json.loads((run_dir / "journal.jsonl").read_text().splitlines()[0])["time"]
        assert started < finished, name
        assert abs(started.timestamp() - first_event) < 5, name
        assert status["hardware"]["cpus"] >= 1 and status["format_version"] == 1


def test_a_folder_written_before_the_unified_time_format_is_read(agent_runs: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    old = tmp_path / GROUP / agent_runs["aide"].name
    shutil.copytree(agent_runs["aide"], old)
    lines = (old / "journal.jsonl").read_text().splitlines()
    expected = []
    rewritten = []
    for line in lines:
        event = json.loads(line)
        if event["kind"] == "model_call":  # the way the ledger wrote it before: an ISO string
            expected.append(event["time"])
            event["time"] = dt.datetime.fromtimestamp(event["time"], dt.timezone.utc).isoformat()
            line = json.dumps(event)
        rewritten.append(line)
    (old / "journal.jsonl").write_text("\n".join(rewritten) + "\n")
    grade = json.loads((old / "grade.json").read_text())
    del grade["synthetic"]  # grades written before they said
    (old / "grade.json").write_text(json.dumps(grade))
    status = json.loads((old / "status.json").read_text())
    for key in ("format_version", "hardware", "input_tokens", "output_tokens", "uncosted_calls"):
        status.pop(key)
    (old / "status.json").write_text(json.dumps(status))
    run = load_run(old)
    calls = run.journal().of_kind("model_call")
    assert [round(c.time, 3) for c in calls] == [round(t, 3) for t in expected]
    assert run.problems == [] and run.status.hardware is None
    assert run.synthetic is True  # from the task's prepared data, which is still there
    assert validator("journal-event").is_valid(json.loads(rewritten[[json.loads(x)["kind"] for x in rewritten]
                                                                   .index("model_call")]))


@pytest.mark.parametrize(("version", "says"), [(None, "before run formats were versioned"),
                                               (2, "in run format 2")])
def test_a_folder_of_another_run_format_is_refused_with_what_to_do(agent_runs: dict[str, Path], tmp_path: Path,
                                                                   version: int | None, says: str) -> None:
    other = tmp_path / GROUP / "other-run"
    shutil.copytree(agent_runs["sample-s0"], other)
    spec = json.loads((other / "spec.json").read_text())
    if version is None:
        del spec["format_version"]
    else:
        spec["format_version"] = version
    (other / "spec.json").write_text(json.dumps(spec))
    with pytest.raises(RunFormatError, match=says) as caught:
        load_run(other)
    assert "reads run format 1" in caught.value.message and "rexmle-agents" in (caught.value.hint or "")
    shutil.copytree(agent_runs["sample-s1"], tmp_path / GROUP / agent_runs["sample-s1"].name)
    runs = load_runs([tmp_path / GROUP])
    assert [r.spec.task_id for r in runs.runs] == [TASK]
    assert [p.name for p, _ in runs.refused] == ["other-run"]


def test_a_record_that_breaks_the_format_is_listed_never_guessed(agent_runs: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / GROUP / agent_runs["sample-s0"].name
    shutil.copytree(agent_runs["sample-s0"], broken)
    with (broken / "journal.jsonl").open("a") as handle:
        handle.write(json.dumps({"kind": "exec_finished", "time": 1.0, "name": "x"}) + "\n")
        handle.write(json.dumps({"kind": "teleported", "time": 2.0}) + "\n")
        handle.write('{"kind": "log", "time": 3.0, "mess')  # a torn last line: a crash mid-write, never an error
    run = load_run(broken)
    problems = run.journal().problems
    assert len(problems) == 2, problems
    assert "exec_finished does not match" in problems[0] and "unknown event kind 'teleported'" in problems[1]


@pytest.mark.slow
def test_a_baseline_agents_run_folder_validates_against_the_published_schema(data_root: Path, tmp_path: Path) -> None:
    """The baseline agent trains with torch inside the sandbox (about 20 s on 2 cores): one epoch of the quick
    timm regressor on the synthetic task."""
    pytest.importorskip("rexmle_baselines")
    pytest.importorskip("timm")
    from rexmle_agents.harness.runner import build_spec, execute_run

    spec = build_spec(TASK, agent="baseline", agent_config={"config": "quick", "set": {"epochs": 1}},
                      data_root=data_root, group=GROUP)
    outcome = execute_run(spec, tmp_path)
    assert outcome.state == "finished", outcome.reason
    kinds = validate_folder(outcome.run_dir)
    assert {"run_started", "step_started", "exec_finished", "snapshot", "final_selected", "graded"} <= kinds
    run = load_run(outcome.run_dir)
    run.journal()
    assert run.problems == [] and run.synthetic is True
    assert run.journal().of_kind("step_started")[0].info["baseline"] == "timm-regress"
