"""The harness end to end with real sandboxed processes: run folder, journal, budgets, final submission, grading,
resume after SIGKILL, and the errors a user meets first."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.runner import build_spec, execute_run, read_spec
from rexmle_agents.harness.spec import Limits, Resources
from rexmle_grade.errors import RexmleError, TaskDataMissingError, UnknownNameError, UserInputError

TASK = "ldct-iqa"  # the task conftest.py prepares
# CI's set-up installs bubblewrap: there a missing bwrap must fail these tests, not skip them silently
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("CI"),
                                reason="bubblewrap is not installed (apt-get install -y bubblewrap)")


def kinds(run_dir: Path) -> list[str]:
    return [e["kind"] for e in Journal(run_dir / "journal.jsonl").events()]


def test_sample_agent_runs_in_the_sandbox_and_is_graded(data_root: Path, tmp_path: Path) -> None:
    spec = build_spec(TASK, agent="sample", data_root=data_root, group="g")
    outcome = execute_run(spec, tmp_path)
    assert outcome.state == "finished", outcome.reason
    run = outcome.run_dir
    assert run == tmp_path / "g" / spec.run_id
    for name in ("spec.json", "status.json", "journal.jsonl", "grade.json", "workspace/instructions.md",
                 "final/submission/submission.csv", "final/metadata.json"):
        assert (run / name).exists(), name
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    events = kinds(run)
    for kind in ("run_started", "step_started", "exec_started", "exec_finished", "snapshot", "validation",
                 "final_selected", "step_finished", "final_collected", "run_finished", "graded"):
        assert kind in events, kind
    assert outcome.grade is not None and outcome.grade.status == "valid"
    assert outcome.grade.labels["agent"] == "sample" and outcome.grade.labels["run_id"] == spec.run_id
    # the public data is a read-only view, not a copy
    assert not any((run / "workspace" / "data").iterdir())
    instructions = (run / "workspace" / "instructions.md").read_text()
    assert "python -m rexmle_agents.validate" in instructions and "/workspace/data" in instructions
    # the same spec again: nothing runs, the graded outcome is read back
    again = execute_run(spec, tmp_path)
    assert again.state == "finished" and kinds(run).count("run_started") == 1
    assert again.grade is not None and again.grade.metrics == outcome.grade.metrics


def test_a_tiny_model_trained_in_the_sandbox_beats_the_sample(data_root: Path, tmp_path: Path) -> None:
    sample = execute_run(build_spec(TASK, agent="sample", data_root=data_root), tmp_path)
    fitted = execute_run(build_spec(TASK, agent="test-noise-fit", data_root=data_root), tmp_path)
    assert fitted.state == "finished", fitted.reason
    assert fitted.grade is not None and fitted.grade.status == "valid"
    assert fitted.grade.metrics["score"] > sample.grade.metrics["score"]
    assert (fitted.run_dir / "final" / "best_solution.py").read_text().startswith("\nimport csv")
    code_events = [e for e in Journal(fitted.run_dir / "journal.jsonl").events() if e["kind"] == "code_written"]
    assert code_events and "np.polyfit" in code_events[0]["code"]


def test_validation_command_works_inside_the_sandbox(data_root: Path, tmp_path: Path) -> None:
    commands = ["python -m rexmle_agents.validate",  # empty submission: invalid, problems listed
                "cp -R /workspace/data/sample_submission/. /workspace/submission/ && python -m rexmle_agents.validate",
                f"rexmle grade validate {TASK} /workspace/submission"]
    spec = build_spec(TASK, agent="test-commands", agent_config={"commands": commands}, data_root=data_root)
    outcome = execute_run(spec, tmp_path)
    steps = [e for e in Journal(outcome.run_dir / "journal.jsonl").events() if e["kind"] == "step_finished"]
    assert steps[0]["result"]["exit_code"] == 1 and "INVALID" in steps[0]["result"]["stdout"]
    assert steps[1]["result"]["exit_code"] == 0 and "valid:" in steps[1]["result"]["stdout"]
    assert steps[2]["result"]["exit_code"] == 0 and "valid" in steps[2]["result"]["stdout"]


def test_runaway_commands_are_stopped_recorded_and_the_harness_survives(data_root: Path, tmp_path: Path) -> None:
    commands = [
        "sleep 60",  # per-execution timeout
        "python -c 'import os\nwhile True:\n    os.fork()'",  # fork bomb: process limit
        "python -c 'x = []\nwhile True: x.append(bytearray(50 * 2**20))'",  # memory runaway
        "echo still alive",
    ]
    spec = build_spec(TASK, agent="test-commands", data_root=data_root,
                      agent_config={"commands": commands, "timeout_s": 2, "submit_sample_first": True},
                      limits=Limits(time_limit_s=120, exec_timeout_s=20),
                      resources=Resources(memory_gb=0.5, max_processes=64))
    started = time.monotonic()
    outcome = execute_run(spec, tmp_path)
    assert time.monotonic() - started < 60
    assert outcome.state == "finished", outcome.reason
    execs = [e for e in Journal(outcome.run_dir / "journal.jsonl").events() if e["kind"] == "exec_finished"]
    stopped = [e["stopped_by"] for e in execs[1:]]  # the first copies the sample submission
    assert stopped[0] == "timeout"
    assert stopped[1] is not None or execs[2]["exit_code"] != 0  # stopped by the process limit (or failed by it)
    assert stopped[2] is not None or execs[3]["exit_code"] != 0  # stopped by the memory limit
    assert execs[4]["exit_code"] == 0 and "still alive" in execs[4]["stdout_tail"]
    assert outcome.grade is not None and outcome.grade.status == "valid"  # the sample submitted first


def test_time_limit_ends_the_run_and_the_best_submission_is_still_graded(data_root: Path, tmp_path: Path) -> None:
    spec = build_spec(TASK, agent="test-commands", data_root=data_root,
                      agent_config={"commands": ["sleep 100"], "submit_sample_first": True},
                      limits=Limits(time_limit_s=3, exec_timeout_s=100))
    started = time.monotonic()
    outcome = execute_run(spec, tmp_path, grace_s=5)
    assert time.monotonic() - started < 20
    assert outcome.state == "timed_out" and outcome.limit == "time"
    assert outcome.grade is not None and outcome.grade.status == "valid"
    assert "budget_exhausted" in kinds(outcome.run_dir)


def test_step_limit_ends_the_run_as_finished_with_the_limit_named(data_root: Path, tmp_path: Path) -> None:
    spec = build_spec(TASK, agent="test-commands", data_root=data_root,
                      agent_config={"commands": ["true"] * 5}, limits=Limits(max_steps=2))
    outcome = execute_run(spec, tmp_path)
    assert outcome.state == "finished" and outcome.limit == "steps" and outcome.steps == 2
    assert outcome.grade is not None and outcome.grade.status == "missing"


def test_a_failing_agent_is_recorded_as_failed_with_its_error(data_root: Path, tmp_path: Path) -> None:
    spec = build_spec(TASK, agent="test-commands", data_root=data_root, agent_config={"commands": [12]})
    outcome = execute_run(spec, tmp_path)
    assert outcome.state == "failed" and "raised" in outcome.reason
    assert (outcome.run_dir / "logs" / "agent_error.txt").is_file()


RESUMABLE = """
import sys
sys.path.insert(0, {tests!r})
import conftest  # registers the test agents
from rexmle_agents.harness.runner import build_spec, execute_run
spec = build_spec({task!r}, agent="test-commands", data_root={data!r},
                  agent_config={{"commands": ["sleep 0.3; echo step-$RANDOM"] * 6}})
