"""Choosing a sandbox, the `none` escape hatch, the scrubbed environment, and the Apptainer/Docker command lines."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rexmle_agents.sandbox import (
    SANDBOX_KINDS,
    STOPPED_TIMEOUT,
    WORKSPACE,
    ApptainerSandbox,
    BwrapSandbox,
    DockerSandbox,
    NoSandbox,
    SandboxLimits,
    SandboxSpec,
    _process,
    default_sandbox_kind,
    get_sandbox,
)
from rexmle_agents.sandbox.environment import DEFAULT_PATH, python_paths, sandbox_env
from rexmle_grade.errors import SandboxError, UnknownNameError


def test_kinds_and_unknown_kind(world) -> None:
    assert SANDBOX_KINDS == ("bwrap", "apptainer", "docker", "none")
    with pytest.raises(UnknownNameError, match="bwarp") as info:
        get_sandbox("bwarp", world.spec())
    assert "bwrap" in str(info.value)


def test_default_kind_and_missing_bubblewrap(monkeypatch) -> None:
    if shutil.which("bwrap") is not None:
        assert default_sandbox_kind() == "bwrap"
    monkeypatch.setattr(BwrapSandbox, "unavailable_reason", classmethod(lambda cls: "bwrap is not installed"))
    with pytest.raises(SandboxError) as info:
        default_sandbox_kind()
    text = str(info.value)
    assert "apt-get install -y bubblewrap" in text and "--sandbox none --allow-unsandboxed" in text
    assert "apptainer|docker" in text


def test_unavailable_runtime_names_its_reason(world, monkeypatch) -> None:
    monkeypatch.setattr(DockerSandbox, "unavailable_reason", classmethod(lambda cls: "no Docker engine is reachable"))
    with pytest.raises(SandboxError, match="no Docker engine is reachable"):
        get_sandbox("docker", SandboxSpec(workspace=world.workspace, data=world.public, image="img"))


def test_none_needs_explicit_permission_and_warns(open_world, monkeypatch, caplog) -> None:
    world = open_world
    with pytest.raises(SandboxError, match="without isolation"):
        get_sandbox("none", world.spec())
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-do-not-leak")
    with caplog.at_level(logging.WARNING):
        sandbox = get_sandbox("none", world.spec(max_file_bytes=2**20), allow_unsandboxed=True)
    assert "SANDBOX DISABLED" in caplog.text
    assert not sandbox.isolating and sandbox.workspace_path == str(world.workspace.resolve())
    assert not (world.workspace / "data").exists()  # making a sandbox has no side effects
    (world.workspace / "data").symlink_to(world.public)  # what the harness does for `none`
    result = sandbox.run([sys.executable, "-c", "import os; print(os.getcwd()); print(sorted(os.environ));"
                                                "print(open('../data/train.csv').read(), end='')"])
    assert result.ok, result.stderr_tail
    cwd, names, data = result.stdout_tail.split("\n", 2)
    assert cwd == str(world.workspace.resolve() / "working")
    assert "OPENAI_API_KEY" not in names and "HF_HUB_OFFLINE" in names
    assert data == world.public_text  # workspace/data links to the public data


def test_none_timeout_kills_the_whole_tree(world) -> None:
    sandbox = NoSandbox(world.spec())
    marker = f"sleep-{uuid.uuid4().hex}"
    script = f"setsid sh -c 'sleep 60 # {marker}' & sh -c 'sleep 60 # {marker}' & wait"
    start = time.monotonic()
    result = sandbox.run(["sh", "-c", script], timeout_s=0.5)
    assert result.stopped_by == STOPPED_TIMEOUT and time.monotonic() - start < 5
    time.sleep(0.1)
    left = [p for p in os.listdir("/proc") if p.isdigit() and marker.encode() in _cmdline(p)]
    assert left == []


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_limits_mechanism_is_reported(world, monkeypatch) -> None:
    sandbox = NoSandbox(world.spec(memory_bytes=2**30, max_processes=64, max_file_bytes=2**20))
    assert "fsize" in sandbox.limits_mechanism
    monkeypatch.setattr(_process, "detect_cgroups", lambda: None)
    plan = _process.plan_limits(memory_bytes=2**30, max_processes=64, max_file_bytes=2**20, cpus=None, gpus=False)
    assert plan.mechanism == "rlimit: as, nproc, fsize"
    gpu_plan = _process.plan_limits(memory_bytes=2**30, max_processes=None, max_file_bytes=None, cpus=None, gpus=True)
    assert "not enforced" in gpu_plan.mechanism and not gpu_plan.memory_by_rlimit


def test_environment_is_built_from_scratch(world, monkeypatch) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_do_not_leak")
    spec = SandboxSpec(workspace=world.workspace, data=world.public, env={"SEED": "3"},
                       limits=SandboxLimits(gpus=("1", "3"), cpus=2))
    env = sandbox_env(spec, workspace=WORKSPACE, tmpdir="/tmp", venv_bin="/venv/bin")
    assert "GITHUB_TOKEN" not in env and "ghp_do_not_leak" not in env.values()
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3" and env["OMP_NUM_THREADS"] == "2" and env["SEED"] == "3"
    assert env["HOME"].startswith(WORKSPACE) and env["TMPDIR"] == "/tmp" and env["PATH"].startswith("/venv/bin:")
    bad = SandboxSpec(workspace=world.workspace, data=world.public, env={"OPENAI_API_KEY": "x"})
    with pytest.raises(SandboxError, match="OPENAI_API_KEY"):
        sandbox_env(bad, workspace=WORKSPACE)


def test_host_search_paths_are_kept_only_inside_the_system_folders(world, monkeypatch, tmp_path) -> None:
    """A GPU machine's driver tools and libraries (/usr/local/nvidia/bin, .../lib64) are often found only through
    PATH and LD_LIBRARY_PATH: a sandbox showing the host's system folders keeps those entries, and no other."""
    spec = SandboxSpec(workspace=world.workspace, data=world.public)
    monkeypatch.setenv("PATH", f"{tmp_path}:relative/bin:/usr/share:/usr/bin:/nonexistent/usr")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/usr/lib:{tmp_path}:/usr/lib")
    env = sandbox_env(spec, workspace=WORKSPACE, venv_bin="/venv/bin", host_system=True)
    assert env["PATH"].split(":") == ["/venv/bin", *DEFAULT_PATH.split(":"), "/usr/share"]
    assert env["LD_LIBRARY_PATH"] == "/usr/lib"
    plain = sandbox_env(spec, workspace=WORKSPACE, venv_bin="/venv/bin")  # a container has its own system
    assert "/usr/share" not in plain["PATH"] and "LD_LIBRARY_PATH" not in plain
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    assert "LD_LIBRARY_PATH" not in sandbox_env(spec, workspace=WORKSPACE, host_system=True)


