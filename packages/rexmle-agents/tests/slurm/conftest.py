"""Fixtures of the SLURM tests: a real one-node cluster on this machine (``tools/slurm_local.py``: munged,
slurmctld and slurmd started in a scratch folder, stopped, jobs and all, however the tests end), the plug-in test
agent installed where the cluster's jobs find it, and a prepared synthetic task.

Without Debian's SLURM packages the tests marked ``slurm`` are skipped with the packages to install (in CI, whose
set-up installs them, they fail instead); a cluster that cannot start is reported with the step that failed and its
daemon's log."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[4]
HERE = Path(__file__).parent
TASKS = ("ldct-iqa", "usenhance")


def load_slurm_local() -> ModuleType:
    spec = importlib.util.spec_from_file_location("slurm_local", ROOT / "tools" / "slurm_local.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["slurm_local"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def _unavailable(why: str) -> None:
    if os.environ.get("CI"):  # CI installs the packages: there a missing cluster is a failure, not a skip
        pytest.fail(why)
    pytest.skip(why)


def open_folder(prefix: str) -> Path:
    """A folder every user may traverse: agent code runs as the unprivileged sandbox user."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    return folder


def start_cluster(**settings: Any) -> Iterator[Any]:
    tool = load_slurm_local()
    missing = tool.missing_packages(accounting=settings.get("accounting", False))
    if missing:
        _unavailable(f"SLURM is not installed: apt-get install -y {' '.join(missing)} (tools/setup.sh --dev does "
                     "it as root)")
    root = open_folder("rexmle-slurm-")
    try:
        cluster = tool.start(root, tool.ClusterConfig(gpus=0, max_time="2:00:00", **settings))
    except tool.ClusterError as exc:
        tool.stop(root, remove=True)
        _unavailable(f"the one-node SLURM cluster could not start here: {exc}")
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    _forget_cluster_config()
    try:
        yield cluster
    finally:
        # REXMLE_KEEP_SLURM=1 keeps the cluster's folder (its daemons' logs) to read after a failure
        tool.stop(root, remove=not os.environ.get("REXMLE_KEEP_SLURM"))
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        _forget_cluster_config()


def _forget_cluster_config() -> None:
    from rexmle_agents.executors.slurm_accounting import cluster_config

    cluster_config.cache_clear()


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Any]:
    """The one-node cluster, without accounting storage (SLURM_CONF points at it while it runs)."""
    yield from start_cluster()


@pytest.fixture(scope="session")
def plugin_agents(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``slurm-test-steps`` installed as a plug-in (a dist-info with its entry point) on PYTHONPATH, which the
    cluster's jobs inherit; registered in this process too."""
    site = tmp_path_factory.mktemp("plugin-site")
    site.chmod(0o755)
    shutil.copy(HERE / "plugin_agents.py", site / "plugin_agents.py")
    spec = importlib.util.spec_from_file_location("plugin_agents", site / "plugin_agents.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dist = site / f"{module.DIST_NAME}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.DIST_NAME}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(module.ENTRY_POINTS)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    from rexmle_agents.harness.agent import register_agent

    register_agent(module.StepsAgent)
    return site


@pytest.fixture(scope="session")
def slurm_data() -> Iterator[Path]:
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    root = open_folder("rexmle-slurm-data-")
    for task_id in TASKS:
        task = get_task(task_id)
        prepare_task(task, task_dirs(task, root), synthetic=True, cases=10, seed=0, force=False)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def accounting_cluster() -> Iterator[Any]:
    """Another one-node cluster, with accounting storage (slurmdbd on a MariaDB of its own): sacct works."""
    yield from start_cluster(accounting=True)


@pytest.fixture
def runs_dir() -> Iterator[Path]:
    root = open_folder("rexmle-slurm-runs-")
    yield root
    shutil.rmtree(root, ignore_errors=True)
