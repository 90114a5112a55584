"""rexmle in Inspect, offline and end to end: ``rexmle/ldct-iqa`` run by Inspect's ReAct agent driven by a scripted
tool-calling model, in rexmle's bubblewrap sandbox, scored by rexmle's grader, re-scored from the log alone, and
imported back as rexmle run folders that ``rexmle report`` reads."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from .conftest import TASK

inspect_ai = pytest.importorskip("inspect_ai", reason="Inspect is not installed: pip install 'rexmle-agents[inspect]' "
                                                       "(tools/setup.sh --dev installs it)")

from .inspect_model import SCRIPT_API  # noqa: E402  (registers the scripted model with Inspect)

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("CI"),
                                reason="bubblewrap is not installed (apt-get install -y bubblewrap)")

SECRET = "sk-rexmle-test-secret-0123456789"
SAMPLE_COPY = ("cp /workspace/data/sample_submission/submission.csv /workspace/submission/submission.csv "
               "&& python -m rexmle_agents.validate")


def _eval(commands: list[str], data_root: Path, tmp_path: Path, **task_args: Any) -> Any:
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import get_model

    work = tmp_path / "work"
    logs = inspect_eval(f"rexmle/{TASK}", model=get_model(f"{SCRIPT_API}/script", commands=commands),
                        task_args={"data_root": str(data_root), "time_limit": "10m", "work_dir": str(work),
                                   **task_args},
                        log_dir=str(tmp_path / "logs"), display="none")
    assert len(logs) == 1 and logs[0].status == "success", logs[0].error
    return logs[0]


def _expected(data_root: Path, submission_dir: Path) -> float:
    from rexmle_grade.evaluate import evaluate_submission
    from rexmle_grade.targets import resolve_target

    return evaluate_submission(resolve_target(TASK, data_root), submission_dir).percentile


def _tool_outputs(sample: Any) -> list[str]:
    return [m.text + (m.error.message if m.error is not None else "") for m in sample.messages if m.role == "tool"]


@pytest.fixture(scope="module")
def sample_eval(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """One eval: the agent copies the sample submission, validates it, then tries to leave its sandbox."""
    from rexmle_tasks.pipeline import task_dirs
    from rexmle_tasks.registry import get_task

    private = task_dirs(get_task(TASK), data_root).private
    attack = " ; ".join([
        'echo "uid: $(id -u)"',
        f'echo "private: $(ls {shlex.quote(str(private))} 2>&1 | head -1)"',
        'echo "data: $( (echo planted > /workspace/data/planted.txt) 2>&1 | head -1)"',
        'echo "network: $(python -c "import socket; socket.create_connection((\'1.1.1.1\', 53), timeout=3)" 2>&1'
        ' | tail -1)"',
        f'echo "key: $(env | grep -c {SECRET})"',
    ])
    tmp = tmp_path_factory.mktemp("inspect-sample")
    os.environ["OPENAI_API_KEY"] = SECRET
    try:
        log = _eval([SAMPLE_COPY, attack], data_root, tmp)
    finally:
        del os.environ["OPENAI_API_KEY"]
    return log, tmp


def test_the_agent_submits_through_its_bash_tool_and_the_grader_scores_it(sample_eval, data_root: Path) -> None:
    from rexmle_tasks.pipeline import task_dirs
    from rexmle_tasks.registry import get_task

    log, _ = sample_eval
    sample = log.samples[0]
    score = sample.scores["score"]
    expected = _expected(data_root, task_dirs(get_task(TASK), data_root).public / "sample_submission")
    assert score.value == pytest.approx(expected)
    assert score.metadata["valid"] is True and score.metadata["status"] == "valid"
    assert score.metadata["percentile"] == pytest.approx(expected) and score.metadata["position"] is not None
    assert set(score.metadata["metrics"]) >= {"score", "plcc", "srocc", "krocc"}
    assert score.metadata["synthetic"] is True and score.metadata["medal"] in (None, "gold", "silver", "bronze")
    assert "valid:" in _tool_outputs(sample)[0]  # rexmle's validator ran inside the sandbox
    assert log.results.scores[0].metrics["mean"].value == pytest.approx(expected)
    assert log.results.scores[0].metrics["valid_rate"].value == 1.0


def test_the_sample_ran_in_rexmles_sandbox(sample_eval) -> None:
    """The agent's own attempts, from inside: private data, writing the public data, the network, the key."""
    log, tmp = sample_eval
    output = _tool_outputs(log.samples[0])[1]
    seen = dict(line.split(": ", 1) for line in output.splitlines() if ": " in line)
    if os.geteuid() == 0:
        assert seen["uid"] != "0"  # dropped to the sample's own identity
    assert "No such file or directory" in seen["private"], output  # the private labels are not there
    assert "Read-only file system" in seen["data"] or "Permission denied" in seen["data"], output
    assert "Error" in seen["network"] or "unreachable" in seen["network"].lower(), output
    assert seen["key"] == "0", output  # the host's API key is not in the sandbox's environment
    assert not any((tmp / "work").iterdir())  # the sample's run folder went with the sample