def test_python_paths_cover_venv_and_editable_sources() -> None:
    paths = python_paths()
    assert Path(sys.prefix).resolve() in paths
    import rexmle_agents

    source = Path(rexmle_agents.__file__).resolve()
    assert any(source.is_relative_to(p) for p in paths)


def test_bad_spec_is_refused(world, tmp_path) -> None:
    with pytest.raises(SandboxError, match="does not exist"):
        NoSandbox(SandboxSpec(workspace=tmp_path / "missing", data=world.public))
    with pytest.raises(SandboxError, match="inside the workspace"):
        NoSandbox(SandboxSpec(workspace=world.workspace, data=world.public, workdir="../elsewhere"))


def _flag_value(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_apptainer_command(world) -> None:
    with pytest.raises(SandboxError, match="needs an image"):
        ApptainerSandbox(world.spec())
    spec = SandboxSpec(workspace=world.workspace, data=world.public, image="rexmle.sif",
                       limits=SandboxLimits(gpus=("0",)))
    argv = ApptainerSandbox(spec).command(["python", "train.py"])
    assert Path(argv[0]).name == "apptainer" and argv[1] == "exec"
    for flag in ("--containall", "--no-home", "--cleanenv", "--net", "--nv"):
        assert flag in argv
    assert _flag_value(argv, "--network") == ["none"]
    assert _flag_value(argv, "--bind") == [f"{world.workspace.resolve()}:{WORKSPACE}:rw",
                                           f"{world.public.resolve()}:{WORKSPACE}/data:ro"]
    assert _flag_value(argv, "--pwd") == [f"{WORKSPACE}/working"]
    assert "CUDA_VISIBLE_DEVICES=0" in _flag_value(argv, "--env")
    assert argv[-3:] == ["rexmle.sif", "python", "train.py"]
    no_gpu = ApptainerSandbox(SandboxSpec(workspace=world.workspace, data=world.public, image="x.sif"))
    assert "--nv" not in no_gpu.command(["true"])


def test_docker_command(world) -> None:
    with pytest.raises(SandboxError, match="needs an image"):
        DockerSandbox(world.spec())
    limits = SandboxLimits(memory_bytes=2**30, max_processes=100, max_file_bytes=2**20, cpus=4, gpus=("2", "5"))
    sandbox = DockerSandbox(SandboxSpec(workspace=world.workspace, data=world.public, image="rexmle:1",
                                        limits=limits))
    assert sandbox.limits_mechanism.startswith("docker engine")
    argv = sandbox.command(["python", "-V"], name="rexmle-abc")
    assert argv[1:3] == ["run", "--rm"] and "--read-only" in argv
    assert _flag_value(argv, "--network") == ["none"] and _flag_value(argv, "--name") == ["rexmle-abc"]
    assert _flag_value(argv, "--memory") == [str(2**30)] and _flag_value(argv, "--pids-limit") == ["100"]
    assert _flag_value(argv, "--ulimit") == [f"fsize={2**20}:{2**20}"] and _flag_value(argv, "--cpus") == ["4"]
    assert _flag_value(argv, "--gpus") == ['"device=2,5"']
    assert _flag_value(argv, "-v") == [f"{world.workspace.resolve()}:{WORKSPACE}:rw",
                                       f"{world.public.resolve()}:{WORKSPACE}/data:ro"]
    assert _flag_value(argv, "-w") == [f"{WORKSPACE}/working"]
    assert "CUDA_VISIBLE_DEVICES=0,1" in _flag_value(argv, "-e")
    assert argv[-3:] == ["rexmle:1", "python", "-V"]
    open_net = DockerSandbox(SandboxSpec(workspace=world.workspace, data=world.public, image="i", network=True))
    assert "--network" not in open_net.command(["true"])


@pytest.mark.skipif(ApptainerSandbox.unavailable_reason() is not None or not os.environ.get("REXMLE_TEST_SIF"),
                    reason="needs apptainer and an image with Python in $REXMLE_TEST_SIF")
def test_apptainer_runs_a_command(world) -> None:
    spec = SandboxSpec(workspace=world.workspace, data=world.public, image=os.environ["REXMLE_TEST_SIF"])
    result = get_sandbox("apptainer", spec).run(["sh", "-c", "cat /workspace/data/train.csv; touch ../submission/x"])
    assert result.ok and world.public_text in result.stdout_tail
    assert (world.workspace / "submission" / "x").exists()


def _docker_engine_reachable() -> bool:
    return DockerSandbox.unavailable_reason() is None


@pytest.mark.skipif(not _docker_engine_reachable() or not os.environ.get("REXMLE_TEST_DOCKER_IMAGE"),
                    reason="needs a reachable Docker engine and an image in $REXMLE_TEST_DOCKER_IMAGE")
def test_docker_runs_a_command(world) -> None:
    spec = SandboxSpec(workspace=world.workspace, data=world.public, image=os.environ["REXMLE_TEST_DOCKER_IMAGE"])
    sandbox = get_sandbox("docker", spec)
    result = sandbox.run(["sh", "-c", "cat /workspace/data/train.csv"])
    assert result.ok and world.public_text in result.stdout_tail
    result = sandbox.run(["sleep", "60"], timeout_s=1)
    assert result.stopped_by == STOPPED_TIMEOUT
    names = subprocess.run(["docker", "ps", "--format", "{{.Names}}"], capture_output=True, text=True, check=True)
    assert "rexmle-" not in names.stdout


def test_stale_cgroups_of_dead_harnesses_are_removed() -> None:
    from rexmle_agents.sandbox import _cgroups

    support = _cgroups.detect_cgroups()
    if support is None:
        pytest.skip("no writable cgroups here")
    parent = next(iter(support.parents.values()))
    dead_pid = 2**22 + 17  # above the kernel's pid_max: never a live process
    stale = parent / f"rexmle-{dead_pid}-0-0"
    live = parent / f"rexmle-{os.getpid()}-999999-0"
    stale.mkdir()
    live.mkdir()
    try:
        _cgroups._sweep_stale(support)
        assert not stale.exists() and live.exists()
    finally:
        for folder in (stale, live):
            if folder.exists():
                folder.rmdir()
