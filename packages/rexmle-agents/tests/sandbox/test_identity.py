"""One identity per run, nothing left behind that grants anything: each attack planted from inside real sandboxes
(two at once, as two runs on one machine would be), with the harness as root.

Keyrings are probed with the keyctl/add_key system calls through ctypes (no keyutils needed); a per-user quota with
inotify instances; a ``--sandbox none`` neighbour against a sandboxed run's relay socket and workspace; set-id files
against the sweep; and a run whose output grows its run folder against the run folder limit."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rexmle_agents.harness.agent import BaseAgent, register_agent
from rexmle_agents.harness.context import RunContext
from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.limits import GIB
from rexmle_agents.harness.runner import build_spec, execute_run
from rexmle_agents.harness.spec import Limits, Resources
from rexmle_agents.relay import RelayServer
from rexmle_agents.sandbox import BwrapSandbox, SandboxSpec, get_sandbox, identity
from rexmle_grade.errors import SandboxError

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="bubblewrap is not installed (apt-get install -y bubblewrap)")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="leasing host ids and dropping to them needs root (CI "
                                                          "runs as root)")
needs_keyctl = pytest.mark.skipif(identity._KEYCTL_SYSCALL is None, reason="keyctl's system call number is not "
                                                                            "known on this architecture")
# A range of its own for each test that needs to know which id comes next: the other tests (and other harnesses on
# this machine) lease from the default range.
TEST_RANGE_START = 1_900_900_000
TASK = "ldct-iqa"
SYSTEM_PYTHON = "/usr/bin/python3"  # reachable by every uid (the venv's interpreter may live under /root)

# System calls from inside: add_key(2) and keyctl(2) through libc's syscall(), numbers for this machine.
KEYS = textwrap.dedent('''
    import ctypes, json, os, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
    USER, SESSION, SEARCH = -4, -3, 10

    def add(description, keyring):
        key = libc.syscall(ADD_KEY, b"user", description.encode(), b"secret", 6, ctypes.c_long(keyring))
        return key if key > 0 else -ctypes.get_errno()

    def search(description, keyring):
        key = libc.syscall(KEYCTL, SEARCH, ctypes.c_long(keyring), b"user", description.encode(), 0)
        return key if key > 0 else -ctypes.get_errno()

    def persistent():  # this uid's persistent keyring (it outlives every process of the uid), linked to @s
        return libc.syscall(KEYCTL, 22, ctypes.c_long(-1), ctypes.c_long(SESSION))

    def listed(description):
        return [line for line in open("/proc/keys") if description in line]

    def wait_for(path):
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
''')


def python(code: str) -> list[str]:
    return [SYSTEM_PYTHON if Path(SYSTEM_PYTHON).exists() else sys.executable, "-c", code]


def lines(result) -> dict:
    assert result.ok, result.stderr_tail
    return json.loads(result.stdout_path.read_text().strip().splitlines()[-1])


class Run:
    """One run's folders: public data and a workspace."""

    def __init__(self, root: Path) -> None:
        self.public = root / "public"
        self.workspace = root / "run" / "workspace"
        self.public.mkdir(parents=True)
        (self.public / "train.csv").write_text("id,label\n")
        for sub in ("submission", "working"):
            (self.workspace / sub).mkdir(parents=True)

    def spec(self) -> SandboxSpec:
        return SandboxSpec(workspace=self.workspace, data=self.public)


@pytest.fixture
def worlds() -> Iterator[list[Run]]:
    """Three runs' folders under one every user may traverse (a `none` run reaches its workspace by host path)."""
    root = Path(tempfile.mkdtemp(prefix="rexmle-identity-"))
    root.chmod(0o755)
    try:
        yield [Run(root / name) for name in ("a", "b", "c")]
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def data_root() -> Iterator[Path]:
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    root = Path(tempfile.mkdtemp(prefix="rexmle-identity-data-"))
    root.chmod(0o755)
    task = get_task(TASK)
    prepare_task(task, task_dirs(task, root), synthetic=True, cases=10, seed=0, force=False)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@register_agent
