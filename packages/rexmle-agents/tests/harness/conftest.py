"""Fixtures of the harness tests: a prepared synthetic task (LDCT-IQA: small 2-D images, a CSV submission) and
test agents that exercise the harness with real sandboxed processes."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rexmle_agents.harness.agent import BaseAgent, register_agent
from rexmle_agents.harness.context import RunContext
from rexmle_grade.errors import RexmleError

TASK = "ldct-iqa"


# A tiny non-deep model, written as an agent would write it: quality falls with image noise, so a linear fit of
# the scores on a log noise estimate beats the constant sample submission.
NOISE_FIT_SCRIPT = '''
import csv, os
from pathlib import Path
import numpy as np
import tifffile
from scipy import ndimage

data = Path(os.environ["REXMLE_PUBLIC_DIR"])
out = Path(os.environ["REXMLE_WORKSPACE"]) / "submission"

def noise(path):
    image = tifffile.imread(path).astype(float)
    residual = image - ndimage.gaussian_filter(image, 2)
    return float(np.log(np.median(np.abs(residual[image > 0]))))

rows = list(csv.DictReader((data / "train" / "labels.csv").open()))
x = [noise(data / "train" / "images" / (r["image_id"] + ".tif")) for r in rows]
slope, intercept = np.polyfit(x, [float(r["quality_score"]) for r in rows], 1)
test_ids = [r["image_id"] for r in csv.DictReader((data / "sample_submission" / "submission.csv").open())]
out.mkdir(exist_ok=True)
with (out / "submission.csv").open("w", newline="") as fh:
    writer = csv.writer(fh)
    writer.writerow(["image_id", "quality_score"])
    for i in test_ids:
        writer.writerow([i, slope * noise(data / "test" / "images" / (i + ".tif")) + intercept])
print("fitted", slope, intercept)
'''


@register_agent
class NoiseFitAgent(BaseAgent):
    """Trains a tiny non-deep model inside the sandbox and submits its predictions."""

    name: ClassVar[str] = "test-noise-fit"
    description: ClassVar[str] = "test agent: a linear fit on a noise estimate (LDCT-IQA)"

    def run(self, ctx: RunContext) -> None:
        with ctx.step("fit") as step:
            result = ctx.run_python(NOISE_FIT_SCRIPT, filename="fit.py")
            step.result["exit_code"] = result.exit_code
            if result.ok:
                ctx.select_final(ctx.snapshot_submission("noise fit", code=NOISE_FIT_SCRIPT), reason="only model")


@register_agent
class CommandsAgent(BaseAgent):
    """Runs the given shell commands, one step each, saving its progress as state after every step."""

    name: ClassVar[str] = "test-commands"
    description: ClassVar[str] = "test agent: one sandboxed shell command per step"
    defaults: ClassVar[dict[str, Any]] = {"commands": [], "timeout_s": None, "submit_sample_first": False}

    def run(self, ctx: RunContext) -> None:
        state = ctx.load_state() or {"done": 0}
        if self.config["submit_sample_first"] and state["done"] == 0:
            ctx.execute(f"cp -R {ctx.workspace}/data/sample_submission/. {ctx.workspace}/submission/")
            ctx.snapshot_submission("sample first")
        for index in range(state["done"], len(self.config["commands"])):
            with ctx.step("command", index=index) as step:
                result = ctx.execute(self.config["commands"][index], timeout_s=self.config["timeout_s"])
                step.result.update(exit_code=result.exit_code, stopped_by=result.stopped_by,
                                   stdout=result.stdout_tail[-200:])
                # saved inside the step: a kill after this line leaves the step "interrupted" but never redone
                state["done"] = index + 1
                ctx.save_state(state)


@register_agent
class AttackAgent(BaseAgent):
    """Runs ``script`` in the sandbox (an attack planted from inside), optionally a ``run_python`` script under a
    planted name, then submits what the workspace holds (or fails, quoting what the script printed)."""

    name: ClassVar[str] = "test-attack"
    description: ClassVar[str] = "test agent: plants an attack from inside the sandbox, then submits"
    defaults: ClassVar[dict[str, Any]] = {"script": "true", "python_as": None, "submit": True,
                                          "fail_with_output": False}

    def run(self, ctx: RunContext) -> None:
        with ctx.step("attack") as step:
            result = ctx.execute(["/bin/sh", "-c", self.config["script"]])
            step.result.update(exit_code=result.exit_code, stdout=result.stdout_tail[-2000:],
                               stderr=result.stderr_tail[-2000:])
            if self.config["fail_with_output"] and not result.ok:
                raise RexmleError(f"the script failed: {result.stderr_tail[-500:]}")
            if self.config["python_as"]:
                ran = ctx.run_python("print('the harness wrote me')", filename=self.config["python_as"])
                step.result["python"] = ran.stdout_tail
            if self.config["submit"]:
                snapshot = ctx.snapshot_submission("attack")
                ctx.select_final(snapshot, reason="the attack's submission")


def open_folder(prefix: str) -> Path:
    """A folder every user may traverse (pytest's own are 0700): unsandboxed code run as the unprivileged sandbox
    user (the harness as root) reaches its workspace and the data by their host paths."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    return folder


@pytest.fixture(scope="session")
def data_root() -> Iterator[Path]:
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    root = open_folder("rexmle-harness-data-")
    task = get_task(TASK)
    prepare_task(task, task_dirs(task, root), synthetic=True, cases=10, seed=0, force=False)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def open_runs_dir() -> Iterator[Path]:
    root = open_folder("rexmle-runs-")
    yield root
    shutil.rmtree(root, ignore_errors=True)
