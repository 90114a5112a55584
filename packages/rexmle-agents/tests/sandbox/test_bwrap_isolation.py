"""The bwrap sandbox with real processes: what agent code inside can and cannot reach, and how limits stop it."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from rexmle_agents.sandbox import (
    STOPPED_CANCELLED,
    STOPPED_FILE_SIZE,
    STOPPED_MEMORY,
    STOPPED_PROCESSES,
    STOPPED_TIMEOUT,
    WORKSPACE,
    BwrapSandbox,
    SandboxSpec,
    _process,
    get_sandbox,
)
from rexmle_agents.sandbox.environment import secret_paths
from rexmle_grade.errors import SandboxError

from .conftest import host_listener

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="bubblewrap is not installed (apt-get install -y bubblewrap)")


def py(sandbox: BwrapSandbox, code: str, **kwargs: object):
    return sandbox.run([sys.executable, "-c", code], **kwargs)


def _leftovers(marker: str) -> list[int]:
    """Processes on the host whose command line carries ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_workspace_is_writable_and_data_readable(world) -> None:
    sandbox = get_sandbox("bwrap", world.spec())
    result = py(sandbox, "import os; print(os.getcwd()); print(open('/workspace/data/train.csv').read(), end='');"
                         "open('/workspace/submission/submission.csv', 'w').write('id,label\\n')")
    assert result.ok, result.stderr_tail
    assert result.stdout_tail.splitlines()[0] == f"{WORKSPACE}/working"
    assert world.public_text in result.stdout_tail
    assert (world.workspace / "submission" / "submission.csv").read_text() == "id,label\n"
    assert result.stdout_path is not None and result.stdout_path.read_text() == result.stdout_tail


def test_a_python_environment_under_tmp_is_reachable_while_tmp_stays_private(world, monkeypatch) -> None:
    import tempfile

    from rexmle_agents.sandbox import environment

    venv = Path(tempfile.mkdtemp(prefix="rexmle-venv-", dir="/tmp"))  # a fresh clone's .venv in /tmp
    venv.chmod(0o755)  # as a venv is (mkdtemp makes 0700, closed to an unprivileged sandbox user)
    try:
        tool = venv / "bin" / "tool"
        tool.parent.mkdir()
        tool.write_text("#!/bin/sh\necho tool-ran\n")
        tool.chmod(0o755)
        (venv.parent / f"{venv.name}-beside.txt").write_text("host tmp")
        real = environment.python_paths()
        monkeypatch.setattr(environment, "python_paths", lambda: [*real, venv])
        result = get_sandbox("bwrap", world.spec()).run(
            ["/bin/sh", "-c", f"{tool} && ls /tmp && touch /tmp/scratch && echo writable"])
        assert result.ok, result.stderr_tail
        # /tmp inside holds only the mounted environments' folders (the real venv too when it lies in /tmp)
        in_tmp = {p.relative_to("/tmp").parts[0] for p in [*real, venv] if p.is_relative_to("/tmp")}
        lines = result.stdout_tail.split()
        assert lines[0] == "tool-ran" and lines[-1] == "writable" and set(lines[1:-1]) == in_tmp
        assert f"{venv.name}-beside.txt" not in lines  # nothing else of the host's /tmp
    finally:
        shutil.rmtree(venv)
        (venv.parent / f"{venv.name}-beside.txt").unlink()


def test_private_data_is_unreachable_by_path_and_proc(world) -> None:
    sandbox = get_sandbox("bwrap", world.spec())
    labels = world.private / "labels.txt"
    assert labels.read_text() == world.secret  # the host can read it: the check below can fail
    code = f"""
import glob, os
leaks = []
for path in [{str(labels)!r}, '/proc/1/root' + {str(labels)!r}, '/proc/self/root' + {str(labels)!r}]:
    try:
        leaks.append(path + ':' + open(path).read())
    except OSError:
        pass
for pid_root in glob.glob('/proc/[0-9]*/root'):
    if os.path.exists(pid_root + {str(world.private)!r}):
        leaks.append(pid_root)
mounts = open('/proc/self/mountinfo').read()
if {str(world.private)!r} in mounts or '/task/private' in mounts:
    leaks.append('mountinfo')
if os.path.exists({str(world.data_root)!r}):
    leaks.append('data root visible: ' + str(os.listdir({str(world.data_root)!r})))
print('LEAKS', leaks)
"""
    result = py(sandbox, code)
    assert result.ok, result.stderr_tail
    assert "LEAKS []" in result.stdout_tail
    assert world.secret not in result.stdout_tail


