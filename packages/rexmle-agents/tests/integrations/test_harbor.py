"""rexmle and Harbor: exported tasks checked by Harbor's own task loader and linter, the exported verifier run for
real (the oracle reaches the top, no submission scores as the sample does), trial folders written by Harbor's own
models imported back as run folders that `rexmle report` reads, and runs exported as ATIF validated by Harbor's
own trajectory model.

Harbor needs Python >= 3.12 (rexmle's venv may be older), so it lives in a virtual environment of its own, built
once at a pinned version into the agent-environment cache ($REXMLE_AGENT_ENVS or ~/.cache/rexmle/agent-envs) and
driven in subprocesses by :data:`HARBOR_SIDE`. The tests skip, saying why, where no Python >= 3.12 or no package
index is at hand. Harbor trials on a real engine: ../sandbox_docker/test_harbor_trials.py.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rexmle_agents.external.envs import cache_root
from rexmle_agents.integrations.harbor import (
    AGENT_USER,
    HARBOR_VERSION,
    SUBMISSION,
    ExportOptions,
    export_tasks,
    import_job,
)
from rexmle_grade.cli import main

TASK = "ldct-iqa"
PINNED_IMAGE = "python:3.11-slim@sha256:" + "0" * 64  # the linter checks the form of the pin, not the registry
HARBOR_SIDE = r'''
"""Harbor's own code on rexmle's files (run by the Harbor environment's Python)."""
import json, shutil, sys, warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

command, args = sys.argv[1], json.loads(sys.argv[2])
if command == "tasks":
    from harbor.lint.compose import ComposeLoadError
    from harbor.lint.models import COMPOSE_RULES, LintRule
    from harbor.lint.task import lint_task
    from harbor.models.task.task import Task
    out = {}
    for folder in args["folders"]:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a deprecated field would be a format we should not write
            task = Task(Path(folder))
        config = task.config
        out[folder] = {
            "name": task.name, "valid_dir": Task.is_valid_dir(Path(folder)), "instruction": task.instruction,
            "agent_timeout": config.agent.timeout_sec, "agent_user": config.agent.user,
            "cpus": config.environment.cpus, "memory_mb": config.environment.memory_mb,
            "storage_mb": config.environment.storage_mb, "gpus": config.environment.gpus,
            "network": config.environment.network_mode.value, "workdir": config.environment.workdir,
            "verifier_mode": config.verifier.environment_mode.value,
            "artifacts": [a if isinstance(a, str) else a.source for a in config.artifacts],
        }
        try:
            findings = lint_task(Path(folder))
        except ComposeLoadError as exc:  # compose rules need the Docker CLI: every other rule still runs
            findings = lint_task(Path(folder), selected_rules=set(LintRule) - COMPOSE_RULES)
            out[folder]["compose_lint"] = str(exc)
        out[folder]["lint"] = [f"{f.rule.value}: {f.message}" for f in findings]
    print(json.dumps(out))
elif command == "reward":
    from harbor.verifier.verifier import Verifier
    from harbor.models.trial.paths import TrialPaths
    paths = TrialPaths(Path(args["trial_dir"]))
    print(json.dumps(Verifier._parse_reward_json(SimpleNamespace(trial_paths=paths))))
elif command == "atif":
    from harbor.models.trajectories import Trajectory
    trajectory = Trajectory.model_validate(json.loads(Path(args["file"]).read_text()))
    print(json.dumps({"steps": len(trajectory.steps), "sources": [s.source for s in trajectory.steps],
                      "final": trajectory.final_metrics.model_dump() if trajectory.final_metrics else None}))
elif command == "trial":
    from harbor.models.agent.context import AgentContext
    from harbor.models.task.id import LocalTaskId
    from harbor.models.task.task import Task
    from harbor.models.trial.config import AgentConfig, TaskConfig, TrialConfig
    from harbor.models.trial.paths import TrialPaths
    from harbor.models.trial.result import AgentInfo, ExceptionInfo, ModelInfo, TrialResult
    from harbor.models.verifier.result import VerifierResult
    from harbor.verifier.verifier import Verifier
    task_dir = Path(args["task_dir"])
    task = Task(task_dir)
    paths = TrialPaths(Path(args["job_dir"]) / args["trial_name"])
    paths.mkdir()
    rewards = None
    if args.get("verifier_logs"):  # what the verifier wrote to /logs/verifier, as Harbor downloads it
        for item in Path(args["verifier_logs"]).iterdir():
            shutil.copy(item, paths.verifier_dir / item.name)
        rewards = Verifier._parse_reward_json(SimpleNamespace(trial_paths=paths))
    config = TrialConfig(task=TaskConfig(path=task_dir), trial_name=args["trial_name"],
                         trials_dir=Path(args["job_dir"]),
                         agent=AgentConfig(name=args["agent"], model_name=args.get("model"),
                                           override_timeout_sec=args.get("timeout")))
    start = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
    provider, _, model = (args.get("model") or "").rpartition("/")
    error = None
    if args.get("exception"):
        error = ExceptionInfo(exception_type=args["exception"], exception_message="the agent ran out of time",
                              exception_traceback="", occurred_at=start + timedelta(minutes=30))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Task.checksum: the trial lock's digest later
        checksum = task.checksum
    result = TrialResult(
        task_name=task.name, trial_name=args["trial_name"], trial_uri=paths.trial_dir.as_uri(),
        task_id=LocalTaskId(path=task_dir), task_checksum=checksum, config=config,
        agent_info=AgentInfo(name=args["agent"], version="1.2.3",
                             model_info=ModelInfo(name=model, provider=provider or None) if model else None),
        agent_result=AgentContext(n_input_tokens=args.get("input_tokens"), n_output_tokens=args.get("output_tokens"),
                                  cost_usd=args.get("cost")),
        verifier_result=VerifierResult(rewards=rewards) if rewards is not None else None,
        verifier_environment_mode="separate", exception_info=error,
        started_at=start, finished_at=start + timedelta(minutes=42))
    paths.config_path.write_text(config.model_dump_json(indent=4))
    paths.result_path.write_text(result.model_dump_json(indent=4))
    TrialResult.model_validate_json(paths.result_path.read_text())
    print(json.dumps({"trial_dir": str(paths.trial_dir)}))
'''


# ---------------------------------------------------------------------------------------------------------------
# Harbor's own environment


def _python_312() -> tuple[str, str] | None:
    """(an interpreter of Python >= 3.12, its version): this one, one on PATH, or one of pyenv's (a pyenv shim
    on PATH may name a version that is not selected, so each candidate is asked)."""
    pyenv = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates = [sys.executable, *(shutil.which(n) or "" for n in ("python3.13", "python3.12")),
                  *sorted(glob.glob(f"{pyenv}/versions/3.1[2-9]*/bin/python3.1[2-9]"))]
    for candidate in filter(None, candidates):
        done = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True)
        version = done.stdout.strip()
        if done.returncode == 0 and tuple(int(x) for x in version.split(".")) >= (3, 12):
            return candidate, version
    return None


@pytest.fixture(scope="session")
def harbor_python() -> Path:
    """The Python of a virtual environment holding Harbor at :data:`HARBOR_VERSION` (built once, then reused)."""
    found = _python_312()
    if found is None:
        pytest.skip("Harbor needs Python >= 3.12 and none was found (python3.12 on PATH, or pyenv)")
    base, version = found
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    env = root / f"harbor-{HARBOR_VERSION}-py{version}"
    marker = env / "rexmle-harbor-env.json"
    python = env / "bin" / "python"
    with (root / f"{env.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel sessions build once
        if not marker.is_file():
            shutil.rmtree(env, ignore_errors=True)
            subprocess.run([base, "-m", "venv", str(env)], check=True, capture_output=True)
            clean = {k: v for k, v in os.environ.items() if k not in ("PIP_CONSTRAINT", "PYTHONPATH", "VIRTUAL_ENV")}
            done = subprocess.run([str(python), "-m", "pip", "install", "-q", f"harbor=={HARBOR_VERSION}"],
                                  capture_output=True, text=True, env=clean, timeout=900)
            if done.returncode != 0:
                shutil.rmtree(env, ignore_errors=True)
                pytest.skip(f"harbor=={HARBOR_VERSION} could not be installed (no package index?): "
                            f"{done.stderr.strip()[-300:]}")
            marker.write_text(json.dumps({"harbor": HARBOR_VERSION, "python": version}) + "\n")
    return python


def harbor(python: Path, command: str, **args: Any) -> Any:
    done = subprocess.run([str(python), "-c", HARBOR_SIDE, command, json.dumps(args)], capture_output=True,
                          text=True, timeout=300, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------------
# the exported tasks


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    root = tmp_path_factory.mktemp("harbor-data")
    task = get_task(TASK)
    prepare_task(task, task_dirs(task, root), synthetic=True, cases=10, seed=0, force=False)
    return root


@pytest.fixture(scope="session")
def exported(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The task exported three ways: data copied (pinned image), data mounted (pinned image), and defaults."""
    out = tmp_path_factory.mktemp("harbor-out")
    copied = export_tasks([TASK], out / "copied", data_root=data_root,
                          options=ExportOptions(data="copy", base_image=PINNED_IMAGE, time_limit_s=5400, cpus=4,
                                                memory_gb=16, gpus=1))
    mounted = export_tasks([TASK], out / "mounted", data_root=data_root,
                           options=ExportOptions(data="mount", base_image=PINNED_IMAGE))
    default = export_tasks([TASK], out / "default", data_root=data_root)
    assert copied[0].data == "copied" and mounted[0].data == "mounted" and default[0].data == "copied"
    return {"copied": copied[0].folder, "mounted": mounted[0].folder, "default": default[0].folder}


def test_exported_tasks_load_in_harbor_with_the_budget_and_resources_and_pass_its_linter(
        harbor_python: Path, exported: dict[str, Path]) -> None:
    checked = harbor(harbor_python, "tasks", folders=[str(p) for p in exported.values()])
    copied, mounted, default = (checked[str(exported[k])] for k in ("copied", "mounted", "default"))
    assert copied["name"] == f"rexmle/{TASK}" and copied["valid_dir"] and mounted["valid_dir"]
    assert copied["agent_timeout"] == 5400 and copied["cpus"] == 4 and copied["memory_mb"] == 16 * 1024
    assert copied["gpus"] == 1 and copied["storage_mb"] > 20 * 1024
    assert copied["network"] == "no-network" and copied["workdir"] == "/workspace"
    assert copied["agent_user"] == AGENT_USER  # not root: it cannot touch the image's grader or data
    # the verifier runs in a fresh container that receives only the submission
    assert copied["verifier_mode"] == "separate" and copied["artifacts"] == [SUBMISSION]
    assert "python /opt/rexmle/validate.py" in copied["instruction"] and "LDCT" in copied["instruction"]
    assert "submission.csv" in copied["instruction"]  # the submission contract from the task's description
    assert copied["lint"] == [] and mounted["lint"] == []
    if shutil.which("docker") is None:  # Harbor lints a compose file through the Docker CLI
        assert "Docker CLI" in mounted["compose_lint"]
    # an image named without a digest is the one thing Harbor's linter asks the user to pin
    assert [f.split(":")[0] for f in default["lint"]] == ["unpinned-image"]
    assert default["agent_timeout"] == 12 * 3600 and default["gpus"] == 1


def test_the_export_command_writes_the_dataset_and_names_the_data_variable(
        data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("REXMLE_DATA_DIR", str(data_root))
    out = tmp_path / "dataset"
    assert main(["export", "harbor", str(out), "--tasks", TASK, "--data", "mount", "--time-limit", "90m",
                 "--gpus", "0", "--allow-host", "api.example.com"]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "public data mounted" in printed and "REXMLE_DATA_DIR" in printed and f"harbor run -p {out}" in printed
    toml = (out / TASK / "task.toml").read_text()
    assert "timeout_sec = 5400.0" in toml and "gpus = 0" in toml and 'network_mode = "allowlist"' in toml
    assert 'allowed_hosts = ["api.example.com"]' in toml
    assert "no GPU: train on the CPU" in (out / TASK / "instruction.md").read_text()


def test_exporting_a_task_that_is_not_prepared_names_the_command_that_prepares_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("REXMLE_DATA_DIR", str(tmp_path / "empty"))
    assert main(["export", "harbor", str(tmp_path / "dataset"), "--tasks", TASK]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "not prepared" in err and f"rexmle prepare {TASK} --synthetic" in err
    assert not (tmp_path / "dataset" / TASK).exists()


def _digests(folder: Path) -> dict[str, str]:
    return {hashlib.sha256(p.read_bytes()).hexdigest(): str(p) for p in folder.rglob("*") if p.is_file()}


def test_the_labels_are_only_in_the_verifier_and_large_data_is_mounted_not_copied(
        data_root: Path, exported: dict[str, Path]) -> None:
    folder = exported["copied"]
    private = data_root / TASK / "private"
    answers = {d for d, p in _digests(private).items() if not p.endswith("synthetic-secret")}
    assert answers <= set(_digests(folder / "tests" / "private"))
    for outside in ("environment",):
        leaked = answers & set(_digests(folder / outside))
        assert not leaked, f"label files in {outside}/: {[_digests(folder / outside)[d] for d in leaked]}"
    assert answers.isdisjoint(_digests(folder).keys() - _digests(folder / "tests").keys()
                              - _digests(folder / "solution").keys())
    assert not (folder / "tests" / "private" / "synthetic-secret").exists()
    # the image gets the public folder, unchanged
    assert _digests(folder / "environment" / "data") == {
        d: p.replace(str(data_root / TASK / "public"), str(folder / "environment" / "data"))
        for d, p in _digests(data_root / TASK / "public").items()}
    # mounted: nothing of the data in the task, a compose file binding $REXMLE_DATA_DIR/<task>/public read-only
    mounted = exported["mounted"]
    assert not (mounted / "environment" / "data").exists()
    compose = (mounted / "environment" / "docker-compose.yaml").read_text()
    assert "${REXMLE_DATA_DIR:?" in compose and f"}}/{TASK}/public:/workspace/data:ro" in compose
    assert "COPY data/" not in (mounted / "environment" / "Dockerfile").read_text()


def verify(folder: Path, submission: Path, logs: Path) -> subprocess.CompletedProcess[str]:
    """The exported verifier as Harbor runs it (tests/verify.py with the image's /opt/rexmle first on the path),
    on this machine's folders instead of the container's."""
    env = {**os.environ, "PYTHONPATH": str(folder / "environment" / "rexmle"),
           "REXMLE_VERIFIER_SUBMISSION": str(submission), "REXMLE_VERIFIER_DATA": str(folder / "environment" / "data"),
           "REXMLE_VERIFIER_LOGS": str(logs)}
    return subprocess.run([sys.executable, str(folder / "tests" / "verify.py")], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.fixture(scope="session")
def verified(exported: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Harbor-layout verifier folders of the oracle, an agent that wrote nothing, and a broken submission."""
    folder = exported["copied"]
    root = tmp_path_factory.mktemp("verifier")
    broken = root / "broken-submission"
    broken.mkdir()
    (broken / "submission.csv").write_text("image_id,quality_score\nnot-a-test-id,2.0\n")
    empty = root / "empty-submission"
    empty.mkdir()
    logs = {}
    for name, submission in (("oracle", folder / "solution" / "submission"), ("noop", empty), ("broken", broken)):
        done = verify(folder, submission, root / name / "verifier")
        assert done.returncode == 0, done.stderr[-3000:]
        logs[name] = root / name
    return logs


def test_the_verifier_gives_the_oracle_the_top_and_an_empty_submission_the_sample_score(
        harbor_python: Path, exported: dict[str, Path], verified: dict[str, Path], data_root: Path) -> None:
    from rexmle_grade.evaluate import evaluate_submission
    from rexmle_grade.report import ReportEntry
    from rexmle_grade.targets import resolve_target

    rewards = {name: harbor(harbor_python, "reward", trial_dir=str(path)) for name, path in verified.items()}
    oracle, noop, broken = rewards["oracle"], rewards["noop"], rewards["broken"]
    assert oracle["reward"] == 1.0 and oracle["valid"] == 1 and oracle["medal"] == 3
    assert oracle["fallback_to_sample"] == 0
    assert oracle["srocc"] == pytest.approx(1.0)
    sample = evaluate_submission(resolve_target(TASK, data_root), data_root / TASK / "public" / "sample_submission")
    assert noop["fallback_to_sample"] == 1 and noop["valid"] == 1
    assert noop["reward"] == (sample.percentile or 0.0) and noop["score"] == pytest.approx(sample.metrics["score"])
    assert broken["valid"] == 0 and broken["reward"] == 0.0 and broken["medal"] == 0
    grade = ReportEntry.model_validate_json((verified["broken"] / "verifier" / "grade.json").read_text())
    assert grade.status == "invalid_submission" and any("not-a-test-id" in p for p in grade.problems)
    grade = ReportEntry.model_validate_json((verified["oracle"] / "verifier" / "grade.json").read_text())
    assert grade.gold_medal and grade.labels["origin"] == "harbor" and grade.labels["split_digest"]


def test_the_image_validation_command_checks_a_submission_from_public_facts(exported: dict[str, Path],
                                                                            verified: dict[str, Path]) -> None:
    folder = exported["copied"]
    env = {**os.environ, "PYTHONPATH": str(folder / "environment" / "rexmle")}
    script = folder / "environment" / "rexmle" / "validate.py"
    data = folder / "environment" / "data"
    good = subprocess.run([sys.executable, str(script), str(folder / "solution" / "submission"), str(data)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert good.returncode == 0 and "is valid" in good.stdout
    bad = subprocess.run([sys.executable, str(script), str(verified["broken"].parent / "broken-submission"),
                          str(data)], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1 and "NOT valid" in bad.stdout and "not-a-test-id" in bad.stdout


# ---------------------------------------------------------------------------------------------------------------
# Harbor trials back as run folders


def test_harbor_trials_come_back_as_run_folders_that_report_reads(
        harbor_python: Path, exported: dict[str, Path], verified: dict[str, Path], tmp_path: Path, capsys) -> None:
    from rexmle_agents.results.loader import load_runs

    job = tmp_path / "jobs" / "2026-12-01__12-00-00"
    task_dir = str(exported["copied"])
    harbor(harbor_python, "trial", task_dir=task_dir, job_dir=str(job), trial_name=f"{TASK}__oracle1",
           agent="oracle", verifier_logs=str(verified["oracle"] / "verifier"), timeout=5400)
    harbor(harbor_python, "trial", task_dir=task_dir, job_dir=str(job), trial_name=f"{TASK}__claude1",
           agent="claude-code", model="anthropic/claude-sonnet-4-5", verifier_logs=str(verified["noop"] / "verifier"),
           input_tokens=12000, output_tokens=3400, cost=0.21)
    harbor(harbor_python, "trial", task_dir=task_dir, job_dir=str(job), trial_name=f"{TASK}__crashed",
           agent="codex", model="openai/gpt-5", exception="AgentTimeoutError")
    (job / "config.json").write_text("{}")  # the job's own files are not trials
    group = tmp_path / "runs" / "harbor"
    assert main(["import", "harbor", str(job), "--runs-dir", str(group)]) == 0
    runs = {run.spec.agent: run for run in load_runs([group])}
    assert set(runs) == {"harbor/oracle", "harbor/claude-code", "harbor/codex"}
    oracle, claude, crashed = runs["harbor/oracle"], runs["harbor/claude-code"], runs["harbor/codex"]
    for run in runs.values():
        assert not run.problems, run.problems
        assert run.spec.agent_config["origin"] == "harbor" and run.spec.sandbox == "harbor"
        assert run.spec.agent_config["harbor_job"] == job.name and run.group == "harbor"
        assert run.spec.task_id == TASK and run.variant == "synthetic-easy"
    assert oracle.grade is not None and oracle.grade.gold_medal and oracle.grade.labels["origin"] == "harbor"
    assert oracle.status.state == "finished" and oracle.spec.limits.time_limit_s == 5400
    assert oracle.status.elapsed_s == 42 * 60
    assert claude.spec.models == {"agent": "anthropic/claude-sonnet-4-5"} and claude.status.cost_usd == 0.21
    assert claude.status.tokens == 15400 and claude.grade is not None and claude.grade.labels["fallback"]
    assert crashed.grade is None and crashed.status.state == "timed_out"
    assert "AgentTimeoutError" in crashed.status.reason
    # rexmle report reads them like its own runs
    capsys.readouterr()
    assert main(["report", str(group), "--format", "json", "--bootstrap", "0"]) == 0
    report = capsys.readouterr().out
    assert "harbor/oracle" in report and "harbor/claude-code" in report
    # importing again keeps what is there; --force replaces it
    assert main(["import", "harbor", str(job), "--runs-dir", str(group)]) == 0
    assert "kept" in capsys.readouterr().out
    assert main(["import", "harbor", str(job), "--runs-dir", str(group), "--force"]) == 0
    assert "replaced" in capsys.readouterr().out


def test_a_folder_without_harbor_trials_is_refused_with_the_fix(tmp_path: Path) -> None:
    from rexmle_grade.errors import UserInputError

    (tmp_path / "job" / "not-a-trial").mkdir(parents=True)
    (tmp_path / "job" / "not-a-trial" / "result.json").write_text('{"id": "x", "n_total_trials": 1}')
    with pytest.raises(UserInputError, match="no Harbor trial") as raised:
        import_job(tmp_path / "job", tmp_path / "runs" / "harbor")
    assert "jobs/" in (raised.value.hint or "")


def test_a_trial_of_another_benchmark_is_reported_not_guessed(tmp_path: Path) -> None:
    trial = tmp_path / "job" / "hello-world__abc"
    trial.mkdir(parents=True)
    (trial / "result.json").write_text(json.dumps({"task_name": "harbor/hello-world", "trial_name": "hello-world__abc",
                                                   "agent_info": {"name": "oracle", "version": "1"}}))
    results = import_job(tmp_path / "job", tmp_path / "runs" / "harbor")
    assert [r.action for r in results] == ["refused"] and "no rexmle task" in (results[0].problem or "")
    assert not (tmp_path / "runs" / "harbor").exists()


# ---------------------------------------------------------------------------------------------------------------
# runs as ATIF


@pytest.fixture(scope="session")
def sample_run(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rexmle_agents.harness.runner import build_spec, execute_run

    if shutil.which("bwrap") is None and not os.environ.get("CI"):
        pytest.skip("bubblewrap is not installed (apt-get install -y bubblewrap)")
    outcome = execute_run(build_spec(TASK, agent="sample", data_root=data_root, group="g"),
                          tmp_path_factory.mktemp("harbor-runs"))
    assert outcome.state == "finished", outcome.reason
    return outcome.run_dir


def test_a_run_exports_as_atif_that_harbors_trajectory_model_accepts(harbor_python: Path, sample_run: Path,
                                                                     tmp_path: Path) -> None:
    out = tmp_path / "trajectory.json"
    assert main(["runs", "export", str(sample_run), "--format", "atif", "--out", str(out)]) == 0
    checked = harbor(harbor_python, "atif", file=str(out))
    document = json.loads(out.read_text())
    assert checked["sources"] == ["user", "agent", "system"]  # instructions, the copy step, the grade
    assert "Task description" in document["steps"][0]["message"]
    step = document["steps"][1]
    assert step["tool_calls"][0]["function_name"] == "run" and "cp -R" in " ".join(step["tool_calls"][0]["arguments"]
                                                                                   ["argv"])
    assert step["observation"]["results"][0]["source_call_id"] == step["tool_calls"][0]["tool_call_id"]
    assert step["llm_call_count"] == 0 and "metrics" not in step
    assert document["session_id"] == sample_run.name and checked["final"]["total_steps"] == 3
    assert "percentile" in document["steps"][2]["message"]


def test_an_unknown_export_format_is_refused(sample_run: Path, capsys) -> None:
    assert main(["runs", "export", str(sample_run), "--format", "sharegpt"]) != 0
    assert "atif" in capsys.readouterr().err


# A terminal agent at its smallest: chat completions with one shell tool, standard library only. Its turns are the
# run's `agent_turn` events; the scripted model (the CLI agents' tests' driver) walks it through a small task.
TOOL_LOOP = r"""
import json, os, subprocess, sys, urllib.request
endpoint = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
shell = {"type": "function", "function": {"name": "shell", "description": "run a shell command", "parameters":
         {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
history = [{"role": "user", "content": open(sys.argv[1]).read()}]
for _ in range(int(sys.argv[2])):
    body = json.dumps({"model": "rexmle-code", "messages": history, "tools": [shell]}).encode()
    request = urllib.request.Request(endpoint, data=body, headers={"Content-Type": "application/json"})
    reply = json.load(urllib.request.urlopen(request, timeout=120))["choices"][0]["message"]
    history.append(reply)
    for call in reply.get("tool_calls") or []:
        ran = subprocess.run(["bash", "-c", json.loads(call["function"]["arguments"])["command"]],
                             capture_output=True, text=True)
        history.append({"role": "tool", "tool_call_id": call["id"], "content": ran.stdout + ran.stderr})
    if not reply.get("tool_calls"):
        break
"""


def test_a_terminal_agents_turns_export_as_atif_steps_with_calls_outputs_and_tokens(
        harbor_python: Path, data_root: Path, tmp_path: Path) -> None:
    import importlib.util
    from importlib import resources

    import yaml

    from rexmle_agents.external.envs import ensure_environment
    from rexmle_agents.external.spec import SPEC_PACKAGE, load_spec
    from rexmle_agents.harness.runner import build_spec, execute_run
    from rexmle_agents.harness.spec import Limits
    from rexmle_agents.models import Model, RetryPolicy, ScriptedBackend

    if shutil.which("bwrap") is None and not os.environ.get("CI"):
        pytest.skip("bubblewrap is not installed (apt-get install -y bubblewrap)")
    loaded = importlib.util.spec_from_file_location("harbor_cli_driver",
                                                    Path(__file__).parents[1] / "external" / "cli_driver.py")
    assert loaded is not None and loaded.loader is not None
    driver_module = importlib.util.module_from_spec(loaded)
    sys.modules[loaded.name] = driver_module  # its dataclasses look their module up while being made
    loaded.loader.exec_module(driver_module)
    ensure_environment(load_spec("aideml"), source="aideml")  # the spec below borrows aideml's environment
    raw = yaml.safe_load(resources.files(SPEC_PACKAGE).joinpath("aideml.yaml").read_text())
    raw.update(name="tool-loop", settings={}, roles=["code"], aliases={"rexmle-code": "code"}, steps="turn",
               files={"agent/loop.py": TOOL_LOOP.replace("{", "{{").replace("}", "}}"),
                      "agent/prompt.md": "{cli_prompt}"},
               command=["python", "{agent_dir}/loop.py", "{agent_dir}/prompt.md", "{max_steps}"],
               env={"OPENAI_BASE_URL": "{relay_url}/v1", "OPENAI_API_KEY": "{no_key}"},
               outputs={"submission": "submission", "snapshot": "at_end"})
    spec_path = tmp_path / "tool-loop.yaml"
    spec_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    driver = driver_module.CliDriver(python=sys.executable)
    spec = build_spec(TASK, agent="external", agent_config={"spec": str(spec_path)},
                      models={"code": "scripted/model"}, limits=Limits(time_limit_s=600), sandbox="bwrap",
                      data_root=data_root, group="turns")
    outcome = execute_run(spec, tmp_path / "runs", grace_s=5.0,
                          models={"code": Model(ScriptedBackend(driver), retry=RetryPolicy(max_attempts=1))})
    assert outcome.state == "finished", outcome.reason

    out = tmp_path / "trajectory.json"
    assert main(["runs", "export", str(outcome.run_dir), "--out", str(out)]) == 0
    checked = harbor(harbor_python, "atif", file=str(out))
    document = json.loads(out.read_text())
    turns = [s for s in document["steps"] if s["source"] == "agent"]
    assert checked["sources"] == ["user", *["agent"] * len(turns), "system"]
    assert len(turns) == len(driver_module.SCRIPT) + 1  # one turn per command, then the closing answer
    first = turns[0]
    assert first["message"] == driver_module.SCRIPT[0][0]
    assert first["tool_calls"][0]["function_name"] == "shell"
    assert first["tool_calls"][0]["arguments"]["command"] == driver.commands[0]
    # the output of the turn's command came back with the next request; ATIF puts it under the call that made it
    result = first["observation"]["results"][0]
    assert result["source_call_id"] == first["tool_calls"][0]["tool_call_id"] and "train" in result["content"]
    assert all(t["llm_call_count"] == 1 and t["metrics"]["prompt_tokens"] > 0 for t in turns)
    assert turns[-1]["message"].endswith("Done.") and "tool_calls" not in turns[-1]
    assert checked["final"]["total_prompt_tokens"] == sum(t["metrics"]["prompt_tokens"] for t in turns)


def test_a_scaffolds_search_exports_node_by_node_with_code_runs_and_unknown_cost_left_unknown(
        harbor_python: Path, data_root: Path, tmp_path: Path) -> None:
    import importlib.util

    from rexmle_agents.harness.runner import build_spec, execute_run
    from rexmle_agents.harness.spec import Limits
    from rexmle_agents.models import Model, RetryPolicy, ScriptedBackend

    if shutil.which("bwrap") is None and not os.environ.get("CI"):
        pytest.skip("bubblewrap is not installed (apt-get install -y bubblewrap)")
    loaded = importlib.util.spec_from_file_location("harbor_scaffold_fakes",
                                                    Path(__file__).parents[1] / "scaffolds" / "fakes.py")
    assert loaded is not None and loaded.loader is not None
    fakes = importlib.util.module_from_spec(loaded)
    sys.modules[loaded.name] = fakes
    loaded.loader.exec_module(fakes)
    spec = build_spec(TASK, agent="aide", agent_config={"num_drafts": 2, "debug_prob": 1.0},
                      models={"code": "scripted/model"}, limits=Limits(time_limit_s=120, max_steps=3,
                                                                        exec_timeout_s=20),
                      sandbox="bwrap", data_root=data_root, group="tree")
    model = Model(ScriptedBackend(fakes.FakeModel([fakes.CRASH_SCRIPT, fakes.good(1.0)])),
                  retry=RetryPolicy(max_attempts=1))
    outcome = execute_run(spec, tmp_path / "runs", models={"code": model}, grace_s=5.0)
    assert outcome.state == "finished", outcome.reason

    out = tmp_path / "trajectory.json"
    assert main(["runs", "export", str(outcome.run_dir), "--format", "atif", "--out", str(out)]) == 0
    checked = harbor(harbor_python, "atif", file=str(out))
    nodes = [s for s in json.loads(out.read_text())["steps"] if s["source"] == "agent"]
    assert checked["sources"] == ["user", *["agent"] * len(nodes), "system"] and len(nodes) == 3
    crashed = nodes[0]
    assert [c["function_name"] for c in crashed["tool_calls"]] == ["write_file", "run"]
    assert "Bug:" in crashed["message"] and crashed["observation"]["results"][0]["extra"]["exit_code"] != 0
    assert all(n["llm_call_count"] >= 1 for n in nodes)
    # the scripted model has no price: each step's cost and the total are unknown, never a made-up zero
    assert all(n["metrics"]["cost_usd"] is None for n in nodes) and checked["final"]["total_cost_usd"] is None
