"""The ``baseline`` agent: which baseline it picks (strongest first, per config), the command it runs in the
sandbox (device from the run's hardware, the run's remaining time as the time budget, resume), a pipeline cut by
the per-execution limit is resumed, a valid partial submission is kept, and cached weights are copied in.

The run context is a small fake: what is checked is the agent's own logic, not the harness."""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("rexmle_baselines")

from rexmle_agents.agents.baseline import BaselineAgent
from rexmle_agents.sandbox.base import STOPPED_TIMEOUT
from rexmle_grade.errors import RexmleError


@pytest.mark.parametrize(("task_id", "config", "expected"), [
    ("isles22", "full", "nnunet"), ("seg_a", "budget", "nnunet"), ("topcow-track1-task3", "full", "nnunet"),
    ("usenhance", "full", "unet-enhance"), ("ldct-iqa", "full", "timm-regress"), ("dentex", "smoke", "detector"),
    ("isles22", "quick", "monai-seg"), ("topcow-track1-task3", "quick", "timm-cls"),
])
def test_the_default_baseline_is_the_strongest_for_the_task_and_config(task_id: str, config: str,
                                                                      expected: str) -> None:
    from rexmle_baselines.base import baselines_for, get_baseline

    if not get_baseline(expected).installed():
        pytest.skip(f"{expected} is not installed here")
    assert BaselineAgent.default_baseline(task_id, config) == expected
    assert expected in baselines_for(task_id)


@dataclass
class FakeResult:
    exit_code: int | None
    stopped_by: str | None
    wall_s: float = 1.0
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.stopped_by is None


