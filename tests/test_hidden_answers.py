"""No hidden answer is computable inside the sandbox (issue 31), planted from inside a real bubblewrap sandbox
through the agent path: agent code imports ``rexmle_tasks`` from the mounted Python environment and

* regenerates the synthetic task from its public files and seed (through ``prepare_task``, and through the
  generators seeded the way they were before synthetic secrets) and submits the regenerated test labels: they grade
  no better than chance;
* with ``--selection-cases K``, guesses which K of its inputs are the held-out selection cases from everything it
  sees (the split rule in the package, manifests, names, order, sample submission, sizes, times, inode numbers):
  no guess finds them better than chance, and the run's selection secret is nowhere in its reach.

The same attacks unsandboxed against a preparation made the old way succeed (``packages/rexmle-tasks/tests/
framework/test_synthetic_secret.py``, ``test_selection.py::test_no_public_trace_singles_out_the_selection_cases``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rexmle_agents.harness.agent import BaseAgent, register_agent
from rexmle_agents.harness.context import RunContext
from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.paths import RunPaths
from rexmle_agents.harness.runner import build_spec, execute_run, selection_split
from rexmle_agents.harness.spec import Limits
from rexmle_grade.evaluate import evaluate_submission
from rexmle_tasks.grading import resolve_grading_target
from rexmle_tasks.pipeline import SAMPLE_SUBMISSION, prepare_task, task_dirs
from rexmle_tasks.registry import get_task
from rexmle_tasks.selection import SELECTION_SECRET_FILE

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("CI"),
                       reason="bubblewrap is not installed (apt-get install -y bubblewrap)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox user is made by the harness running as root (CI does)"),
]

TASK = "ldct-iqa"  # scores in a CSV; the mirror adds an official test set of a third as many cases as it trains on
FORGE_CASES = 90  # 30 test cases
SELECT_CASES, SELECT_K = 60, 10  # 20 test cases + 10 carved: 30 inputs, a blind guess of 10 hits 3.3 on average
GUESSES_SCRIPT = Path(__file__).parents[1] / "packages" / "rexmle-tasks" / "tests" / "framework" / \
    "selection_guesses.py"

FORGE = '''
import json, os, shutil
from pathlib import Path
from rexmle_tasks.pipeline import build_prepared, prepare_task, task_dirs
from rexmle_tasks.registry import get_task

data, workspace = Path(os.environ["REXMLE_PUBLIC_DIR"]), Path(os.environ["REXMLE_WORKSPACE"])
cases = len(json.loads((data / "split_manifest.json").read_text())["train_ids"])  # the mirror's --cases
task = get_task("ldct-iqa")
# 1: the installed preparation, with the public seed
regenerated = task_dirs(task, workspace / "regenerated")
prepare_task(task, regenerated, synthetic=True, cases=cases, seed=0)
# 2: the generators seeded with the public seed alone, as before synthetic secrets
family, raw = task.family(), workspace / "legacy" / "raw"
(raw / "downloads").mkdir(parents=True)
family.write_synthetic_download(raw / "downloads", cases=cases, seed=0)
family.extract(raw / "downloads", raw)
public, private = workspace / "legacy" / "public", workspace / "legacy" / "private"
public.mkdir()
private.mkdir()
build_prepared(task, family, family.fixed_split(raw), public, private, raw=raw)
for folder, answers in (("submission", private), ("regenerated_submission", regenerated.private)):
    (workspace / folder).mkdir(exist_ok=True)
    shutil.copy(answers / "answers.csv", workspace / folder / "submission.csv")
print("forged from", cases, "cases")
'''


@register_agent
class ScriptAgent(BaseAgent):
    """Runs one Python script in the sandbox and submits what it left in ``submission/`` (if anything)."""

    name: ClassVar[str] = "test-issue31-script"
    description: ClassVar[str] = "test agent: one planted Python script, then its submission"
    defaults: ClassVar[dict[str, Any]] = {"script": "print('nothing')", "submit": True}

    def run(self, ctx: RunContext) -> None:
        with ctx.step("script") as step:
            result = ctx.run_python(self.config["script"], filename="attack.py")
            step.result.update(exit_code=result.exit_code, stdout=result.stdout_tail[-6000:],
                               stderr=result.stderr_tail[-2000:])
            if self.config["submit"] and result.ok:
                ctx.select_final(ctx.snapshot_submission("planted"), reason="the planted script's submission")


def _open_folder(prefix: str) -> Path:
    """A folder the unprivileged sandbox user may traverse (pytest's own are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    return folder


@pytest.fixture
def prepared() -> Iterator[Any]:
    made: list[Path] = []

    def prepare(cases: int) -> Path:
        root = _open_folder("rexmle-issue31-data-")
        made.append(root)
        prepare_task(get_task(TASK), task_dirs(get_task(TASK), root), synthetic=True, cases=cases)
        return root

    yield prepare
    for root in made:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def runs_dir() -> Iterator[Path]:
    root = _open_folder("rexmle-issue31-runs-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _step_result(run_dir: Path) -> dict[str, Any]:
    finished = [e for e in Journal(run_dir / "journal.jsonl").iter_events() if e["kind"] == "step_finished"]
    return finished[0]["result"]


def test_regenerated_synthetic_labels_grade_no_better_than_chance(prepared, runs_dir: Path) -> None:
    data_root = prepared(FORGE_CASES)
    spec = build_spec(TASK, agent=ScriptAgent.name, agent_config={"script": FORGE}, data_root=data_root,
                      limits=Limits(time_limit_s=300, exec_timeout_s=240), group="issue31")
    outcome = execute_run(spec, runs_dir)
    result = _step_result(outcome.run_dir)
    assert result["exit_code"] == 0 and "forged from 90 cases" in result["stdout"], result
    target = resolve_grading_target(TASK, data_root)
    sample = evaluate_submission(target, task_dirs(get_task(TASK), data_root).public / SAMPLE_SUBMISSION)
    regenerated = evaluate_submission(target, outcome.run_dir / "workspace" / "regenerated_submission")
    assert outcome.grade is not None
    for forged in (outcome.grade, regenerated):  # the run's own grade: the old-way regeneration it submitted
        assert forged.valid_submission, forged.problems
        for metric in ("plcc", "srocc", "krocc"):  # 30 cases: beyond 0.8 by chance: p ~ 1e-7
            assert abs(forged.metrics[metric]) < 0.8, (metric, forged.metrics)
            assert forged.metrics[metric] < sample.metrics[metric] + 0.8, (metric, forged.metrics)


def test_the_agent_cannot_tell_the_selection_cases_from_the_test_inputs(prepared, runs_dir: Path) -> None:
    data_root = prepared(SELECT_CASES)
    script = GUESSES_SCRIPT.read_text().replace('if __name__ == "__main__":', "if False:") + f'''
secret = Path(os.environ["REXMLE_WORKSPACE"]).parent / "{SELECTION_SECRET_FILE}"
print("SECRET_VISIBLE", secret.exists())
print("GUESSES", json.dumps(guesses(Path(os.environ["REXMLE_PUBLIC_DIR"]), "{TASK}", {SELECT_K})))
'''
    spec = build_spec(TASK, agent=ScriptAgent.name, agent_config={"script": script, "submit": False},
                      data_root=data_root, limits=Limits(time_limit_s=300, exec_timeout_s=240), group="issue31",
                      selection_cases=SELECT_K)
    outcome = execute_run(spec, runs_dir)
    result = _step_result(outcome.run_dir)
    assert result["exit_code"] == 0, result
    assert "SECRET_VISIBLE False" in result["stdout"]
    assert (outcome.run_dir / SELECTION_SECRET_FILE).stat().st_mode & 0o077 == 0  # the harness kept it, 0600
    guessed = json.loads(result["stdout"].split("GUESSES ", 1)[1].splitlines()[0])
    selection = selection_split(spec, RunPaths(outcome.run_dir))  # the split the run drew at its start
    truth = set(selection.selection_ids)
    n_inputs = len(selection.selection_ids) + len(selection.test_ids)
    assert (len(truth), n_inputs) == (SELECT_K, 30)
    hits = {heuristic: len(truth & set(guess)) for heuristic, guess in guessed.items()}
    assert len(hits) >= 10
    # chance: 3.3 of 10; 9 or more by chance has odds below one in a hundred thousand for each guess
    assert max(hits.values()) <= 8, hits