def test_the_gold_submission_scores_the_gold_percentile(data_root: Path, tmp_path: Path) -> None:
    from rexmle_tasks.pipeline import task_dirs
    from rexmle_tasks.registry import get_task

    task = get_task(TASK)
    dirs = task_dirs(task, data_root)
    gold = tmp_path / "gold"
    task.grader.write_gold_submission(dirs.private, dirs.public, gold)
    csv_text = (gold / "submission.csv").read_text()
    write = f"cat > /workspace/submission/submission.csv <<'EOF'\n{csv_text}EOF"
    log = _eval([write], data_root, tmp_path)
    score = log.samples[0].scores["score"]
    expected = _expected(data_root, gold)
    assert expected > 0 and score.value == pytest.approx(expected)
    assert score.metadata["medal"] == "gold" or not score.metadata["any_medal"]


def test_rescoring_the_log_grades_the_stored_submission_without_a_sandbox(sample_eval) -> None:
    from inspect_ai import score as inspect_score
    from inspect_ai.log import read_eval_log

    from rexmle_agents.integrations.inspect.scorer import rexmle_scorer

    log, tmp = sample_eval
    assert not any((tmp / "work").iterdir())  # no workspace is left to read from
    stored = read_eval_log(log.location)
    rescored = inspect_score(stored, rexmle_scorer(), display="none")
    before, after = log.samples[0].scores["score"], rescored.samples[0].scores["score"]
    assert after.value == pytest.approx(before.value)
    assert after.metadata["metrics"] == before.metadata["metrics"]