@dataclass
class FakeContext:
    """What the agent uses of a RunContext. ``results`` are returned by successive executions; ``submits`` says
    after which executions a valid submission exists."""

    results: list[FakeResult]
    submits: list[bool]
    time_left: float = 12 * 3600.0
    gpus: int = 0
    workspace: str = "/workspace"
    executed: list[list[str]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    final: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    task: Any = field(default_factory=lambda: SimpleNamespace(task_id="isles22"))
    exec_timeout_s: float = 12 * 3600.0
    until_deadline: list[bool] = field(default_factory=list)

    @property
    def spec(self) -> Any:
        return SimpleNamespace(seed=2, limits=SimpleNamespace(exec_timeout_s=self.exec_timeout_s))

    @property
    def hardware(self) -> dict[str, Any]:
        return {"gpus": self.gpus}

    @property
    def fs(self) -> Any:
        return SimpleNamespace(ensure_dir=lambda rel: None,
                               write_bytes=lambda rel, data: self.files.__setitem__(rel, data),
                               write_text=lambda rel, text: self.files.__setitem__(rel, text.encode()))

    def remaining(self) -> Any:
        return SimpleNamespace(time_s=self.time_left)

    def finished_steps(self) -> list[dict[str, Any]]:
        return [{"step_kind": s["kind"], "status": s["status"], "result": s["result"]} for s in self.steps]

    @contextlib.contextmanager
    def step(self, kind: str, **info: Any):
        record = {"kind": kind, "info": info, "status": "error", "result": {}}
        self.steps.append(record)
        yield SimpleNamespace(result=record["result"])
        record["status"] = "ok"

    def execute(self, argv: list[str], label: str | None = None, until_deadline: bool = False) -> FakeResult:
        self.executed.append(list(argv))
        self.until_deadline.append(until_deadline)
        self.time_left -= 3600
        return self.results[len(self.executed) - 1]

    def collect_submission(self) -> Any:
        valid = bool(self.executed) and self.submits[len(self.executed) - 1]
        return SimpleNamespace(validation=SimpleNamespace(ok=valid), discard=lambda: None)

    def snapshot_submission(self, label: str, *, candidate: Any = None, metadata: Any = None) -> str:
        self.snapshots.append({"label": label, "metadata": metadata})
        return f"snap{len(self.snapshots)}"

    def select_final(self, snapshot_id: str, *, reason: str = "") -> None:
        self.final.append(snapshot_id)

    def log(self, message: str, **data: Any) -> None:
        pass


def _argument(argv: list[str], option: str) -> str:
    return argv[argv.index(option) + 1]


def test_the_command_names_the_runs_device_and_its_remaining_time() -> None:
    ctx = FakeContext(results=[FakeResult(0, None)], submits=[True])
    BaselineAgent({"baseline": "monai-seg", "config": "full"}).run(ctx)
    (argv,) = ctx.executed
    assert _argument(argv, "--device") == "cpu" and _argument(argv, "--config") == "full"
    assert _argument(argv, "--time-budget") == str(12 * 3600 - 120) and "--resume" not in argv
    assert _argument(argv, "--seed") == "2" and _argument(argv, "--public-dir") == "/workspace/data"
    gpu = FakeContext(results=[FakeResult(0, None)], submits=[True], gpus=1)
    BaselineAgent({"baseline": "monai-seg"}).run(gpu)
    assert _argument(gpu.executed[0], "--device") == "cuda"
    assert ctx.final == ["snap1"] and ctx.snapshots[0]["metadata"]["partial"] is False


def test_a_pipeline_cut_by_the_execution_limit_resumes_and_its_submission_is_kept() -> None:
    ctx = FakeContext(results=[FakeResult(None, STOPPED_TIMEOUT), FakeResult(None, STOPPED_TIMEOUT),
                               FakeResult(0, None)], submits=[True, True, True])
    BaselineAgent({"baseline": "nnunet", "config": "full"}).run(ctx)
    assert len(ctx.executed) == 3
    assert ["--resume" in argv for argv in ctx.executed] == [False, True, True]
    budgets = [int(_argument(argv, "--time-budget")) for argv in ctx.executed]
    assert budgets[0] > budgets[1] > budgets[2]  # always the run's remaining time
    assert ctx.final == ["snap1"] and ctx.snapshots[0]["metadata"]["partial"] is False
    assert [s["result"].get("submitted", False) for s in ctx.steps] == [False, False, True]
    BaselineAgent({"baseline": "nnunet", "config": "full"}).run(ctx)  # the harness resumes a finished run: no-op
    assert len(ctx.executed) == 3


def test_a_pipeline_that_cannot_resume_gets_the_whole_budget_in_one_execution() -> None:
    """The same rule as `rexmle baselines calibrate` (issue 37 item 16): the run's remaining time, not the
    per-execution limit, in one execution that only the run's deadline stops."""
    ctx = FakeContext(results=[FakeResult(0, None)], submits=[True], exec_timeout_s=4 * 3600.0)
    BaselineAgent({"baseline": "monai-seg", "config": "budget"}).run(ctx)
    assert _argument(ctx.executed[0], "--time-budget") == str(12 * 3600 - 120)
    assert ctx.until_deadline == [True]
    cut = FakeContext(results=[FakeResult(None, STOPPED_TIMEOUT)], submits=[False], exec_timeout_s=4 * 3600.0)
    with pytest.raises(RexmleError, match="timeout"):  # not restarted from nothing
        BaselineAgent({"baseline": "monai-seg", "config": "budget"}).run(cut)
    assert len(cut.executed) == 1
    nnunet = FakeContext(results=[FakeResult(0, None)], submits=[True], exec_timeout_s=4 * 3600.0)
    BaselineAgent({"baseline": "nnunet", "config": "budget"}).run(nnunet)
    assert _argument(nnunet.executed[0], "--time-budget") == str(12 * 3600 - 120)  # resumes across executions
    assert nnunet.until_deadline == [False]  # cut by the execution limit, then resumed


def test_when_the_run_ends_the_folds_already_submitted_are_the_result() -> None:
    # the run's own time runs out (no time to resume): nnU-Net's fold-0 submission is kept as a partial result
    ctx = FakeContext(results=[FakeResult(None, STOPPED_TIMEOUT)], submits=[True], time_left=3600 + 100)
    BaselineAgent({"baseline": "nnunet", "config": "full"}).run(ctx)
    assert len(ctx.executed) == 1 and ctx.final == ["snap1"]
    assert ctx.snapshots[0]["metadata"]["partial"] is True and "cut short" in ctx.snapshots[0]["label"]


def test_a_failure_without_a_submission_is_an_error_with_the_output() -> None:
    ctx = FakeContext(results=[FakeResult(1, None, stderr_tail="CUDA out of memory")], submits=[False])
    with pytest.raises(RexmleError, match="CUDA out of memory"):
        BaselineAgent({"baseline": "monai-seg"}).run(ctx)
    assert ctx.final == []


def test_cached_weights_are_copied_into_the_workspace(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    timm = pytest.importorskip("timm")
    from rexmle_baselines.weights import MANIFEST, add_local_weights

    weights = tmp_path / "r10t.pth"
    torch.save(timm.create_model("resnet10t", pretrained=False).state_dict(), weights)
    cache = tmp_path / "cache"
    entry = add_local_weights("r10t.local", weights, cache, architecture="resnet10t")
    ctx = FakeContext(results=[FakeResult(0, None)], submits=[True], task=SimpleNamespace(task_id="ldct-iqa"))
    agent = BaselineAgent({"baseline": "timm-regress", "config": "quick", "weights_dir": str(cache),
                           "set": {"pretrained": "r10t.local"}})
    agent.run(ctx)
    assert ctx.files[f"working/weights/{entry.file}"] == weights.read_bytes()
    assert json.loads(ctx.files[f"working/weights/{MANIFEST}"])[0]["sha256"] == entry.sha256
    argv = ctx.executed[0]
    assert _argument(argv, "--weights-dir") == "/workspace/working/weights"
    assert "pretrained=r10t.local" in argv
    assert ctx.steps[0]["info"]["weights"] == {"r10t.local": entry.sha256}
    shutil.rmtree(cache)
    with pytest.raises(RexmleError, match="are not in the weights cache"):
        agent.run(FakeContext(results=[FakeResult(0, None)], submits=[True],
                              task=SimpleNamespace(task_id="ldct-iqa")))


# ---------------------------------------------------------------------------------------------------------------
# `rexmle run --agent baseline` end to end: its pre-checks and its exit code (issue 37 item 6)

_WITHOUT_TORCH = """
import sys
# this interpreter has no torch: importing it fails and importlib.util.find_spec says it is not installed
for name in ("torch", "torchvision", "monai", "timm", "nnunetv2", "diffusers"):
    sys.modules[name] = None
from rexmle_grade.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def ldct_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    root = tmp_path_factory.mktemp("baseline-agent-data")
    root.chmod(0o755)  # the sandbox user reads the public data when the harness is root
    task = get_task("ldct-iqa")
    prepare_task(task, task_dirs(task, root), synthetic=True, cases=8, seed=0, force=False)
    return root


def test_a_missing_extra_is_refused_before_any_run_starts(ldct_root: Path, tmp_path: Path) -> None:
    """Without torch the baseline cannot run in the sandbox (which runs this same environment): `rexmle run`
    says so in one line with the install command and exits 2, writing no run folder."""
    import subprocess
    import sys

    runs = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, "--data-dir", str(ldct_root), "run", "--agent",
                           "baseline", "--task", "ldct-iqa", "--agent-config", "baseline=timm-regress",
                           "--runs-dir", str(runs)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    message = " ".join(proc.stderr.split())
    assert "needs torch" in message and "rexmle-baselines[timm]" in message, message
    assert not runs.exists()


def test_a_run_whose_agent_failed_makes_rexmle_run_exit_non_zero(ldct_root: Path, tmp_path: Path) -> None:
    """The baseline had no time to run (its margin exceeds the run's time): the run ends `failed`, it is still
    graded (missing) and reported, and the command exits 1 instead of 0."""
    from rexmle_agents.results.loader import load_runs
    from rexmle_grade.cli import main

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install -y bubblewrap)")
    runs = tmp_path / "runs"
    code = main(["--data-dir", str(ldct_root), "run", "--agent", "baseline", "--task", "ldct-iqa",
                 "--agent-config", "margin_s=100000", "--time-limit", "10m", "--runs-dir", str(runs)])
    assert code == 1
    (run,) = load_runs([runs / "default"]).runs
    assert run.status.state == "failed" and "no time left" in run.status.reason
