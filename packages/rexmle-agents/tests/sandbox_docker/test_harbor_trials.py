"""Harbor trials of an exported rexmle task for real, on the private Docker engine: Harbor's own ``harbor run`` with
its oracle agent and its no-op agent, in rexmle's Compose-free Harbor environment
(:mod:`rexmle_agents.integrations.harbor_docker`). The oracle's submission must reach the top of the leaderboard,
the no-op agent's empty workspace must score as the sample submission does, and ``rexmle import harbor`` must bring
both trials back as run folders that ``rexmle report`` reads.

No registry is reachable, so the task's base image is imported from the host: its system Python, bash and the
coreutils the tasks' scripts use, and the grader's requirements copied from this environment (the task is exported
with ``--no-install``, so the build downloads nothing).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rexmle_agents.integrations.harbor import ExportOptions, export_tasks

_spec = importlib.util.spec_from_file_location("_rexmle_harbor_tests",
                                               Path(__file__).parent.parent / "integrations" / "test_harbor.py")
assert _spec is not None and _spec.loader is not None  # a file next to this folder
_harbor_tests = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _harbor_tests
_spec.loader.exec_module(_harbor_tests)
harbor_python = _harbor_tests.harbor_python  # the pinned Harbor's virtual environment (built once, cached)

TASK = "ldct-iqa"
IMAGE = "rexmle-test-harbor-base:1"
ENVIRONMENT = "rexmle_agents.integrations.harbor_docker:RexmleDockerEnvironment"
SOURCES = Path(__file__).resolve().parents[2] / "src"  # rexmle_agents, importable by Harbor's Python
TOOLS = ("bash", "sh", "cat", "sleep", "env", "ls", "id", "touch", "ln", "rm", "rmdir", "head", "tail", "mkdir",
         "cp", "mv", "chmod", "chown", "timeout", "find", "test", "wc", "tar", "echo", "true", "dirname", "basename")
# what the grader imports on this task (measured with the exported verify.py), copied with their bundled libraries
REQUIREMENTS = ("numpy", "numpy.libs", "scipy", "scipy.libs", "skimage", "pycocotools", "pydantic", "pydantic_core",
                "annotated_types", "typing_extensions.py", "typing_inspection", "yaml", "platformdirs",
                "charset_normalizer", "lazy_loader", "tifffile", "PIL", "pillow.libs")


@pytest.fixture(scope="module")
def dataset(image_importer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import numpy

    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    site = Path(numpy.__file__).resolve().parents[1]
    extra = tuple((site / name, f"/usr/local/lib/python3.11/dist-packages/{name}") for name in REQUIREMENTS
                  if (site / name).exists())
    image_importer(tmp_path_factory.mktemp("harbor-image"), IMAGE, tools=TOOLS, extra=extra)
    root = tmp_path_factory.mktemp("harbor-engine-data")
    task = get_task(TASK)
    prepare_task(task, task_dirs(task, root), synthetic=True, cases=10, seed=0, secret="harbor-engine")
    out = tmp_path_factory.mktemp("harbor-engine-dataset")
    export_tasks([TASK], out, data_root=root,
                 options=ExportOptions(data="copy", base_image=IMAGE, pip_install=False, gpus=0, cpus=1,
                                       memory_gb=2, time_limit_s=600, verifier_timeout_s=600))
    return out


def harbor_run(python: Path, dataset: Path, jobs: Path, agent: str) -> Path:
    env = {**os.environ, "PYTHONPATH": str(SOURCES)}
    done = subprocess.run([str(python.parent / "harbor"), "run", "-p", str(dataset), "-a", agent, "-e", ENVIRONMENT,
                           "-o", str(jobs), "--job-name", agent, "-n", "1", "-y", "-q"],
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return jobs / agent


def reward_of(job: Path) -> dict:
    rewards = sorted(job.rglob("reward.json"))
    logs = "\n".join(p.read_text(errors="replace")[-1500:] for p in job.rglob("*.log"))
    assert len(rewards) == 1, f"no single reward.json under {job}: {rewards}\n{logs}"
    return json.loads(rewards[0].read_text())


def test_harbor_runs_the_oracle_and_a_no_op_agent_on_the_engine(dataset: Path, harbor_python: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    oracle = harbor_run(harbor_python, dataset, tmp_path / "jobs", "oracle")
    top = reward_of(oracle)
    assert top["valid"] == 1 and top["reward"] == 1.0 and top["fallback_to_sample"] == 0

    nop = harbor_run(harbor_python, dataset, tmp_path / "jobs", "nop")
    empty = reward_of(nop)
    assert empty["fallback_to_sample"] == 1 and empty["valid"] == 1  # nothing written: the sample is graded
    assert empty["reward"] < top["reward"]

    from rexmle_grade.cli import main

    runs = tmp_path / "runs" / "harbor"
    for job in (oracle, nop):
        assert main(["import", "harbor", str(job), "--runs-dir", str(runs)]) == 0
    capsys.readouterr()
    assert main(["report", str(runs), "--format", "json"]) == 0
    report = capsys.readouterr().out
    assert "harbor/oracle" in report and "harbor/nop" in report