def test_no_network_even_to_host_loopback(world) -> None:
    with host_listener() as (port, addresses):  # from the host, every address answers: the check inside can fail
        sandbox = get_sandbox("bwrap", world.spec())
        code = f"""
import socket
reached = []
for address in {addresses!r}:
    try:
        socket.create_connection((address, {port}), timeout=2).close()
        reached.append(address)
    except OSError:
        pass
print('REACHED', reached)
"""
        result = py(sandbox, code, timeout_s=20)
    assert result.ok, result.stderr_tail
    assert "REACHED []" in result.stdout_tail


def test_cannot_write_outside_the_workspace(world) -> None:
    sandbox = get_sandbox("bwrap", world.spec())
    name = f"escape-{uuid.uuid4().hex}"
    targets = ["/" + name, str(world.root / name), f"{WORKSPACE}/data/{name}", str(world.public / name),
               f"{sys.prefix}/{name}", f"{Path(__file__).parent}/{name}", f"/usr/{name}"]
    code = f"""
written = []
for path in {targets!r}:
    try:
        open(path, 'w').write('x')
        written.append(path)
    except OSError:
        pass
open('/tmp/{name}', 'w').write('inside tmp')
print('WRITTEN', written)
"""
    result = py(sandbox, code)
    assert result.ok, result.stderr_tail
    assert "WRITTEN []" in result.stdout_tail
    leaked = [p for p in [*targets, f"/tmp/{name}"] if Path(p).exists()]
    assert leaked == []


def test_environment_has_no_host_secrets(world, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-do-not-leak")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{tmp_path}:/usr/lib")  # the host's own folder is not passed in
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-do-not-leak")
    sandbox = get_sandbox("bwrap", world.spec(gpus=()))
    result = sandbox.run(["env"])
    assert result.ok, result.stderr_tail
    env = dict(line.split("=", 1) for line in result.stdout_tail.splitlines() if "=" in line)
    assert "OPENAI_API_KEY" not in env and "ANTHROPIC_API_KEY" not in env
    assert "do-not-leak" not in result.stdout_tail
    assert env["HF_HUB_OFFLINE"] == "1" and env["PYTHONUNBUFFERED"] == "1" and env["LANG"] == "C.UTF-8"
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["PATH"].split(":")[0] == f"{sys.prefix}/bin"
    assert env["LD_LIBRARY_PATH"] == "/usr/lib"


def test_leaderboards_are_not_readable(world) -> None:
    files, _ = secret_paths()
    if not files:
        pytest.skip("rexmle_tasks ships no leaderboard.csv in this checkout")
    board = files[0]
    assert board.read_text()  # readable on the host
    sandbox = get_sandbox("bwrap", world.spec())
    assert board in sandbox.view.hidden_files
    result = py(sandbox, """
import rexmle_tasks, pathlib
found = sorted(pathlib.Path(rexmle_tasks.__file__).parent.glob('challenges/*/leaderboard.csv'))
readable = []
for path in found:
    try:
        readable.append((str(path), len(path.read_bytes())))
    except OSError:
        pass
print('FOUND', len(found), 'READABLE', readable)
""")
    assert result.ok, result.stderr_tail
    assert f"FOUND {len(files)} READABLE []" in result.stdout_tail
    # Without capabilities the cover cannot be unmounted from inside.
    result = sandbox.run(["sh", "-c", f"grep CapEff /proc/self/status; umount {board}; cat {board}"])
    assert "CapEff:\t0000000000000000" in result.stdout_tail
    assert board.read_text()[:20] not in result.stdout_tail


def test_private_folder_inside_a_mounted_tree_is_refused(world) -> None:
    with pytest.raises(SandboxError, match="private"):
        BwrapSandbox(SandboxSpec(workspace=world.workspace, data=world.public.parent))  # the task root
    with pytest.raises(SandboxError, match="private"):
        BwrapSandbox(SandboxSpec(workspace=world.data_root, data=world.public))


def test_fork_bomb_is_stopped_by_the_process_limit(world) -> None:
    sandbox = get_sandbox("bwrap", world.spec(max_processes=32))
    marker = f"forkbomb-{uuid.uuid4().hex}"
    code = f"""
import os, time
# {marker}
for _ in range(400):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
"""
    start = time.monotonic()
    result = py(sandbox, code, timeout_s=30)
    assert result.stopped_by == STOPPED_PROCESSES, (result, sandbox.limits_mechanism)
    assert time.monotonic() - start < 10
    assert _leftovers(marker) == []