class ShellAgent(BaseAgent):
    """Runs one shell command in the sandbox as its only step."""

    name: ClassVar[str] = "test-identity-shell"
    description: ClassVar[str] = "test agent: one sandboxed shell command"
    defaults: ClassVar[dict[str, Any]] = {"script": "true"}

    def run(self, ctx: RunContext) -> None:
        with ctx.step("command") as step:
            step.result["exit_code"] = ctx.execute(["/bin/sh", "-c", self.config["script"]]).exit_code


@pytest.fixture
def test_range(monkeypatch) -> int:
    monkeypatch.delenv(identity.USER_VARIABLE, raising=False)
    monkeypatch.setenv(identity.IDS_VARIABLE, f"{TEST_RANGE_START}:3")
    return TEST_RANGE_START


def hold_then_release(sandbox, code: str, workspace: Path) -> tuple[threading.Thread, list, Path]:
    """Run ``code`` (which writes ``ready`` then waits for ``go`` in its working folder) in a thread."""
    results: list = []
    thread = threading.Thread(target=lambda: results.append(sandbox.run(python(code), timeout_s=90)))
    thread.start()
    ready = workspace / "working" / "ready"
    deadline = time.monotonic() + 60
    while not ready.exists() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return thread, results, workspace / "working" / "go"


# ---------------------------------------------------------------------------------------------------------------
# one identity per run


@needs_root
@needs_keyctl
def test_concurrent_runs_have_their_own_ids_and_keyrings_and_a_released_id_keeps_no_key(worlds, test_range) -> None:
    run_a, run_b, run_c = (BwrapSandbox(w.spec()) for w in worlds)
    holder = KEYS + textwrap.dedent('''
        found = {"uid": os.getuid(), "user": add("rexmle-a-user", USER), "session": add("rexmle-a-session", SESSION),
                 "persistent": add("rexmle-a-persistent", persistent())}
        open("ready", "w").close()
        wait_for("go")
        found["own_user"] = search("rexmle-a-user", USER)
        print(json.dumps(found))
    ''')
    thread, results, go = hold_then_release(run_a, holder, worlds[0].workspace)
    try:
        prober = KEYS + textwrap.dedent('''
            print(json.dumps({"uid": os.getuid(), "user": search("rexmle-a-user", USER),
                              "session": search("rexmle-a-session", SESSION),
                              "persistent": search("rexmle-a-persistent", persistent()),
                              "listed": listed("rexmle-a-")}))
        ''')
        seen_by_b = lines(run_b.run(python(prober), timeout_s=60))
    finally:
        go.touch()
        thread.join(90)
    held = lines(results[0])
    assert min(held["user"], held["session"], held["persistent"]) > 0 and held["own_user"] == held["user"]
    assert held["uid"] == test_range and seen_by_b["uid"] == test_range + 1
    assert (seen_by_b["user"], seen_by_b["session"], seen_by_b["persistent"]) == (-126, -126, -126)  # ENOKEY
    assert seen_by_b["listed"] == []
    # the key outlives the command that added it while the run holds its id...
    kept = lines(run_a.run(python(KEYS + 'print(json.dumps([search("rexmle-a-user", USER), '
                                         'search("rexmle-a-persistent", persistent())]))')))
    assert min(kept) > 0
    run_a.close()
    # ... and the next run given the same id finds nothing of it
    seen_by_c = lines(run_c.run(python(prober), timeout_s=60))
    assert seen_by_c["uid"] == held["uid"]
    assert (seen_by_c["user"], seen_by_c["session"], seen_by_c["persistent"]) == (-126, -126, -126)
    assert seen_by_c["listed"] == []
    run_b.close()
    run_c.close()


