"""`rexmle doctor`: every row on this machine, and the row, the fix and the exit code when a sandbox tool, a task's
data or a model key is missing. The rows come from the same checks `rexmle run` makes, so the run refuses with the
same fix."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rexmle_agents.doctor import Needs, Status, diagnose, driver_version
from rexmle_grade.cli import main

TASK = "ldct-iqa"
REXMLE = Path(sys.executable).parent / "rexmle"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed "
                                                                       "(apt-get install -y bubblewrap)")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    root = tmp_path_factory.mktemp("doctor-data")
    root.chmod(0o755)  # agent code (another user when the tests run as root) reads the public data
    task = get_task(TASK)
    prepare_task(task, task_dirs(task, root), synthetic=True, cases=10, seed=0, force=False)
    return root


def doctor_rows(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, str]]]:
    code = main([*args[:2], "doctor", *args[2:], "--json"]) if args[:1] == ("--data-dir",) else \
        main(["doctor", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def row(rows: list[dict[str, str]], area: str, item: str) -> dict[str, str]:
    found = [r for r in rows if r["area"] == area and r["item"] == item]
    assert len(found) == 1, f"no single row {area}/{item} in {[(r['area'], r['item']) for r in rows]}"
    return found[0]


@needs_bwrap
def test_doctor_on_this_machine_shows_every_row(capsys: pytest.CaptureFixture[str], data_root: Path,
                                                 tmp_path: Path) -> None:
    code, rows = doctor_rows(capsys, "--data-dir", str(data_root), "--runs-dir", str(tmp_path / "runs"))
    areas = [r["area"] for r in rows]
    for area in ("sandbox", "gpus", "disk", "task data", "models", "slurm"):
        assert area in areas, area
    assert {r["status"] for r in rows} <= {"ok", "missing", "warning"}
    assert all(r["fix"] for r in rows if r["status"] != "ok"), "every row that is not ok says how to fix it"
    assert code == (1 if any(r["status"] == "missing" for r in rows) else 0)
    # this machine: bubblewrap works, so the sandbox runtime is there; the prepared task passed its leak check
    assert row(rows, "sandbox", "runtime (auto -> bwrap)")["status"] == "ok"
    prepared = row(rows, "task data", TASK)
    assert prepared["status"] == "ok" and "synthetic" in prepared["detail"]
    assert "leak check passed" in prepared["detail"]
    # the 20 other tasks, nothing asked about them: one warning row with the command that prepares them
    others = row(rows, "task data", "20 of 21 task(s)")
    assert others["status"] == "warning" and others["fix"].startswith("rexmle prepare all --synthetic")
    if os.geteuid() == 0:  # the harness drops agent code to a leased id: setpriv and the id range are checked
        assert row(rows, "sandbox", "setpriv")["status"] == "ok"
        assert row(rows, "sandbox", "identity")["status"] == "ok"
    assert row(rows, "disk", "runs folder")["status"] in ("ok", "warning")
    slurm = row(rows, "slurm", "sbatch, sinfo")
    assert slurm["status"] == ("ok" if shutil.which("sbatch") and shutil.which("sinfo") else "warning")


@needs_bwrap
def test_the_asked_for_runs_are_ready_exit_code_zero(capsys: pytest.CaptureFixture[str], data_root: Path,
                                                     tmp_path: Path) -> None:
    code, rows = doctor_rows(capsys, "--data-dir", str(data_root), "--agent", "sample", "--task", TASK,
                             "--runs-dir", str(tmp_path))
    assert code == 0, [r for r in rows if r["status"] == "missing"]
    assert row(rows, "agent", "sample")["status"] == "ok"
    assert [r["item"] for r in rows if r["area"] == "task data"] == [TASK]  # exactly the asked-for task


def test_a_missing_sandbox_tool_is_a_missing_row_with_its_install_command(data_root: Path, tmp_path: Path) -> None:
    empty_path = tmp_path / "bin"
    empty_path.mkdir()
    # a separate process: the harness remembers whether bubblewrap works for its whole life
    done = subprocess.run([str(REXMLE), "--data-dir", str(data_root), "doctor", "--agent", "sample", "--task", TASK,
                           "--runs-dir", str(tmp_path), "--json"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": str(empty_path)})
    assert done.returncode == 1, done.stderr
    rows = json.loads(done.stdout)
    runtime = row(rows, "sandbox", "runtime (auto)")
    assert runtime["status"] == "missing"
    assert "bubblewrap (bwrap) is not installed" in runtime["detail"]
    assert "apt-get install -y bubblewrap" in runtime["fix"]
    # the same process names the same fix when asked to run
    refused = subprocess.run([str(REXMLE), "--data-dir", str(data_root), "run", "--agent", "sample", "--task", TASK,
                              "--runs-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PATH": str(empty_path)})
    assert refused.returncode == 2 and "apt-get install -y bubblewrap" in refused.stderr
    assert not (tmp_path / "runs").exists()


def test_an_unprepared_task_is_a_missing_row_with_the_prepare_command(capsys: pytest.CaptureFixture[str],
                                                                      tmp_path: Path) -> None:
    empty = tmp_path / "data"
    empty.mkdir()
    code, rows = doctor_rows(capsys, "--data-dir", str(empty), "--agent", "sample", "--task", TASK,
                             "--runs-dir", str(tmp_path))
    assert code == 1
    task = row(rows, "task data", TASK)
    assert task["status"] == "missing" and "is not prepared" in task["detail"]
    assert f"rexmle prepare {TASK} --synthetic" in task["fix"]
    # rexmle run refuses with the same command (exit code 2, nothing written)
    assert main(["--data-dir", str(empty), "run", "--agent", "sample", "--task", TASK,
                 "--runs-dir", str(tmp_path / "runs")]) == 2
    assert f"rexmle prepare {TASK} --synthetic" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_missing_key_is_a_missing_row_with_the_export_to_set(capsys: pytest.CaptureFixture[str], data_root: Path,
                                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, rows = doctor_rows(capsys, "--data-dir", str(data_root), "--agent", "aide", "--task", TASK,
                             "--model", "openai/gpt-5", "--runs-dir", str(tmp_path))
    assert code == 1
    key = row(rows, "models", "openai/gpt-5 key")
    assert key["status"] == "missing" and "OPENAI_API_KEY is not set" in key["detail"]
    assert key["fix"].startswith("export OPENAI_API_KEY=...")
    # without a model nothing is asked of the key: a warning only, and it does not change the exit code
    rows = diagnose(Needs(data_root=data_root, runs_dir=tmp_path, leak_check=False))
    assert row([r.to_json() for r in rows], "models", "openai key")["status"] == "warning"


class _ChatServer:
    """A loopback server answering every POST with one OpenAI chat completion (or ``status`` with an error)."""

    def __init__(self, status: int = 200) -> None:
        self.authorisations: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.authorisations.append(self.headers.get("Authorization", ""))
                body = {"id": "c1", "object": "chat.completion", "created": 0, "model": "gpt-5",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "OK"},
                                     "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}} \
                    if status == 200 else {"error": {"message": "invalid api key", "type": "invalid_request_error"}}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


@pytest.fixture
def chat_server() -> Iterator[_ChatServer]:
    server = _ChatServer()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def test_endpoints_are_probed_and_called_only_with_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        chat_server: _ChatServer) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-doctor-test")
    monkeypatch.setenv("OPENAI_BASE_URL", chat_server.url)
    needs = Needs(models={"default": "openai/gpt-5"}, runs_dir=tmp_path, leak_check=False)
    rows = [r.to_json() for r in diagnose(needs)]
    assert row(rows, "models", "openai/gpt-5 endpoint")["status"] == "ok"
    assert not [r for r in rows if r["item"] == "openai/gpt-5 call"] and chat_server.authorisations == []
    called = [r.to_json() for r in diagnose(Needs(models={"default": "openai/gpt-5"}, runs_dir=tmp_path,
                                                  leak_check=False, call=True))]
    assert row(called, "models", "openai/gpt-5 call")["status"] == "ok"
    assert chat_server.authorisations == ["Bearer sk-doctor-test"]  # one authenticated request, no more


def test_an_unreachable_endpoint_is_missing_locally_and_a_warning_for_slurm(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-doctor-test")
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{port}/v1")
    for executor, status in (("local", Status.MISSING), ("slurm", Status.WARNING)):
        rows = diagnose(Needs(models={"default": "openai/gpt-5"}, runs_dir=tmp_path, leak_check=False,
                              executor=executor))
        endpoint = next(r for r in rows if r.item == "openai/gpt-5 endpoint")
        assert endpoint.status is status and "connection refused" in endpoint.detail and endpoint.fix


def test_a_rejected_key_fails_the_call_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = _ChatServer(status=401)
    try:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        rows = diagnose(Needs(models={"default": "openai/gpt-5"}, runs_dir=tmp_path, leak_check=False, call=True))
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
    call = next(r for r in rows if r.item == "openai/gpt-5 call")
    assert call.status is Status.MISSING and "401" in call.detail


def test_more_gpus_than_the_machine_has_is_missing_for_the_local_executor_only(tmp_path: Path) -> None:
    rows = diagnose(Needs(agent="sample", gpus_per_run=64, runs_dir=tmp_path, leak_check=False))
    gpus = next(r for r in rows if r.area == "gpus")
    assert gpus.status is Status.MISSING and "64 GPU(s)" in gpus.detail and gpus.fix
    rows = diagnose(Needs(agent="sample", gpus_per_run=64, executor="slurm", runs_dir=tmp_path, leak_check=False))
    assert next(r for r in rows if r.area == "gpus").status is Status.OK


def test_the_driver_version_is_read_from_the_drivers_file(tmp_path: Path) -> None:
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
                       "GCC version:  gcc version 12.3.0\n")
    assert driver_version(version) == "550.54.15"
    assert driver_version(tmp_path / "absent") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="per-run ids are leased only when the harness is root")
@needs_bwrap
def test_a_bad_sandbox_id_setting_is_a_missing_identity_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REXMLE_SANDBOX_USER", raising=False)
    monkeypatch.setenv("REXMLE_SANDBOX_UIDS", "0:10")  # root's own ids
    identity = next(r for r in diagnose(Needs(runs_dir=tmp_path, leak_check=False)) if r.item == "identity")
    assert identity.status is Status.MISSING and "REXMLE_SANDBOX_UIDS" in identity.detail and identity.fix
    monkeypatch.setenv("REXMLE_SANDBOX_USER", "no-such-rexmle-user")
    identity = next(r for r in diagnose(Needs(runs_dir=tmp_path, leak_check=False)) if r.item == "identity")
    assert identity.status is Status.MISSING and "does not exist" in identity.detail and "useradd" in identity.fix
    monkeypatch.setenv("REXMLE_SANDBOX_USER", "65534:65534")
    identity = next(r for r in diagnose(Needs(runs_dir=tmp_path, leak_check=False)) if r.item == "identity")
    assert identity.status is Status.OK and "uid 65534" in identity.detail


def test_an_external_agents_environment_is_reported_built_or_not_and_never_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rexmle_agents.external.envs import MARKER, ensure_environment
    from rexmle_agents.external.spec import load_spec

    cache = tmp_path / "envs"
    monkeypatch.setenv("REXMLE_AGENT_ENVS", str(cache))
    rows = diagnose(Needs(agent="aideml", models={"default": "scripted/model"}, runs_dir=tmp_path, leak_check=False))
    env = next(r for r in rows if r.area == "agent environment")
    assert env.status is Status.WARNING and "not built yet" in env.detail and env.fix
    assert not cache.exists() or not any(cache.iterdir())  # the doctor built nothing
    # a complete build where the doctor said it would be: the row is ok, and a run reuses that very folder
    folder = Path(env.detail.split("(", 1)[1].split(")", 1)[0])
    folder.mkdir(parents=True)
    (folder / MARKER).write_text(json.dumps({"seconds": 1.0}))
    env = next(r for r in diagnose(Needs(agent="aideml", models={"default": "scripted/model"}, runs_dir=tmp_path,
                                         leak_check=False)) if r.area == "agent environment")
    assert env.status is Status.OK and str(folder) in env.detail
    reused = ensure_environment(load_spec("aideml"), source="aideml")
    assert reused.path == folder and reused.built is False
