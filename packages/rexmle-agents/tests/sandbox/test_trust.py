"""What agent code cannot do to the host, each attack planted from inside a real bubblewrap sandbox: become host
root, write the kernel's settings, reach another run's GPU, flood the host's disk through its output, or make the
harness follow, copy, densify or delete what it planted (the safe workspace module)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from rexmle_agents.safe_workspace import CopyLimits, Workspace
from rexmle_agents.sandbox import _process, get_sandbox, identity
from rexmle_grade.errors import SandboxError

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="bubblewrap is not installed (apt-get install -y bubblewrap)")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="what changes when the harness runs as root (CI does)")

PROBE = r'''
import json, os
found = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups()}
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
found.update({k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")})
writable, checked = [], 0
for folder, _, files in os.walk("/proc/sys"):
    for name in files:
        path = os.path.join(folder, name)
        checked += 1
        try:
            with open(path, "w"):
                writable.append(path)
        except OSError:
            pass
found["sys_checked"], found["sys_writable"] = checked, writable
for path in ("/proc/sysrq-trigger", "/proc/sys/kernel/core_pattern"):
    try:
        with open(path, "w") as fh:
            fh.write("|/tmp/pwn")
        found.setdefault("wrote", []).append(path)
    except OSError:
        pass
try:
    os.setuid(0)
    found["setuid0"] = True
except OSError:
    found["setuid0"] = False
try:
    found["config_gz"] = len(open("/proc/config.gz", "rb").read())
except OSError:
    found["config_gz"] = None
print(json.dumps(found))
'''


def probe(sandbox) -> dict:
    result = sandbox.run([sys.executable, "-c", PROBE], timeout_s=60)
    assert result.ok, result.stderr_tail
    return json.loads(result.stdout_path.read_text())


@needs_root
def test_agent_code_never_runs_as_host_root(world) -> None:
    sandbox = get_sandbox("bwrap", world.spec())
    found = probe(sandbox)
    user = sandbox.user
    assert user is not None and user.uid != 0
    assert (found["uid"], found["euid"], found["gid"]) == (user.uid, user.uid, user.gid)
    assert found["groups"] in ([], [user.gid])
    assert all(int(found[k], 16) == 0 for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))
    assert found["NoNewPrivs"] == "1" and found["setuid0"] is False
    assert found["sys_checked"] > 100 and found["sys_writable"] == []
    assert "wrote" not in found
    assert found["config_gz"] in (None, 0)


def test_proc_sys_is_read_only_whoever_the_harness_is(world) -> None:
    sandbox = get_sandbox("bwrap", world.spec())
    found = probe(sandbox)
    assert found["sys_writable"] == [] and "wrote" not in found
    assert found["uid"] == (sandbox.user.uid if os.geteuid() == 0 else os.getuid())


@needs_root
def test_files_the_agent_writes_stay_readable_and_removable_by_the_harness(world) -> None:
    sandbox = get_sandbox("bwrap", world.spec())
    result = sandbox.run(["/bin/sh", "-c", "mkdir -p deep/er && echo x > deep/er/f && chmod 000 deep/er/f deep/er "
                                           "deep && umask 077 && echo y > ../submission/own.txt"])
    assert result.ok, result.stderr_tail
    owner = (world.workspace / "submission" / "own.txt").stat()
    assert owner.st_uid == sandbox.user.uid
    assert (world.workspace / "submission" / "own.txt").read_text() == "y\n"
    assert Workspace(world.workspace).remove("working/deep") == []
    assert not (world.workspace / "working" / "deep").exists()


def test_sandbox_user_must_not_be_root(monkeypatch) -> None:
    identity._resolve_user.cache_clear()
    monkeypatch.setenv(identity.USER_VARIABLE, "0:0")
    with pytest.raises(SandboxError, match="is root"):
        identity._resolve_user("0:0")
    with pytest.raises(SandboxError, match="does not exist"):
        identity._resolve_user("no-such-user-rexmle")
    fixed = identity._resolve_user("4242:4243")
    assert fixed.owner == (4242, 4243) and fixed.shared


def test_container_runtimes_never_run_agent_code_as_root(world, monkeypatch) -> None:
    from rexmle_agents.sandbox import ApptainerSandbox, DockerSandbox, SandboxSpec
    from rexmle_agents.sandbox.base import Sandbox

    lease = identity.IdentityLease(user=identity.SandboxUser(name="rexmle-999", uid=999, gid=995), lock_fd=None)
    monkeypatch.setattr(Sandbox, "__init__", _init_as_root(Sandbox.__init__))
    spec = SandboxSpec(workspace=world.workspace, data=world.public, image="img.sif")
    docker = DockerSandbox(spec, identity=lease)
    line = docker.command(["python", "-V"])
    assert line[line.index("--user") + 1] == "999:995"
    for flag in ("--read-only", "--cap-drop", "--security-opt"):
        assert flag in line
    assert line[line.index("--cap-drop") + 1] == "ALL"
    assert line[line.index("--security-opt") + 1] == "no-new-privileges"
    apptainer = ApptainerSandbox(spec, identity=lease)
    line = apptainer.command(["python", "-V"])
    assert "--no-privs" in line and line[line.index("--security") + 1] == "uid:999,gid:995"
    assert "--containall" in line and "--cleanenv" in line


def _init_as_root(original):
    """Sandbox.__init__ as a harness running as root would run it (a test may not be root)."""

    def init(self, spec, **kwargs):
        original(self, spec, **kwargs)
        self.drops_privileges = True

    return init


# ---------------------------------------------------------------------------------------------------------------
# GPUs: only the run's own device nodes exist inside


def fake_gpus(root: Path, count: int) -> tuple[Path, Path]:
    proc, dev = root / "proc-gpus", root / "dev"
    dev.mkdir()
    for minor in range(count):
        folder = proc / f"0000:{minor + 1:02x}:00.0"
        folder.mkdir(parents=True)
        (folder / "information").write_text(f"Model: \t Fake GPU\nDevice Minor: \t {minor}\n"
                                            f"GPU UUID: \t GPU-fake-{minor}\n")
        (dev / f"nvidia{minor}").write_text("")
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (dev / name).write_text("")
    return proc, dev


def test_a_run_sees_only_its_own_gpus(world, tmp_path, monkeypatch) -> None:
    proc, dev = fake_gpus(tmp_path, 4)
    monkeypatch.setattr(identity, "NVIDIA_PROC", proc)
    monkeypatch.setattr(identity, "DEV_DIR", dev)
    monkeypatch.setattr(identity, "_smi_bus_ids", lambda: {})
    seen = {}
    for gpus in (("2",), ("GPU-fake-0", "GPU-fake-3"), ()):
        sandbox = get_sandbox("bwrap", world.spec(gpus=gpus))
        result = sandbox.run(["/bin/sh", "-c", "ls /dev; echo CVD=$CUDA_VISIBLE_DEVICES; unset CUDA_VISIBLE_DEVICES;"
                                               " ls /dev | grep -c nvidia || true"])
        assert result.ok, result.stderr_tail
        lines = result.stdout_tail.split()
        seen[gpus] = sorted(n for n in lines if n.startswith("nvidia"))
        assert f"CVD={','.join(f'GPU-fake-{g[-1]}' for g in gpus)}" in lines
    assert seen[("2",)] == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia2", "nvidiactl"]
    assert seen[("GPU-fake-0", "GPU-fake-3")] == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia3", "nvidiactl"]
    assert seen[()] == []  # a run given no GPU has no NVIDIA node at all


def test_an_unknown_gpu_is_refused_rather_than_binding_them_all(world, tmp_path, monkeypatch) -> None:
    proc, dev = fake_gpus(tmp_path, 2)
    monkeypatch.setattr(identity, "NVIDIA_PROC", proc)
    monkeypatch.setattr(identity, "DEV_DIR", dev)
    monkeypatch.setattr(identity, "_smi_bus_ids", lambda: {"0": "0000:01:00.0", "1": "0000:02:00.0"})
    with pytest.raises(SandboxError, match="lists no such GPU"):
        get_sandbox("bwrap", world.spec(gpus=("5",)))
    # with nvidia-smi, an index goes through its PCI bus id, not the minor number
    assert [d.minor for d in identity.resolve_gpus(["1"])] == [1]


# ---------------------------------------------------------------------------------------------------------------
# output: bounded logs


def test_a_flood_of_output_keeps_bounded_logs_with_head_and_tail(world) -> None:
    sandbox = get_sandbox("bwrap", world.spec())
    size = 3 * (_process.LOG_HEAD_BYTES + _process.LOG_TAIL_BYTES)
    result = sandbox.run(["/bin/sh", "-c", f"echo FIRST; head -c {size} /dev/zero | tr '\\0' x; echo; echo LAST; "
                                           "echo err >&2"], timeout_s=120)
    assert result.ok, result.stderr_tail
    kept = result.stdout_path.stat().st_size
    assert kept <= _process.LOG_HEAD_BYTES + _process.LOG_TAIL_BYTES + 200
    text = result.stdout_path.read_bytes()
    assert text.startswith(b"FIRST\n") and text.rstrip().endswith(b"LAST")
    assert b"bytes of output left out here" in text
    assert result.stdout_tail.rstrip().endswith("LAST") and len(result.stdout_tail) <= _process.TAIL_BYTES
    assert result.stderr_tail == "err\n"


# ---------------------------------------------------------------------------------------------------------------
# the safe workspace: what agent code plants, the harness never follows, densifies or deletes through


PLANT = r'''
import os, sys
sub = "/workspace/submission"
os.makedirs(sub + "/preds/deeper", exist_ok=True)
rows = []
def row(name):
    rows.append(name)
with open(sub + "/preds/good.bin", "wb") as fh:
    fh.write(b"good" * 1000)
row("preds/good.bin")
with open(sub + "/preds/sparse.bin", "wb") as fh:
    fh.truncate(300 * 1024 * 1024)  # 300 MB of holes
    fh.seek(100 * 1024 * 1024)
    fh.write(b"data in the middle")
row("preds/sparse.bin")
os.symlink(sys.argv[1], sub + "/preds/link.bin")  # a host file, by its host path
row("preds/link.bin")
os.symlink(sys.argv[2], sub + "/hostdir")  # a linked folder on the way to a file
row("hostdir/victim.txt")
os.mkfifo(sub + "/preds/fifo.bin")
row("preds/fifo.bin")
with open(sub + "/preds/setuid.bin", "wb") as fh:
    fh.write(b"suid")
os.chmod(sub + "/preds/setuid.bin", 0o6777)
row("preds/setuid.bin")
os.link(sub + "/preds/good.bin", sub + "/preds/hard.bin")
row("preds/hard.bin")
row("../escape.bin")
row("/etc/passwd")
deep = "/".join(["d"] * 20)
os.makedirs(sub + "/" + deep)
open(sub + "/" + deep + "/f.bin", "w").write("deep")
row(deep + "/f.bin")
with open(sub + "/submission.csv", "w") as fh:
    fh.write("case,pred\n")
    for i, name in enumerate(rows):
        fh.write(f"c{i},{name}\n")
'''


@pytest.fixture
def planted(world, tmp_path):
    canary = tmp_path / "canary.txt"
    canary.write_text("host canary")
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    (victim_dir / "victim.txt").write_text("host victim")
    sandbox = get_sandbox("bwrap", world.spec())
    result = sandbox.run([sys.executable, "-c", PLANT, str(canary), str(victim_dir)], timeout_s=60)
    assert result.ok, result.stderr_tail
    return world, canary, victim_dir


def test_a_submission_copy_takes_only_named_regular_files_and_never_follows_links(planted, tmp_path) -> None:
    world, canary, victim_dir = planted
    dest = tmp_path / "copy" / "submission"
    got = Workspace(world.workspace).collect_submission("submission", dest, file_columns=["pred"])
    copied = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert copied == ["preds/good.bin", "preds/hard.bin", "preds/setuid.bin", "preds/sparse.bin", "submission.csv"]
    reasons = "\n".join(got.refused)
    assert got.n_refused == 6, reasons
    for expected in ("'preds/link.bin' is a symbolic link", "the folder 'hostdir' is a symbolic link",
                     "'preds/fifo.bin' is a FIFO", "climbs out of its folder", "is absolute",
                     "nested deeper than 16 folders"):
        assert expected in reasons
    # a sparse file is copied as holes: 300 MB apparent, next to nothing allocated on the host
    sparse = (dest / "preds" / "sparse.bin").stat()
    assert sparse.st_size == 300 * 1024 * 1024 and sparse.st_blocks * 512 < 1024 * 1024
    with open(dest / "preds" / "sparse.bin", "rb") as fh:
        fh.seek(100 * 1024 * 1024)
        assert fh.read(18) == b"data in the middle"
    # plain copies: no setuid/setgid/sticky bit, no ownership the agent chose
    for path in dest.rglob("*"):
        info = path.lstat()
        assert not stat.S_ISLNK(info.st_mode)
        assert info.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX) == 0
        assert info.st_uid == os.geteuid()
    assert canary.read_text() == "host canary" and (victim_dir / "victim.txt").read_text() == "host victim"


def test_a_submission_copy_is_bounded_in_bytes_and_files(planted, tmp_path) -> None:
    world, _, _ = planted
    fs = Workspace(world.workspace)
    small = CopyLimits(max_file_bytes=10_000, max_total_bytes=4_002)
    got = fs.collect_submission("submission", tmp_path / "c1" / "s", file_columns=["pred"], limits=small)
    reasons = "\n".join(got.refused)
    assert "'preds/sparse.bin' is 314572800 bytes" in reasons and "the limit per file is 10000" in reasons
    assert "'preds/hard.bin' would bring the submission to 8000 bytes" in reasons  # a hard link costs its bytes
    assert (got.files, got.bytes) == (1, 4000)
    got = fs.collect_submission("submission", tmp_path / "c2" / "s", file_columns=["pred"],
                                limits=CopyLimits(max_files=1))
    assert "more than 1 files are named" in "\n".join(got.refused) and got.files == 1


def test_a_linked_submission_folder_is_refused_whole(world, tmp_path) -> None:
    victim = tmp_path / "someone-elses-final"
    victim.mkdir()
    (victim / "submission.csv").write_text("case,pred\nc0,1\n")
    sandbox = get_sandbox("bwrap", world.spec())
    result = sandbox.run(["/bin/sh", "-c", f"rmdir /workspace/submission && ln -s {victim} /workspace/submission"])
    assert result.ok, result.stderr_tail
    got = Workspace(world.workspace).collect_submission("submission", tmp_path / "c" / "s", file_columns=[])
    assert got.folder is None and "is a symbolic link, not a folder" in got.refused[0]


def test_resetting_a_folder_deletes_planted_links_never_their_targets(planted, tmp_path) -> None:
    world, canary, victim_dir = planted
    sandbox = get_sandbox("bwrap", world.spec())
    # a worker's folder swapped for a link to a host folder, and a deep tree the harness cannot walk whole
    result = sandbox.run(["/bin/sh", "-c", f"mkdir -p workers && ln -s {victim_dir} workers/1 && "
                                           f"mkdir -p $(printf 'n/%.0s' $(seq 80)) && ln -s {canary} n/c"])
    assert result.ok, result.stderr_tail
    fs = Workspace(world.workspace, owner=(os.geteuid(), os.getegid()))
    assert fs.reset_dir("working/workers/1/submission") == []
    assert (victim_dir / "victim.txt").read_text() == "host victim" and not (victim_dir / "submission").exists()
    assert (world.workspace / "working" / "workers" / "1").is_dir()
    assert not (world.workspace / "working" / "workers" / "1").is_symlink()
    notes = fs.reset_dir("working/n")
    assert notes and "renamed" in notes[0]  # too deep to walk: moved aside, not followed, not half-deleted
    assert fs.reset_dir("submission") == [] and fs.is_empty_dir("submission")
    assert canary.read_text() == "host canary"


def test_writes_replace_planted_links_and_folders(world, tmp_path) -> None:
    canary = tmp_path / "canary.txt"
    canary.write_text("host canary")
    host_dir = tmp_path / "hostdir"
    host_dir.mkdir()
    sandbox = get_sandbox("bwrap", world.spec())
    result = sandbox.run(["/bin/sh", "-c", f"ln -s {canary} /workspace/instructions.md && ln -s {canary} script.py "
                                           f"&& mkdir -p /workspace/.home && rm -r /workspace/.home && "
                                           f"ln -s {host_dir} /workspace/.home && mkdir folder.py"])
    assert result.ok, result.stderr_tail
    fs = Workspace(world.workspace)
    fs.write_text("instructions.md", "rules")
    fs.write_text("working/script.py", "print(1)")
    fs.write_text("working/folder.py", "print(2)")
    fs.ensure_dir(".home")
    assert canary.read_text() == "host canary" and list(host_dir.iterdir()) == []
    assert (world.workspace / "instructions.md").read_text() == "rules"
    assert (world.workspace / "working" / "folder.py").read_text() == "print(2)"
    assert not (world.workspace / ".home").is_symlink()
    # a linked parent folder is replaced too, never written through
    result = sandbox.run(["/bin/sh", "-c", f"rm -rf /workspace/working/sub && ln -s {host_dir} /workspace/working/sub"])
    fs.write_text("working/sub/x.py", "x")
    assert list(host_dir.iterdir()) == []


def test_workspace_usage_counts_allocated_bytes_without_following_links(world, tmp_path) -> None:
    sandbox = get_sandbox("bwrap", world.spec())
    result = sandbox.run(["/bin/sh", "-c", "head -c 3000000 /dev/urandom > a.bin && truncate -s 1G sparse.bin && "
                                           "ln -s / root-link && mkdir -p x/y/z"])
    assert result.ok, result.stderr_tail
    usage = Workspace(world.workspace).usage(skip=("data",))
    assert 3_000_000 <= usage.bytes < 4_000_000  # the sparse gigabyte costs nothing, the link is not followed
    assert usage.entries >= 7 and usage.depth >= 3 and usage.complete
    assert not Workspace(world.workspace).usage(max_entries=3).complete


def test_the_unprivileged_user_can_use_tmp_and_shared_memory(world) -> None:
    """What training code needs: /tmp, POSIX semaphores and shared memory (multiprocessing, DataLoader workers)."""
    code = ("import multiprocessing as mp, tempfile; lock = mp.Lock(); queue = mp.SimpleQueue(); "
            "from multiprocessing import shared_memory; block = shared_memory.SharedMemory(create=True, size=1024); "
            "block.close(); block.unlink(); tempfile.NamedTemporaryFile(); print('ok')")
    result = get_sandbox("bwrap", world.spec()).run([sys.executable, "-c", code])
    assert result.ok and result.stdout_tail == "ok\n", result.stderr_tail


def test_an_extra_bind_carries_a_unix_socket_in_and_nothing_else(world, tmp_path) -> None:
    """How a model relay reaches agent code: a Unix socket bound in, while the network stays unshared."""
    import socket
    import threading

    from rexmle_agents.sandbox import ExtraBind, SandboxSpec

    folder = tmp_path / "relay"
    folder.mkdir()
    folder.chmod(0o755)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(folder / "relay.sock"))
    (folder / "relay.sock").chmod(0o666)
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"pong:" + conn.recv(16))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    spec = SandboxSpec(workspace=world.workspace, data=world.public, binds=(ExtraBind(folder, "/run/rexmle"),))
    code = ("import socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/rexmle/relay.sock'); s.sendall(b'ping');"
            " print(s.recv(64).decode()); open('/run/rexmle/x', 'w')")
    result = get_sandbox("bwrap", spec).run([sys.executable, "-c", code], timeout_s=30)
    server.close()
    assert result.stdout_tail == "pong:ping\n", result.stderr_tail
    assert "Read-only file system" in result.stderr_tail  # read-only unless asked for
    with pytest.raises(SandboxError, match="must be an absolute path outside"):
        get_sandbox("bwrap", SandboxSpec(workspace=world.workspace, data=world.public,
                                         binds=(ExtraBind(folder, "/workspace/relay"),)))
    with pytest.raises(SandboxError, match="would expose"):
        get_sandbox("bwrap", SandboxSpec(workspace=world.workspace, data=world.public,
                                         binds=(ExtraBind(world.data_root, "/run/data"),)))