@needs_keyctl
def test_every_command_starts_in_a_fresh_session_keyring(worlds) -> None:
    # the harness with a session keyring of its own, as a login (pam_keyinit) gives one: without a fresh one per
    # command, every command would possess it (and without one the kernel would make one per process anyway)
    identity.keyctl(identity.KEYCTL_JOIN_SESSION_KEYRING, 0)
    sandbox = BwrapSandbox(worlds[0].spec())  # two commands of one run: one identity, two session keyrings
    holder = KEYS + textwrap.dedent('''
        found = {"session": add("rexmle-first-session", SESSION)}
        open("ready", "w").close()
        wait_for("go")
        print(json.dumps(found))
    ''')
    thread, results, go = hold_then_release(sandbox, holder, worlds[0].workspace)
    try:
        probe = KEYS + 'print(json.dumps({"session": search("rexmle-first-session", SESSION)}))'
        second = lines(sandbox.run(python(probe), timeout_s=60))
    finally:
        go.touch()
        thread.join(90)
    assert lines(results[0])["session"] > 0 and second["session"] == -126  # ENOKEY
    sandbox.close()


@needs_root
def test_one_run_using_up_a_per_user_quota_does_not_make_another_fail(worlds, test_range) -> None:
    quota = int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    if quota > 900:
        pytest.skip(f"max_user_instances is {quota}: more inotify instances than one process may hold files")
    run_a, run_b = BwrapSandbox(worlds[0].spec()), BwrapSandbox(worlds[1].spec())
    inotify = textwrap.dedent('''
        import ctypes, json, os, time
        libc = ctypes.CDLL(None, use_errno=True)
        def one():
            fd = libc.inotify_init1(0)
            return fd if fd >= 0 else -ctypes.get_errno()
    ''')
    hog = inotify + textwrap.dedent('''
        held = []
        while (fd := one()) >= 0:
            held.append(fd)
        open("ready", "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists("go") and time.monotonic() < deadline:
            time.sleep(0.05)
        print(json.dumps({"held": len(held), "then": fd}))
    ''')
    thread, results, go = hold_then_release(run_a, hog, worlds[0].workspace)
    try:
        other = lines(run_b.run(python(inotify + 'print(json.dumps({"fd": one()}))'), timeout_s=60))
    finally:
        go.touch()
        thread.join(90)
    hogged = lines(results[0])
    assert hogged["held"] == quota and hogged["then"] == -24  # EMFILE: the whole per-user quota was taken
    assert other["fd"] >= 0
    run_a.close()
    run_b.close()


@needs_root
def test_an_unsandboxed_run_cannot_reach_a_sandboxed_neighbours_relay_or_workspace(worlds, test_range) -> None:
    neighbour = BwrapSandbox(worlds[0].spec())
    assert neighbour.run(["/bin/sh", "-c", "echo mine > own.txt"]).ok
    relay_dir = Path(tempfile.mkdtemp(prefix="rexmle-relay-"))
    relay_dir.chmod(0o755)  # as the external agent makes it
    (worlds[1].workspace / "data").symlink_to(worlds[1].public)
    unsandboxed = get_sandbox("none", worlds[1].spec(), allow_unsandboxed=True)
    try:
        with RelayServer(relay_dir, {}, socket_owner=neighbour.owner) as relay:
            attack = textwrap.dedent(f'''
                import json, os, socket
                found = {{"uid": os.getuid()}}
                def attempt(name, action):
                    try:
                        action()
                        found[name] = "done"
                    except OSError as exc:
                        found[name] = exc.errno
                def connect():
                    with socket.socket(socket.AF_UNIX) as s:
                        s.connect({str(relay.socket_path)!r})
                ws = {str(worlds[0].workspace)!r}
                attempt("relay", connect)
                attempt("write", lambda: open(os.path.join(ws, "working", "planted.py"), "w").write("x"))
                attempt("overwrite", lambda: open(os.path.join(ws, "working", "own.txt"), "w").write("x"))
                attempt("list", lambda: os.listdir(ws))
                print(json.dumps(found))
            ''')
            found = lines(unsandboxed.run(python(attack), timeout_s=60))
            with socket.socket(socket.AF_UNIX) as own:  # the socket is live: the harness (root) connects
                own.connect(str(relay.socket_path))
    finally:
        shutil.rmtree(relay_dir, ignore_errors=True)
    assert found["uid"] not in (0, neighbour.user.uid)
    assert (found["relay"], found["write"], found["overwrite"], found["list"]) == (13, 13, 13, 13)  # EACCES
    assert (worlds[0].workspace / "working" / "own.txt").read_text() == "mine\n"
    info = worlds[0].workspace.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (neighbour.user.uid, 0o700)
    neighbour.close()
    unsandboxed.close()