def test_fork_storm_that_ignores_failures_is_killed(world) -> None:
    sandbox = get_sandbox("bwrap", world.spec(max_processes=16))
    code = """
import os, time
while True:
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    except OSError:
        time.sleep(0.001)
"""
    result = py(sandbox, code, timeout_s=30)
    assert result.stopped_by == STOPPED_PROCESSES, result
    assert result.exit_code is None
    assert result.wall_s < 10


def test_memory_runaway_is_stopped_by_the_memory_limit(world) -> None:
    sandbox = get_sandbox("bwrap", world.spec(memory_bytes=128 * 2**20))
    result = py(sandbox, "chunks = []\nwhile True:\n    chunks.append(b'x' * (8 * 2**20))", timeout_s=30)
    assert result.stopped_by == STOPPED_MEMORY, (result, sandbox.limits_mechanism)
    assert result.wall_s < 10


def test_memory_limit_falls_back_to_rlimit_without_cgroups(world, monkeypatch) -> None:
    monkeypatch.setattr(_process, "detect_cgroups", lambda: None)
    sandbox = get_sandbox("bwrap", world.spec(memory_bytes=256 * 2**20, max_file_bytes=2**20))
    assert "rlimit" in sandbox.limits_mechanism and "cgroup" not in sandbox.limits_mechanism
    result = py(sandbox, "chunks = []\nwhile True:\n    chunks.append(b'x' * (8 * 2**20))", timeout_s=30)
    assert result.stopped_by == STOPPED_MEMORY, result
    assert "MemoryError" in result.stderr_tail


def test_endless_loop_is_stopped_by_the_timeout(world) -> None:
    sandbox = get_sandbox("bwrap", world.spec())
    marker = f"loop-{uuid.uuid4().hex}"
    result = sandbox.run(["sh", "-c", f"(while :; do :; done) & while :; do :; done # {marker}"], timeout_s=1.0)
    assert result.stopped_by == STOPPED_TIMEOUT
    assert result.exit_code is None
    assert 1.0 <= result.wall_s < 4
    assert result.cpu_s > 0  # counted (how much depends on the machine's load, so no more is asserted)
    assert _leftovers(marker) == []


@pytest.mark.parametrize("how", ["python", "shell"])
def test_file_larger_than_the_limit_fails(world, how) -> None:
    sandbox = get_sandbox("bwrap", world.spec(max_file_bytes=2**20))
    if how == "python":  # Python ignores SIGXFSZ and raises OSError(EFBIG)
        result = py(sandbox, "open('big.bin', 'wb').write(b'x' * (2 * 2**20))")
    else:  # the shell's child dies of SIGXFSZ
        result = sandbox.run(["sh", "-c", "head -c 3000000 /dev/zero > big.bin"])
    assert result.stopped_by == STOPPED_FILE_SIZE, result
    assert (world.workspace / "working" / "big.bin").stat().st_size <= 2**20


def test_cancel_and_kill_all_stop_a_running_command(world) -> None:
    sandbox = get_sandbox("bwrap", world.spec())
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    result = sandbox.run(["sleep", "30"], timeout_s=20, cancel=cancel)
    assert result.stopped_by == STOPPED_CANCELLED and result.wall_s < 5

    threading.Timer(0.3, sandbox.kill_all).start()
    result = sandbox.run(["sleep", "30"], timeout_s=20)
    assert result.stopped_by == STOPPED_CANCELLED and result.wall_s < 5


def test_exit_status_and_signals_are_reported(world, tmp_path) -> None:
    sandbox = get_sandbox("bwrap", world.spec())
    result = sandbox.run(["sh", "-c", "echo out; echo err >&2; exit 3"], log_dir=tmp_path / "logs", log_name="s1")
    assert (result.exit_code, result.stopped_by) == (3, None) and not result.ok
    assert result.stdout_tail == "out\n" and result.stderr_tail == "err\n"
    assert result.stderr_path == tmp_path / "logs" / "s1.stderr"
    result = sandbox.run(["sh", "-c", "kill -SEGV $$"])
    assert (result.exit_code, result.stopped_by) == (None, "signal:11")
