"""Agents that want a better score, or to harm the host, through the real agent path: code planted inside the
sandbox by a test agent's steps, then the harness's own code paths (snapshots, validation, run_python, the
instructions rewritten on resume, `rexmle sandbox exec`, `rexmle run`), and the operator faults around a run
(SIGKILL of the command, a second command on the same run, a full disk, resuming a copied folder)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.runner import build_spec, execute_run
from rexmle_agents.harness.spec import Limits, Resources
from rexmle_grade.cli import main

TASK = "ldct-iqa"
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("CI"),
                                reason="bubblewrap is not installed (apt-get install -y bubblewrap)")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="what changes when the harness runs as root (CI does)")


def attack(data_root: Path, runs: Path, script: str, **config: Any) -> Any:
    spec = build_spec(TASK, agent="test-attack", agent_config={"script": script, **config}, data_root=data_root,
                      limits=Limits(time_limit_s=120, exec_timeout_s=60), group="attack")
    return execute_run(spec, runs)


def events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in Journal(run_dir / "journal.jsonl").iter_events() if e["kind"] == kind]


def perfect_submission(data_root: Path, where: Path) -> Path:
    """What a forger wants graded: the test answers themselves, as a submission folder on the host."""
    where.mkdir(parents=True)
    shutil.copy(data_root / TASK / "private" / "answers.csv", where / "submission.csv")
    return where


@needs_root
def test_agent_code_runs_unprivileged_through_the_agent_path_and_sandbox_exec(data_root: Path, tmp_path: Path,
                                                                              capfd) -> None:
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    probe = ("id -u; grep CapEff /proc/self/status; echo '|/tmp/pwn %p' > /proc/sys/kernel/core_pattern "
             "&& echo WROTE; echo 1 > /proc/sys/vm/drop_caches && echo WROTE; true")
    outcome = attack(data_root, tmp_path / "runs", probe, submit=False)
    result = events(outcome.run_dir, "step_finished")[0]["result"]
    uid = result["stdout"].split()[0]
    assert uid != "0" and "CapEff:\t0000000000000000" in result["stdout"] and "WROTE" not in result["stdout"]
    capfd.readouterr()
    code = main(["sandbox", "exec", str(outcome.run_dir), "--", "sh", "-c", probe])
    out, _ = capfd.readouterr()
    assert code == 0 and out.split()[0] != "0" and "WROTE" not in out  # an identity of its own, never root
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before


def test_a_submission_folder_linked_to_a_perfect_one_is_refused_and_not_graded(data_root: Path,
                                                                               tmp_path: Path) -> None:
    victim = perfect_submission(data_root, tmp_path / "other-run" / "final" / "submission")
    outcome = attack(data_root, tmp_path / "runs", f"rm -rf /workspace/submission && ln -s {victim} "
                                                   "/workspace/submission")
    snapshot = events(outcome.run_dir, "snapshot")[0]
    assert snapshot["valid"] is False and "symbolic link" in snapshot["refused"][0]
    assert outcome.grade is not None and not outcome.grade.valid_submission
    assert not list((outcome.run_dir / "final" / "submission").iterdir())  # nothing of the victim was copied


def test_a_linked_submission_csv_is_refused(data_root: Path, tmp_path: Path) -> None:
    victim = perfect_submission(data_root, tmp_path / "victim")
    outcome = attack(data_root, tmp_path / "runs", f"ln -s {victim}/submission.csv /workspace/submission/")
    snapshot = events(outcome.run_dir, "snapshot")[0]
    assert snapshot["valid"] is False and "submission.csv: is a symbolic link" in snapshot["refused"][0]
    assert not outcome.grade.valid_submission


def test_a_sparse_file_in_the_submission_is_never_copied_to_the_host(data_root: Path, tmp_path: Path) -> None:
    script = ("cp /workspace/data/sample_submission/submission.csv /workspace/submission/ && "
              "truncate -s 300M /workspace/submission/padding.bin && mkfifo /workspace/submission/pipe")
    outcome = attack(data_root, tmp_path / "runs", script)
    copied = sorted(p.name for p in (outcome.run_dir / "final" / "submission").iterdir())
    assert copied == ["submission.csv"]  # only what submission.csv names (this task: nothing but itself)
    assert outcome.grade.valid_submission
    allocated = sum(p.stat().st_blocks * 512 for p in outcome.run_dir.rglob("*") if p.is_file()
                    and "workspace" not in p.parts)
    assert allocated < 20 * 1024 * 1024


def test_run_python_never_writes_through_a_planted_link(data_root: Path, tmp_path: Path) -> None:
    canary = tmp_path / "canary.py"
    canary.write_text("host file")
    outcome = attack(data_root, tmp_path / "runs", f"ln -s {canary} /workspace/working/fit.py", python_as="fit.py",
                     submit=False)
    assert canary.read_text() == "host file"
    assert "the harness wrote me" in events(outcome.run_dir, "step_finished")[0]["result"]["python"]


def test_the_workspace_disk_limit_stops_the_run_and_is_named(data_root: Path, tmp_path: Path) -> None:
    script = ("cp /workspace/data/sample_submission/submission.csv /workspace/submission/ && "
              "head -c 30000000 /dev/urandom > /workspace/working/weights.bin && sleep 30")
    spec = build_spec(TASK, agent="test-attack", agent_config={"script": script, "submit": False},
                      data_root=data_root, limits=Limits(time_limit_s=120, exec_timeout_s=60), group="attack",
                      resources=Resources(disk_gb=0.02))
    outcome = execute_run(spec, tmp_path / "runs")
    assert (outcome.state, outcome.limit) == ("finished", "disk") and outcome.seconds < 20
    assert "workspace disk limit exceeded" in outcome.reason and "--disk-gb" in outcome.reason
    stop = events(outcome.run_dir, "budget_exhausted")[0]
    assert stop["limit"] == "disk" and stop["usage"]["bytes"] > 20_000_000
    assert json.loads((outcome.run_dir / "status.json").read_text())["limit"] == "disk"
    assert outcome.grade.valid_submission  # the submission written before the limit is still graded


def test_runs_get_a_memory_limit_by_default(data_root: Path, tmp_path: Path) -> None:
    outcome = attack(data_root, tmp_path / "runs", "true", submit=False)
    started = events(outcome.run_dir, "run_started")[0]
    limits = started["limits"]
    assert limits["memory_bytes"] and limits["how"]["memory"].startswith("auto")
    assert limits["disk_bytes"] > 0 and limits["max_files"] == 1_000_000
    assert "memory" in started["limits_mechanism"]


# ---------------------------------------------------------------------------------------------------------------
# operator faults, through `rexmle run` in a process of its own (the test agents are registered by loading this
# folder's conftest.py, in the command and in its pool's workers)

DRIVER = textwrap.dedent('''
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("harness_test_agents", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if __name__ == "__main__":
        from rexmle_grade.cli import main
        sys.exit(main(sys.argv[2:]))
''')


def driver(tmp_path: Path) -> list[str]:
    script = tmp_path / "drive.py"
    script.write_text(DRIVER)
    return [sys.executable, str(script), str(Path(__file__).with_name("conftest.py"))]


def commands_run(data_root: Path, runs: Path, commands: list[str], *extra: str) -> list[str]:
    return ["--data-dir", str(data_root), "run", "--agent", "test-commands", "--task", TASK, "--runs-dir", str(runs),
            "--group", "ops", "--time-limit", "5m", "--agent-config",
            json.dumps({"commands": commands, "timeout_s": 4}), *extra]


def wait_for(predicate, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def test_sigkill_of_rexmle_run_leaves_no_run_going_and_a_second_command_is_refused(data_root: Path, tmp_path: Path,
                                                                                   capsys) -> None:
    canary = tmp_path / "canary.md"
    canary.write_text("host file")
    marker = f"ops-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    argv = commands_run(data_root, runs, [f"ln -sf {canary} /workspace/instructions.md; sleep 30 # {marker}"])
    first = subprocess.Popen([*driver(tmp_path), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    journal = wait_for(lambda: next(iter(runs.glob("ops/*/journal.jsonl")), None))
    wait_for(lambda: any(e["kind"] == "exec_started" for e in Journal(journal).events()))
    worker = next(e["pid"] for e in Journal(journal).events() if e["kind"] == "run_started")
    assert worker != first.pid and alive(worker)

    # the same command again, meanwhile: refused by the run's lock, one line, exit code 2
    capsys.readouterr()
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "is being run by another process" in err and err.count("error:") == 1

    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    wait_for(lambda: not alive(worker), timeout_s=10)  # the worker died with its command ...
    wait_for(lambda: not _processes_with(marker), timeout_s=10)  # ... and so did the agent's code
    status = json.loads((journal.parent / "status.json").read_text())
    assert status["state"] == "running"  # not finished: the next command resumes it

    again = subprocess.run([*driver(tmp_path), *argv], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    kinds = [e["kind"] for e in Journal(journal).events()]
    assert kinds.count("run_resumed") == 1 and kinds[-1] in ("graded", "run_finished")
    assert json.loads((journal.parent / "status.json").read_text())["state"] == "finished"
    assert canary.read_text() == "host file"  # instructions.md, rewritten on resume, replaced the planted link


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@needs_root
def test_a_full_disk_is_one_line_leaves_nothing_partial_and_resumes(data_root: Path, tmp_path: Path) -> None:
    disk = tmp_path / "small-disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        runs = disk / "runs"
        fill = ("cp /workspace/data/sample_submission/submission.csv /workspace/submission/; "
                "[ -e /workspace/working/done ] || { touch /workspace/working/done; "
                "head -c 100M /dev/zero > /workspace/working/fill; }; true")
        argv = commands_run(data_root, runs, [fill], "--disk-gb", "1")
        full = subprocess.run([*driver(tmp_path), *argv], capture_output=True, text=True, timeout=120)
        err = " ".join(full.stderr.split())
        assert full.returncode == 2, full.stderr
        assert "is full" in err and "run the same command again" in err and "Traceback" not in err
        run_dir = next(runs.glob("ops/*/"))
        assert not (run_dir / "final.partial").exists() and not (run_dir / "candidates").exists()
        assert not list(run_dir.glob("snapshots/*.partial"))
        (run_dir / "workspace" / "working" / "fill").unlink()  # space is back
        again = subprocess.run([*driver(tmp_path), *argv], capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        status = json.loads((run_dir / "status.json").read_text())
        assert status["state"] == "finished" and status["attempts"] == 2
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_resume_of_a_copied_run_folder_acts_on_the_copy(data_root: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    assert main(["--data-dir", str(data_root), "run", "--agent", "sample", "--task", TASK, "--runs-dir",
                 str(runs), "--group", "orig"]) == 0
    original = next(runs.glob("orig/*/"))
    copy = tmp_path / "elsewhere" / "my-copy"
    shutil.copytree(original, copy)
    (copy / "grade.json").unlink()
    size = (original / "journal.jsonl").stat().st_size
    grade_before = (original / "grade.json").stat().st_mtime_ns
    assert main(["run", "--resume", str(copy)]) == 0
    assert (copy / "grade.json").is_file()  # the copy was graded ...
    assert (original / "journal.jsonl").stat().st_size == size  # ... the original left as it was
    assert (original / "grade.json").stat().st_mtime_ns == grade_before
    assert not (tmp_path / "orig").exists()  # nothing written where the copy's group would have been
    assert (tmp_path / "elsewhere" / "report.json").is_file()  # the report goes beside the run given


def test_agent_text_is_printed_with_control_characters_escaped(data_root: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    nasty = "\\033]0;owned\\007\\033[2J\\033[31mFAKE: all tests passed\\r"
    argv = ["--data-dir", str(data_root), "run", "--agent", "test-attack", "--task", TASK, "--runs-dir", str(runs),
            "--agent-config", json.dumps({"script": f"printf '{nasty}' >&2; exit 3", "fail_with_output": True})]
    first = subprocess.run([*driver(tmp_path), *argv], capture_output=True, timeout=120)
    status = subprocess.run([*driver(tmp_path), "runs", "status", "--runs-dir", str(runs)], capture_output=True,
                            timeout=60)
    assert b"FAKE: all tests passed" in first.stdout + first.stderr  # the text is shown ...
    for text in (first.stdout, first.stderr, status.stdout, status.stderr):
        assert b"\x1b" not in text and b"\x07" not in text and b"\r" not in text  # ... as data
    assert b"\\x1b" in first.stdout + first.stderr


def test_an_interrupted_step_does_not_count_against_the_step_limit(data_root: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    argv = commands_run(data_root, runs, ["true", "sleep 30", "true"], "--max-steps", "3")
    first = subprocess.Popen([*driver(tmp_path), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    journal = wait_for(lambda: next(iter(runs.glob("ops/*/journal.jsonl")), None))
    wait_for(lambda: any(e["kind"] == "exec_started" and e.get("step") == 2 for e in Journal(journal).events()))
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    again = subprocess.run([*driver(tmp_path), *argv], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    events = Journal(journal).events()
    finished = [e for e in events if e["kind"] == "step_finished"]
    assert [e["kind"] for e in events].count("step_interrupted") == 1
    assert len(finished) == 3  # the interrupted step was redone, and all three commands ran within --max-steps 3
    status = json.loads((journal.parent / "status.json").read_text())
    assert (status["state"], status["steps"], status["limit"]) == ("finished", 3, None)