def test_import_inspect_writes_run_folders_that_report_and_view_read(sample_eval, data_root: Path,
                                                                      tmp_path: Path, capsys) -> None:
    import jsonschema

    from rexmle_agents.results.loader import load_runs
    from rexmle_agents.results.schemas import load_schema
    from rexmle_grade.cli import main

    log, _ = sample_eval
    runs = tmp_path / "runs" / "inspect"
    assert main(["--data-dir", str(data_root), "import", "inspect", log.location, "--runs-dir", str(runs)]) == 0
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    for name in ("spec", "status", "grade"):
        jsonschema.validate(json.loads((run_dir / f"{name}.json").read_text()), load_schema(name))
    event_schema = load_schema("journal-event")
    events = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    for event in events:
        jsonschema.validate(event, event_schema)
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "graded" and kinds.count("agent_turn") == 3
    turns = [e for e in events if e["kind"] == "agent_turn"]
    assert turns[0]["tool_calls"][0]["name"] == "bash" and "valid:" in turns[0]["tool_results"][0]["output"]
    assert turns[-1]["tool_calls"][0]["name"] == "submit"
    assert kinds.count("model_call") == 3

    (record,) = list(load_runs([runs], strict=True))
    assert record.spec.agent == "inspect" and record.spec.agent_config["origin"] == "inspect"
    assert record.spec.models == {"default": f"{SCRIPT_API}/script"}
    assert record.status.state == "finished" and record.status.model_calls == 3
    assert record.grade.percentile == pytest.approx(log.samples[0].scores["score"].value)
    assert record.grade.labels["origin"] == "inspect"
    assert (run_dir / "final" / "submission" / "submission.csv").is_file()

    capsys.readouterr()
    assert main(["--data-dir", str(data_root), "report", str(runs), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["task_id"] for r in report["runs"]] == [TASK] and report["runs"][0]["agent"] == "inspect"
    assert main(["view", str(run_dir)]) == 0
    assert "step 1: running a command" in (run_dir / "view.html").read_text()
    analysis = tmp_path / "analysis"
    assert main(["--data-dir", str(data_root), "analyse", "runs", str(runs), "-o", str(analysis)]) == 0
    assert (analysis / "manifest.json").is_file() and len(list((analysis / "runs").glob("*.json"))) == 1

    # a second import keeps what was imported
    assert main(["--data-dir", str(data_root), "import", "inspect", log.location, "--runs-dir", str(runs)]) == 0
    assert "kept" in capsys.readouterr().out


def test_the_sandbox_files_and_commands(data_root: Path, tmp_path: Path) -> None:
    """exec (cwd, env, stdin, timeout), write_file as the agent, read_file never following the agent's links."""
    from inspect_ai.util._sandbox.environment import SandboxUserUnsupportedError

    from rexmle_agents.integrations.inspect.sandbox import RexmleSandboxConfig, RexmleSandboxEnvironment
    from rexmle_agents.integrations.inspect.spec import SampleOptions, sample_spec
    from rexmle_tasks.pipeline import task_dirs
    from rexmle_tasks.registry import get_task

    private = task_dirs(get_task(TASK), data_root).private
    label_file = next(p for p in private.rglob("*") if p.is_file())
    spec = sample_spec(TASK, SampleOptions(data_root=str(data_root), exec_timeout_s=60))
    config = RexmleSandboxConfig(spec=spec.model_dump_json(), work_dir=str(tmp_path / "work"))

    async def scenario() -> None:
        envs = await RexmleSandboxEnvironment.sample_init("t", config, {})
        env = envs["default"]
        try:
            done = await env.exec(["sh", "-c", 'pwd; echo "$GREETING"; cat'], input="from stdin", cwd="sub/..",
                                  env={"GREETING": "hello"})
            assert done.success and done.stdout.split("\n")[:3] == ["/workspace/working", "hello", "from stdin"]
            await env.write_file("notes/a.txt", "written")
            assert await env.read_file("/workspace/working/notes/a.txt") == "written"
            owner = await env.exec(["sh", "-c", "echo more >> notes/a.txt && stat -c %u notes/a.txt && id -u"])
            uid_file, uid_agent = owner.stdout.split()
            assert owner.success and uid_file == uid_agent  # the agent's own file
            assert (await env.read_file("/workspace/data/description.md")).startswith("#")
            with pytest.raises(PermissionError):
                await env.write_file("/workspace/data/x.txt", "no")
            with pytest.raises(PermissionError):
                await env.read_file("/etc/passwd")
            # a link the agent plants to the private labels is never followed by the harness
            planted = await env.exec(["ln", "-s", str(label_file), "leak"])
            assert planted.success
            with pytest.raises(PermissionError):
                await env.read_file("leak")
            with pytest.raises(FileNotFoundError):
                await env.read_file("missing.txt")
            with pytest.raises(SandboxUserUnsupportedError):
                await env.exec(["true"], user="root")
            with pytest.raises(TimeoutError):
                await env.exec(["sleep", "30"], timeout=1)
        finally:
            await RexmleSandboxEnvironment.sample_cleanup("t", config, envs, False)
        assert not any((tmp_path / "work").iterdir())

    anyio.run(scenario)


def test_inspect_eval_cli_finds_rexmle_through_its_entry_point(data_root: Path, tmp_path: Path) -> None:
    """`inspect eval rexmle/ldct-iqa`, Inspect's own command line in a fresh process that imports nothing of rexmle:
    the task, sandbox and scorer come from the entry point. The process registers the scripted model first (Inspect's
    mockllm counts tokens with a tokenizer it downloads); it submits at once, so the submission is missing."""
    driver = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import inspect_model; "
              "from inspect_ai._cli.main import main; sys.argv[0] = 'inspect'; main()")
    done = subprocess.run([sys.executable, "-c", driver, str(Path(__file__).parent), "eval", f"rexmle/{TASK}",
                           "--model", f"{SCRIPT_API}/script", "-T", f"data_root={data_root}", "-T", "time_limit=5m",
                           "-T", f"work_dir={tmp_path / 'w'}", "--log-dir", str(tmp_path / "logs"),
                           "--display", "none", "--log-format", "json"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (log_file,) = list((tmp_path / "logs").glob("*.json"))
    log = json.loads(log_file.read_text())
    assert log["status"] == "success", log.get("error")
    assert log["eval"]["task"] == f"rexmle/{TASK}" and log["eval"]["task_args"]["time_limit"] == "5m"
    score = log["samples"][0]["scores"]["score"]
    assert score["value"] == 0.0 and score["metadata"]["valid"] is False
    assert log["samples"][0]["sandbox"]["type"] == "rexmle"


def test_a_selection_split_is_held_out_and_the_grade_uses_the_test_cases(data_root: Path, tmp_path: Path) -> None:
    log = _eval([SAMPLE_COPY.replace(" && python -m rexmle_agents.validate", "")
                 + " && wc -l < /workspace/submission/submission.csv"], data_root, tmp_path, selection_cases=2)
    sample = log.samples[0]
    score = sample.scores["score"]
    assert score.metadata["valid"] is True
    assert score.metadata["grade"]["labels"]["selection_cases"] == "2"
    assert len(score.metadata["grade"]["per_case"]) == 4  # the task's own test cases, not the selection cases
    assert int(_tool_outputs(sample)[0].split()[-1]) > 5  # the agent's sample submission also covers selection
    assert "selection_secret" in sample.store["rexmle_submission"]


def test_tasks_that_cannot_run_are_named_together_with_the_fix(data_root: Path, tmp_path: Path) -> None:
    from rexmle_agents.integrations.inspect.tasks import TASKS
    from rexmle_grade.errors import UserInputError

    with pytest.raises(UserInputError, match=r"isles22.*rexmle prepare isles22") as caught:
        TASKS["lite"](data_root=str(tmp_path))
    assert caught.value.message.count("not prepared") >= 2
    with pytest.raises(UserInputError, match="prepared as synthetic-easy"):
        TASKS[TASK](data_root=str(data_root), difficulty="realistic")
    with pytest.raises(UserInputError, match="duration"):
        TASKS[TASK](data_root=str(data_root), time_limit="soon")
    plain = TASKS[TASK](data_root=str(data_root))
    with_report = TASKS[TASK](data_root=str(data_root), expert_report=True, time_limit="2h")
    prompt = plain.dataset[0].input
    assert "/workspace/submission" in prompt and "-m rexmle_agents.validate" in prompt
    assert "# Expert report" not in prompt
    assert "# Expert report" in with_report.dataset[0].input
    assert plain.time_limit == 12 * 3600 and with_report.time_limit == 2 * 3600


def test_past_its_disk_limit_the_sandbox_runs_nothing_more_and_the_submission_is_scored(data_root: Path,
                                                                                         tmp_path: Path) -> None:
    from rexmle_agents.integrations.inspect.importer import import_logs
    from rexmle_agents.results.loader import load_runs

    fill = SAMPLE_COPY + " && head -c 3000000 /dev/urandom > /workspace/working/big.bin"
    log = _eval([fill, "echo never reached"], data_root, tmp_path, disk_gb=0.002)
    sample = log.samples[0]
    outputs = _tool_outputs(sample)
    assert "workspace disk limit exceeded" in outputs[0]
    assert "never reached" not in outputs[1] and "runs no further command" in outputs[1]
    assert sample.scores["score"].metadata["valid"] is True  # what the workspace held was graded
    (run,) = import_logs([Path(log.location)], tmp_path / "runs" / "inspect")
    (record,) = list(load_runs([run.run_dir], strict=True))
    assert record.status.state == "finished" and record.status.limit == "disk"
    assert record.status.reason.startswith("workspace disk limit exceeded")


def test_a_sample_asking_for_more_gpus_than_are_free_is_refused(data_root: Path, tmp_path: Path) -> None:
    from rexmle_agents.harness.hardware import gpu_ids
    from rexmle_agents.integrations.inspect.sandbox import RexmleSandboxConfig, RexmleSandboxEnvironment
    from rexmle_agents.integrations.inspect.spec import SampleOptions, sample_spec
    from rexmle_grade.errors import SandboxError

    wanted = len(gpu_ids()) + 1
    spec = sample_spec(TASK, SampleOptions(data_root=str(data_root), gpus=wanted))
    config = RexmleSandboxConfig(spec=spec.model_dump_json(), work_dir=str(tmp_path / "work"))
    with pytest.raises(SandboxError, match=f"needs {wanted} GPU"):
        anyio.run(RexmleSandboxEnvironment.sample_init, "t", config, {})
    assert not any((tmp_path / "work").iterdir())  # nothing is left of the refused sample
