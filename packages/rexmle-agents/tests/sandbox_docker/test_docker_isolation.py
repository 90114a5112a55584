"""The docker sandbox on a real (private) Docker engine: what code inside can and cannot reach, and how the engine's
limits stop it. The same promises test_bwrap_isolation.py and test_trust.py prove for bubblewrap."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest

from rexmle_agents.safe_workspace import Workspace
from rexmle_agents.sandbox import STOPPED_MEMORY, STOPPED_PROCESSES, STOPPED_TIMEOUT, DockerSandbox, get_sandbox

from .conftest import host_listener

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts a private Docker engine: needs root")


def py(sandbox: DockerSandbox, code: str, **kwargs: object):
    return sandbox.run(["python3", "-c", code], **kwargs)


def test_engine_and_image_are_ready(docker_engine) -> None:
    print(f"engine start {docker_engine.start_s:.1f} s, image import {docker_engine.image_s:.1f} s "
          f"({docker_engine.image_bytes / 2**20:.0f} MiB tar)")
    assert DockerSandbox.unavailable_reason() is None
    assert docker_engine.image_bytes < 200 * 2**20


def test_runs_a_command_and_stops_its_container_on_timeout(world) -> None:
    sandbox = get_sandbox("docker", world.spec())
    result = sandbox.run(["sh", "-c", "cat /workspace/data/train.csv; pwd; touch ../submission/x"])
    assert result.ok, result.stderr_tail
    assert world.public_text in result.stdout_tail and "/workspace/working" in result.stdout_tail
    assert (world.workspace / "submission" / "x").exists()
    result = sandbox.run(["sleep", "60"], timeout_s=1)
    assert result.stopped_by == STOPPED_TIMEOUT
    assert "rexmle-" not in _containers("ps")  # docker kill: the container stopped, not just its client
    deadline = time.monotonic() + 20
    while "rexmle-" in _containers("ps", "-a") and time.monotonic() < deadline:
        time.sleep(0.2)  # the engine removes a --rm container just after it stops
    assert "rexmle-" not in _containers("ps", "-a")


def _containers(*args: str) -> str:
    return subprocess.run(["docker", *args, "--format", "{{.Names}} {{.Status}}"], capture_output=True, text=True,
                          check=True).stdout


def test_runs_as_the_leased_unprivileged_user(world) -> None:
    sandbox = get_sandbox("docker", world.spec())
    user = sandbox.user
    assert user is not None and user.uid != 0  # the harness is root: the run leases its own identity
    result = py(sandbox, "import os; print(os.getuid(), os.getgid(), os.geteuid())")
    assert result.ok, result.stderr_tail
    assert result.stdout_tail.split() == [str(user.uid), str(user.gid), str(user.uid)]
    result = py(sandbox, "print([l for l in open('/proc/self/status') if l.startswith('CapEff')][0], end='')")
    assert result.stdout_tail == "CapEff:\t0000000000000000\n"


def test_no_network_even_to_host_loopback(world) -> None:
    with host_listener() as (port, addresses):  # from the host, every address answers: the check inside can fail
        code = f"""
import socket
reached = []
for address, port in {[(a, port) for a in addresses] + [("1.1.1.1", 53), ("8.8.8.8", 443)]!r}:
    try:
        socket.create_connection((address, port), timeout=2).close()
        reached.append(address)
    except OSError:
        pass
print('REACHED', reached, sorted(n for _, n in socket.if_nameindex()))
"""
        result = py(get_sandbox("docker", world.spec()), code, timeout_s=30)
    assert result.ok, result.stderr_tail
    assert "REACHED [] ['lo']" in result.stdout_tail


def test_environment_has_no_host_secrets(world, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-do-not-leak")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-do-not-leak")
    result = get_sandbox("docker", world.spec()).run(["env"])
    assert result.ok, result.stderr_tail
    env = dict(line.split("=", 1) for line in result.stdout_tail.splitlines() if "=" in line)
    assert "OPENAI_API_KEY" not in env and "ANTHROPIC_API_KEY" not in env
    assert "do-not-leak" not in result.stdout_tail
    assert env["HF_HUB_OFFLINE"] == "1" and env["HOME"].startswith("/workspace")


def test_public_data_is_read_only_and_nothing_outside_the_workspace_is_writable(world) -> None:
    name = f"escape-{uuid.uuid4().hex}"
    targets = [f"/workspace/data/{name}", "/workspace/data/train.csv", f"/{name}", f"/usr/{name}",
               f"/etc/{name}"]
    code = f"""