@needs_root
def test_a_leased_id_without_a_password_entry_still_has_a_home_and_a_name(worlds, test_range) -> None:
    sandbox = BwrapSandbox(worlds[0].spec())
    code = ("import getpass, json, os, pathlib; home = pathlib.Path.home(); (home / '.cache').mkdir(exist_ok=True); "
            "(home / '.cache' / 'x').write_text('ok'); "
            "print(json.dumps({'user': getpass.getuser(), 'home': str(home), 'uid': os.getuid()}))")
    found = lines(sandbox.run(python(code), timeout_s=60))
    assert found == {"user": identity.ACCOUNT_ENV_NAME, "home": "/workspace/.home", "uid": test_range}
    sandbox.close()


@needs_root
def test_a_released_workspace_goes_back_to_the_harness_and_over_to_the_next_identity(worlds, test_range) -> None:
    first = BwrapSandbox(worlds[0].spec())
    assert first.run(["/bin/sh", "-c", "mkdir -p deep/er && echo one > deep/er/f && chmod 700 deep"]).ok
    first_uid = first.user.uid
    first.close()
    holding = identity.lease_identity()  # the first's id, now free: the next run gets another
    root = worlds[0].workspace.stat()
    assert (root.st_uid, stat.S_IMODE(root.st_mode)) == (0, 0o700)
    later = BwrapSandbox(worlds[0].spec())
    result = later.run(["/bin/sh", "-c", "echo two >> deep/er/f && id -u"])
    assert result.ok, result.stderr_tail
    assert int(result.stdout_tail.split()[0]) == later.user.uid != first_uid
    assert (worlds[0].workspace / "working" / "deep" / "er" / "f").stat().st_uid == later.user.uid
    later.close()
    holding.release()


def test_the_range_is_checked_against_the_machines_accounts(tmp_path, monkeypatch) -> None:
    (tmp_path / "passwd").write_text("root:x:0:0::/root:/bin/sh\nbob:x:1900000005:100::/home/bob:/bin/sh\n")
    (tmp_path / "group").write_text("root:x:0:\n")
    (tmp_path / "subuid").write_text("alice:1899999000:2000\n")
    (tmp_path / "subgid").write_text("alice:100000:65536\n")
    found = identity.range_conflicts(1_900_000_000, 4096, etc=tmp_path)
    assert found == [f"{tmp_path}/passwd: bob:x:1900000005:100::/home/bob:/bin/sh",
                     f"{tmp_path}/subuid: alice:1899999000:2000"]
    assert identity.range_conflicts(1_900_010_000, 10, etc=tmp_path) == []
    assert identity.range_conflicts(*identity.DEFAULT_ID_RANGE) == []  # this machine leaves the default free
    for bad in ("12", "0:10", "1900000000:0", "2147483000:1000"):
        monkeypatch.setenv(identity.IDS_VARIABLE, bad)
        with pytest.raises(SandboxError, match=identity.IDS_VARIABLE):
            identity.id_range()