print(execute_run(spec, {runs!r}).state)
"""


def test_a_run_killed_with_sigkill_resumes_without_losing_a_finished_step(data_root: Path, tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(RESUMABLE.format(tests=str(Path(__file__).parent), task=TASK, data=str(data_root),
                                       runs=str(tmp_path / "runs")))
    harness = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    journal = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = list((tmp_path / "runs").glob("default/*/journal.jsonl"))
        if found and sum(e["kind"] == "step_finished" for e in Journal(found[0]).events()) >= 2:
            journal = found[0]
            break
        time.sleep(0.05)
    assert journal is not None, harness.communicate()
    os.kill(harness.pid, signal.SIGKILL)
    harness.wait()
    before = [e for e in Journal(journal).events() if e["kind"] == "step_finished"]
    assert 2 <= len(before) < 6
    second = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert second.stdout.strip().endswith("finished"), second.stderr
    events = Journal(journal).events()
    finished = [e for e in events if e["kind"] == "step_finished"]
    assert finished[: len(before)] == before  # nothing that finished was lost or rewritten
    assert [e["kind"] for e in events].count("run_resumed") == 1
    index_of = {e["step"]: e["info"]["index"] for e in events if e["kind"] == "step_started"}
    done = [index_of[e["step"]] for e in finished]
    interrupted = [index_of[e["step"]] for e in events if e["kind"] == "step_interrupted"]
    assert len(set(done)) == len(done)  # no finished command ran twice
    # every command finished; one cut by the kill was run again, unless its state was already saved
    assert set(done) | set(interrupted) == set(range(6)) and len(interrupted) <= 1


def test_a_run_folder_of_another_format_is_refused(data_root: Path, tmp_path: Path) -> None:
    spec = build_spec(TASK, agent="sample", data_root=data_root)
    outcome = execute_run(spec, tmp_path)
    raw = json.loads((outcome.run_dir / "spec.json").read_text())
    raw["format_version"] = 999
    (outcome.run_dir / "spec.json").write_text(json.dumps(raw))
    with pytest.raises(UserInputError, match="run format 999"):
        read_spec(outcome.run_dir)
    with pytest.raises(UserInputError, match="run format 999"):
        execute_run(spec, tmp_path)


def test_bad_input_is_one_clear_error(data_root: Path, tmp_path: Path) -> None:
    with pytest.raises(UnknownNameError, match="did you mean 'sample'"):
        build_spec(TASK, agent="sampel", data_root=data_root)
    with pytest.raises(UnknownNameError, match="unknown task"):
        build_spec("ldct-iq", agent="sample", data_root=data_root)
    with pytest.raises(TaskDataMissingError, match="rexmle prepare isles22"):
        build_spec("isles22", agent="sample", data_root=tmp_path)
    # more GPUs than this machine has is no error of the spec: the executor that places the run refuses it (the
    # local one here; sbatch on a cluster, whose submit host has none): test_cli_executors.py
    assert build_spec(TASK, agent="sample", data_root=data_root, resources=Resources(gpus=8)).resources.gpus == 8
    with pytest.raises(RexmleError, match="allow"):
        build_spec(TASK, agent="sample", data_root=data_root, sandbox="none")
    with pytest.raises(UnknownNameError):
        build_spec(TASK, agent="sample", data_root=data_root, sandbox="chroot")
    with pytest.raises(RexmleError, match=r"apptainer|image"):  # absent here, or present without an image
        build_spec(TASK, agent="sample", data_root=data_root, sandbox="apptainer")
    with pytest.raises(UserInputError, match="no setting"):
        build_spec(TASK, agent="baseline", data_root=data_root, agent_config={"bogus": 1})
    with pytest.raises(UserInputError, match="cassette"):
        build_spec(TASK, agent="sample", data_root=data_root, models={"code": "replay:/nonexistent.jsonl"})
    with pytest.raises(UnknownNameError, match="model provider"):
        build_spec(TASK, agent="sample", data_root=data_root, models={"code": "opnai/gpt-5"})


def test_unsandboxed_runs_need_the_flag_and_are_marked(data_root: Path, open_runs_dir: Path) -> None:
    spec = build_spec(TASK, agent="sample", data_root=data_root, sandbox="none", allow_unsandboxed=True)
    outcome = execute_run(spec, open_runs_dir)
    assert outcome.state == "finished", outcome.reason
    assert outcome.grade is not None and outcome.grade.labels["sandbox"].startswith("NONE")
    assert any(e["kind"] == "warning" and "without a sandbox" in e["message"]
               for e in Journal(outcome.run_dir / "journal.jsonl").events())


def test_journal_survives_a_torn_last_line(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    journal.append("one", step=1, x=1)
    with journal.path.open("a") as handle:
        handle.write('{"kind": "two", "tim')
    assert [e["kind"] for e in journal.events()] == ["one"]
    assert journal.repair() > 0
    journal.append("three")
    assert [e["kind"] for e in journal.events()] == ["one", "three"]
    journal.path.write_text('{"kind": "one"}\nnot json\n{"kind": "two"}\n')
    with pytest.raises(RexmleError, match="line 2"):
        journal.events()


def test_run_ids_are_stable_and_depend_on_what_runs(data_root: Path) -> None:
    a = build_spec(TASK, agent="sample", data_root=data_root, group="x")
    b = build_spec(TASK, agent="sample", data_root=data_root, group="y")
    c = build_spec(TASK, agent="sample", data_root=data_root, seed=1)
    assert a.run_id == b.run_id != c.run_id
    assert a.run_id.startswith(f"{TASK}.sample.s0.")


def test_resume_by_folder_continues_the_same_run(data_root: Path, tmp_path: Path) -> None:
    spec = build_spec(TASK, agent="test-commands", data_root=data_root, agent_config={"commands": ["true"] * 3},
                      limits=Limits(max_steps=1))
    first = execute_run(spec, tmp_path)
    assert first.limit == "steps"
    # a finished run stays finished: resuming reads it back
    assert execute_run(read_spec(first.run_dir), tmp_path).steps == 1



def test_selection_split_chooses_the_final_submission_by_held_out_cases(data_root: Path, tmp_path: Path) -> None:
    """--selection-cases: the agent sees K fewer training cases and K more inputs; every valid snapshot is graded
    on those K with the task's grader; the best of them is submitted, whatever the agent chose; the final grade
    is on the real test cases only."""
    from rexmle_agents.harness.paths import RunPaths
    from rexmle_agents.harness.runner import selection_split

    spec = build_spec(TASK, agent="test-noise-fit", data_root=data_root, selection_cases=4)
    assert spec.selection_cases == 4 and spec.run_id != build_spec(TASK, agent="test-noise-fit",
                                                                   data_root=data_root).run_id
    outcome = execute_run(spec, tmp_path)
    assert outcome.state == "finished", outcome.reason
    selection = selection_split(spec, RunPaths(outcome.run_dir))  # the run's own split, drawn when it started
    events = Journal(outcome.run_dir / "journal.jsonl").events()
    snapshot = next(e for e in events if e["kind"] == "snapshot")
    assert snapshot["selection"]["k"] == 4 and snapshot["selection"]["status"] == "valid"
    assert snapshot["selection"]["metrics"]  # the held-out number, recorded beside the agent's own
    rows = (outcome.run_dir / "final" / "submission" / "submission.csv").read_text().splitlines()[1:]
    predicted = {r.split(",")[0] for r in rows}
    assert predicted == set(selection.selection_ids) | set(selection.test_ids)
    grade = outcome.grade
    assert grade is not None and grade.status == "valid" and grade.labels["selection_cases"] == "4"
    assert sorted(row["image_id"] for row in grade.per_case) == sorted(selection.test_ids)
    train = (selection.agent_public / "train" / "labels.csv").read_text()
    assert not any(f"\n{selection.case_of(i)}," in train for i in selection.selection_ids)


def test_choose_final_prefers_the_best_selection_score() -> None:
    from rexmle_agents.harness.runner import choose_final

    events = [
        {"kind": "snapshot", "snapshot": "a", "valid": True, "selection": {"score": 3.0}},
        {"kind": "snapshot", "snapshot": "b", "valid": True, "selection": {"score": 2.0}},
        {"kind": "snapshot", "snapshot": "c", "valid": False, "selection": None},
        {"kind": "final_selected", "snapshot": "a"},
    ]
    assert choose_final(events) == "b"
    assert choose_final([{**e, "selection": None} if e["kind"] == "snapshot" else e for e in events]) == "a"
    assert choose_final(events[:3]) == "b" and choose_final([events[2]]) == "c"