written = []
for path in {targets!r}:
    try:
        open(path, 'a').write('x')
        written.append(path)
    except OSError:
        pass
open('/tmp/{name}', 'w').write('the container has its own /tmp')
open('/workspace/working/{name}', 'w').write('ok')
print('WRITTEN', written)
"""
    result = py(get_sandbox("docker", world.spec()), code)
    assert result.ok, result.stderr_tail
    assert "WRITTEN []" in result.stdout_tail
    assert (world.public / "train.csv").read_text() == world.public_text
    assert not (world.public / name).exists() and not os.path.exists(f"/tmp/{name}")
    assert (world.workspace / "working" / name).read_text() == "ok"


def test_private_data_is_not_mounted(world) -> None:
    labels = world.private / "labels.txt"
    assert labels.read_text() == world.secret  # the host can read it: the check below can fail
    code = f"""
import os
leaks = []
for path in [{str(labels)!r}, {str(world.data_root)!r}, '/workspace/private', '/workspace/data/../private',
             '/workspace/raw', '/workspace/data/private', '/workspace/data/raw']:
    if os.path.exists(path):
        leaks.append(path)
mounts = open('/proc/self/mountinfo').read()
if {str(world.private)!r} in mounts or '/task/private' in mounts or '/raw' in mounts:
    leaks.append('mountinfo')
print('DATA', sorted(os.listdir('/workspace/data')), 'LEAKS', leaks)
"""
    result = py(get_sandbox("docker", world.spec()), code)
    assert result.ok, result.stderr_tail
    assert "DATA ['train.csv'] LEAKS []" in result.stdout_tail
    assert world.secret not in result.stdout_tail


def test_fork_bomb_is_stopped_by_the_pids_limit(world) -> None:
    sandbox = get_sandbox("docker", world.spec(max_processes=32))
    code = """
import os, time
children = 0
for _ in range(400):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
    children += 1
print('FORKED', children)
"""
    result = py(sandbox, code, timeout_s=60)
    assert "FORKED" not in result.stdout_tail and not result.ok
    assert result.stopped_by == STOPPED_PROCESSES, result
    assert "Resource temporarily unavailable" in result.stderr_tail


def test_memory_runaway_is_stopped_by_the_memory_limit(world) -> None:
    sandbox = get_sandbox("docker", world.spec(memory_bytes=128 * 2**20))
    result = py(sandbox, "chunks = []\nwhile True:\n    chunks.append(b'x' * (8 * 2**20))", timeout_s=60)
    assert result.stopped_by == STOPPED_MEMORY, result


def test_a_planted_linked_submission_is_refused_by_the_collection(world, tmp_path) -> None:
    other = tmp_path / "other-run" / "submission"
    other.mkdir(parents=True)
    (other / "submission.csv").write_text("case,pred\nc0,stolen\n")
    sandbox = get_sandbox("docker", world.spec())
    result = sandbox.run(["sh", "-c", "ln -s /etc/passwd /workspace/submission/submission.csv"])
    assert result.ok, result.stderr_tail
    assert (world.workspace / "submission" / "submission.csv").is_symlink()
    got = Workspace(world.workspace).collect_submission("submission", tmp_path / "c1" / "s", file_columns=[])
    assert got.folder is None or not (tmp_path / "c1" / "s" / "submission.csv").exists()
    assert "symbolic link" in "\n".join(got.refused)
    # the whole folder swapped for a link to another run's submission
    result = sandbox.run(["sh", "-c", f"rm -r /workspace/submission && ln -s {other} /workspace/submission"])
    assert result.ok, result.stderr_tail
    got = Workspace(world.workspace).collect_submission("submission", tmp_path / "c2" / "s", file_columns=[])
    assert got.folder is None and "is a symbolic link, not a folder" in got.refused[0]