@needs_root
def test_leases_exclude_other_processes_and_die_with_their_holder(monkeypatch) -> None:
    wanted = f"{TEST_RANGE_START + 10}:1"
    monkeypatch.delenv(identity.USER_VARIABLE, raising=False)
    monkeypatch.setenv(identity.IDS_VARIABLE, wanted)
    holder = subprocess.Popen(
        [sys.executable, "-c", "from rexmle_agents.sandbox import identity; lease = identity.lease_identity(); "
                               "print(lease.user.uid, flush=True); import time; time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert int(holder.stdout.readline()) == TEST_RANGE_START + 10
        with pytest.raises(SandboxError, match="all 1 sandbox ids"):
            identity.lease_identity()
    finally:
        holder.kill()
        holder.wait()
    lease = identity.lease_identity()  # the killed holder's lease died with it
    assert lease.user.uid == TEST_RANGE_START + 10
    lease.release()


@needs_root
def test_the_fixed_user_variable_keeps_one_shared_identity(worlds, monkeypatch) -> None:
    identity._resolve_user.cache_clear()
    monkeypatch.setenv(identity.USER_VARIABLE, "4242:4243")
    one, two = BwrapSandbox(worlds[0].spec()), BwrapSandbox(worlds[1].spec())
    assert one.run(["true"]).ok
    assert one.user == two.user and one.user.shared and one.owner == (4242, 4243)
    one.close()
    assert worlds[0].workspace.stat().st_uid == 4242  # a shared identity keeps its workspace
    two.close()


# ---------------------------------------------------------------------------------------------------------------
# nothing left behind grants anything


def test_set_id_files_the_agent_makes_lose_their_bits_after_the_command(worlds) -> None:
    sandbox = BwrapSandbox(worlds[0].spec())
    plant = ("cp /bin/sh suid && chmod 4755 suid && cp /bin/sh sgid && chmod 2755 sgid && mkdir -p d/e && "
             "cp /bin/sh d/e/both && chmod 6755 d/e/both && chmod 2775 d && ln -s suid link && "
             "stat -c '%a %n' suid sgid d/e/both d && grep ' /workspace ' /proc/self/mountinfo")
    result = sandbox.run(["/bin/sh", "-c", plant])
    assert result.ok, result.stderr_tail
    inside = result.stdout_tail.split("\n")
    assert inside[:4] == ["4755 suid", "2755 sgid", "6755 d/e/both", "2775 d"]  # the bits were set inside
    options = inside[4].split()[5].split(",")
    assert "nosuid" in options and "nodev" in options  # and meant nothing there
    working = worlds[0].workspace / "working"
    modes = {name: stat.S_IMODE((working / name).lstat().st_mode)
             for name in ("suid", "sgid", "d/e/both", "d")}
    assert modes == {"suid": 0o755, "sgid": 0o755, "d/e/both": 0o755, "d": 0o775}
    assert (working / "link").is_symlink()
    sandbox.close()


def test_the_run_folder_limit_stops_a_run_whose_output_grows_it(data_root: Path, tmp_path: Path) -> None:
    # every command's output is kept in the run folder's logs (up to 5 MiB a stream): 3 MiB is over 2 MiB
    script = ("cp /workspace/data/sample_submission/submission.csv /workspace/submission/ && "
              "head -c 2400000 /dev/urandom | base64 && sleep 30")
    spec = build_spec(TASK, agent="test-identity-shell", agent_config={"script": script},
                      data_root=data_root, limits=Limits(time_limit_s=120, exec_timeout_s=60), group="attack",
                      resources=Resources(run_folder_gb=0.002))
    outcome = execute_run(spec, tmp_path / "runs")
    assert (outcome.state, outcome.limit) == ("finished", "run_folder") and outcome.seconds < 25
    assert "run folder limit exceeded" in outcome.reason and "--run-folder-gb" in outcome.reason
    events = list(Journal(outcome.run_dir / "journal.jsonl").iter_events())
    started = next(e for e in events if e["kind"] == "run_started")
    assert started["limits"]["run_folder_bytes"] == int(0.002 * GIB)
    stop = next(e for e in events if e["kind"] == "budget_exhausted")
    assert stop["limit"] == "run_folder" and stop["usage"]["bytes"] > 0.002 * GIB
    status = json.loads((outcome.run_dir / "status.json").read_text())
    assert status["limit"] == "run_folder" and "run folder limit" in status["reason"]
    assert outcome.grade.valid_submission  # the workspace's submission is still collected and graded
