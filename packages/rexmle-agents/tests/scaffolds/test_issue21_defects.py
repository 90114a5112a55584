"""Regression tests of the defects of issue 21, each through the real harness in bubblewrap with a scripted model:
the R&D loop's feedback sees the outcome it judges (1), the selection split picks by the task's metrics (2), a
node's metric direction is the task's and an off-metric node is never compared (3), a run without a valid node
submits a marked fallback, never the workspace's leftovers (4), one submission folder per node (6), and the minor
ones (7): duplicate improvements are not run again, the originals' temperature."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.runner import build_spec, execute_run
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import Message, Model, RetryPolicy, ScriptedBackend, ToolSpec

TASK = "ldct-iqa"
LIMITS = Limits(time_limit_s=120, exec_timeout_s=20)
# a valid submission with a chosen self-reported metric (the GOOD script of fakes.py prints a computed one)
REPORTED_LINE = 'print("VALIDATION_METRIC:", round(corr if corr == corr else 0.0, 6))'


def reporting(fakes: Any, value: float, marker: str = "") -> str:
    """The good script, printing ``value`` as its metric (and ``marker`` for the scripted reviewer)."""
    line = f'print("VALIDATION_METRIC: {value}")' + (f'\nprint("{marker}")' if marker else "")
    return fakes.good(1.0).replace(REPORTED_LINE, line)


def events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in Journal(run_dir / "journal.jsonl").iter_events() if e["kind"] == kind]


def final_metadata(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "final" / "metadata.json").read_text())


def recording(fakes: Any) -> type:
    """A FakeModel that keeps every prompt by kind and every generation config, and reviews like a careful model
    that reads markers the scripts print: WRONG_DIRECTION (it guesses lower-is-better), MAE (another metric),
    REVIEW_BUG (it finds a problem)."""

    class Recording(fakes.FakeModel):
        def __init__(self, drafts: Sequence[str], **kwargs: Any) -> None:
            super().__init__(drafts, **kwargs)
            self.prompts: dict[str, list[str]] = {}
            self.systems: list[str] = []
            self.configs: list[Any] = []

        def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: Any) -> Any:
            prompt = next(m.content for m in messages if m.role == "user")
            self.prompts.setdefault(self._kind(prompt), []).append(prompt)
            self.systems += [m.content for m in messages if m.role == "system"]
            self.configs.append(config)
            reply = super().__call__(messages, tools, config)
            if self._kind(prompt) == "review" and not isinstance(reply, str) and reply.tool_calls:
                output = prompt.split("## Output (tail)", 1)[1]
                args = {"lower_is_better": False, **reply.tool_calls[0].arguments}  # an extra field, ignored
                if "WRONG_DIRECTION" in output:
                    args["lower_is_better"] = True  # a field the review no longer has: the model's guess
                if "MAE" in output:
                    args.update(metric_name="mean absolute error", is_task_metric=False)
                if "REVIEW_BUG" in output:
                    args["is_bug"] = True
                call = reply.tool_calls[0].model_copy(update={"arguments": args})
                reply = reply.model_copy(update={"tool_calls": (call,)})
            return reply

    return Recording


def run(data_root: Path, tmp_path: Path, agent: str, fake: Any, *, config: dict[str, Any],
        limits: Limits = LIMITS, selection_cases: int = 0) -> Any:
    spec = build_spec(TASK, agent=agent, agent_config=config, models={"code": "scripted/model"}, seed=0,
                      limits=limits, sandbox="bwrap", data_root=data_root, group="issue21",
                      selection_cases=selection_cases)
    model = Model(ScriptedBackend(fake), retry=RetryPolicy(max_attempts=1))
    return execute_run(spec, tmp_path / "runs", models={"code": model}, grace_s=5.0)


def tree_of(run_dir: Path) -> Any:
    from rexmle_agents.scaffolds.engine import STATE_KEY
    from rexmle_agents.scaffolds.tree import Tree

    return Tree.from_journal(events(run_dir, "agent_state"), STATE_KEY)


# ---- 1: the R&D loop's feedback sees the outcome of the round it judges ----------------------------------------


def test_the_rdloop_feedback_prompt_carries_the_executed_outcome(data_root: Path, tmp_path: Path, fakes) -> None:
    fake = recording(fakes)([reporting(fakes, 0.4321)])
    outcome = run(data_root, tmp_path, "rdloop", fake, config={"max_nodes": 1})
    assert outcome.state == "finished", outcome.reason
    (prompt,) = fake.prompts["feedback"]
    outcome_section = prompt.split("## Outcome", 1)[1].split("##", 1)[0]
    assert "not run yet" not in outcome_section
    assert "validation metric score 0.4321" in outcome_section and "full run: exit status 0" in prompt
    assert "VALIDATION_METRIC: 0.4321" in prompt  # the run's own output is evidence too


# ---- 2: the selection split chooses by the task's metric on the held-out cases -----------------------------------

# predictions that follow the case number (a weak, non-constant signal) vs one constant (every correlation
# undefined: the grader scores it 0); both rank below every human row of the LDCT-IQA board
BY_CASE_NUMBER = '''
import csv, os
out = os.environ["SUBMISSION_DIR"]
ids = [r["image_id"] for r in csv.DictReader(open("../data/sample_submission/submission.csv"))]
with open(os.path.join(out, "submission.csv"), "w") as fh:
    fh.write("image_id,quality_score\\n")
    for i in ids:
        fh.write(f"{i},{CONSTANT_OR_NUMBER}\\n")
print("VALIDATION_METRIC: REPORTED")
'''


def submission_script(prediction: str, reported: float) -> str:
    return BY_CASE_NUMBER.replace("CONSTANT_OR_NUMBER", prediction).replace("REPORTED", str(reported))


def test_the_selection_split_picks_by_the_tasks_metric_not_by_the_leaderboard_position(data_root: Path,
                                                                                      tmp_path: Path, fakes) -> None:
    weak = submission_script("int(i) % 5 * 0.7", 0.2)  # honest: a weak predictor
    constant = submission_script("2.0", 0.99)  # claims 0.99: the agent's own choice
    fake = recording(fakes)([weak, constant])
    outcome = run(data_root, tmp_path, "aide", fake, config={"num_drafts": 2, "max_nodes": 2}, selection_cases=6)
    assert outcome.state == "finished", outcome.reason
    snapshots = {e["metadata"]["node"]: e for e in events(outcome.run_dir, "snapshot")}
    held_out = {node: e["selection"]["metrics"]["score"] for node, e in snapshots.items()}
    positions = {node: e["selection"]["score"] for node, e in snapshots.items()}
    assert held_out[0] > held_out[1] == 0.0 and positions[0] == positions[1] == 7.0  # a tie on position alone
    final = final_metadata(outcome.run_dir)
    assert final["agent_choice"] == snapshots[1]["snapshot"]  # the agent believed its own 0.99
    assert final["snapshot"] == snapshots[0]["snapshot"] and "selection cases" in final["chosen_by"]
    assert snapshots[0]["selection"]["ranked"] == {"score": "higher_better"}


# ---- 3: the metric's direction is the task's; another metric is flagged, never compared --------------------------


def test_metric_direction_comes_from_the_task_and_an_off_metric_node_is_not_compared(data_root: Path,
                                                                                    tmp_path: Path, fakes) -> None:
    drafts = [reporting(fakes, 0.30), reporting(fakes, 0.35, "WRONG_DIRECTION"), reporting(fakes, 0.05, "MAE")]
    fake = recording(fakes)(drafts)
    outcome = run(data_root, tmp_path, "aide", fake, config={"num_drafts": 3, "max_nodes": 3})
    assert outcome.state == "finished", outcome.reason
    tree = tree_of(outcome.run_dir)
    assert [n.lower_is_better for n in tree] == [False, False, False]  # the task's, whatever the model guessed
    assert tree.best() is tree[1]  # 0.35 > 0.30 in the task's direction
    off = tree[2]
    assert off.is_buggy and not off.is_valid and off.metric_name == "mean absolute error"
    assert "not the task's validation metric `score`" in off.bug_reason
    assert off.snapshot_id is None and off.fallback_snapshot is not None  # kept only as a fallback
    assert final_metadata(outcome.run_dir)["snapshot"] == tree[1].snapshot_id
    assert "score" in fake.prompts["review"][0] and "is_task_metric" in fake.prompts["review"][0]


# ---- 4: without a valid node, a marked fallback is submitted -----------------------------------------------------

# writes a half submission into the workspace's own folder (a hard-coded path), then crashes
LEFTOVER_THEN_CRASH = '''
import os
os.makedirs("/workspace/submission", exist_ok=True)
open("/workspace/submission/submission.csv", "w").write("image_id,quality_score\\n0010,1.0\\n")
raise RuntimeError("crashed after writing part of a submission")
'''


def test_without_a_valid_node_the_sample_shaped_fallback_is_submitted_not_the_leftovers(data_root: Path,
                                                                                       tmp_path: Path, fakes) -> None:
    fake = recording(fakes)([LEFTOVER_THEN_CRASH])
    outcome = run(data_root, tmp_path, "aide", fake, config={"num_drafts": 2, "max_nodes": 2})
    assert outcome.state == "finished", outcome.reason
    final = final_metadata(outcome.run_dir)
    assert final["label"] == "sample-shaped fallback" and "sample submission" in final["metadata"]["fallback"]
    (selected,) = events(outcome.run_dir, "final_selected")
    assert selected["reason"].startswith("FALLBACK") and selected["snapshot"] == final["snapshot"]
    assert outcome.grade is not None and outcome.grade.valid_submission  # the sample is valid; the leftover is not
    assert not (outcome.run_dir / "workspace" / "submission" / "submission.csv").exists()


def test_without_a_valid_node_the_latest_validated_submission_is_the_marked_fallback(data_root: Path,
                                                                                   tmp_path: Path, fakes) -> None:
    fake = recording(fakes)([reporting(fakes, 0.5, "REVIEW_BUG")])
    outcome = run(data_root, tmp_path, "aide", fake, config={"num_drafts": 2, "max_nodes": 2})
    tree = tree_of(outcome.run_dir)
    assert not tree.good and tree[1].fallback_snapshot is not None
    final = final_metadata(outcome.run_dir)
    assert final["snapshot"] == tree[1].fallback_snapshot and final["metadata"]["fallback"].startswith("validated")
    assert final["label"].startswith("node1 (fallback:")
    (selected,) = events(outcome.run_dir, "final_selected")
    assert selected["reason"].startswith("FALLBACK: no valid node; node 1's submission validated")


# ---- 6: one submission folder per node ----------------------------------------------------------------------------

def test_one_submission_folder_per_worker_named_once_and_a_hard_coded_path_is_reported(data_root: Path,
                                                                                     tmp_path: Path, fakes) -> None:
    hard_coded = fakes.good(1.0).replace('Path(os.environ["SUBMISSION_DIR"])', 'Path("/workspace/submission")')
    fake = recording(fakes)([hard_coded, fakes.good(1.0)])
    outcome = run(data_root, tmp_path, "mcts", fake, config={"workers": 2, "num_drafts": 2, "max_nodes": 3})
    assert outcome.state == "finished", outcome.reason
    assert all("/workspace/submission" not in text for text in fake.systems)
    draft_prompt = fake.prompts["draft"][0]
    assert "/workspace/submission" not in draft_prompt and "SUBMISSION_DIR" in draft_prompt
    tree = tree_of(outcome.run_dir)
    wrong = next(n for n in tree if "/workspace/submission" in n.code)
    assert wrong.is_buggy and "appeared in /workspace/submission instead" in wrong.bug_reason
    argv = [e["argv"] for e in events(outcome.run_dir, "exec_started")]
    folders = {a[1] for a in argv if a[0] == "env"}
    assert folders == {"SUBMISSION_DIR=/workspace/working/workers/0/submission",
                       "SUBMISSION_DIR=/workspace/working/workers/1/submission"}


# ---- 7: duplicates are not run again; the originals' temperature ------------------------------------------------


def test_an_improvement_that_returns_its_parents_script_is_not_run_again(data_root: Path, tmp_path: Path,
                                                                        fakes) -> None:
    class Lazy(recording(fakes)):  # type: ignore[misc]
        def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: Any) -> Any:
            prompt = next(m.content for m in messages if m.role == "user")
            if self._kind(prompt) == "improve":
                super().__call__(messages, tools, config)
                return fakes.answer("Keep it as it is.", fakes.good(1.0))
            return super().__call__(messages, tools, config)

    fake = Lazy([fakes.good(1.0)])
    outcome = run(data_root, tmp_path, "aide", fake, config={"num_drafts": 1, "debug_prob": 0.0, "max_nodes": 3})
    tree = tree_of(outcome.run_dir)
    assert [n.duplicate_of for n in tree] == [None, 0, 0]
    assert all(n.is_buggy and "identical to node 0" in n.bug_reason for n in list(tree)[1:])
    runs = [e["name"] for e in events(outcome.run_dir, "exec_started")]
    assert len(runs) == 1 and runs[0].endswith("node0")
    assert {c.temperature for c in fake.configs} == {0.5}  # the originals' sampling temperature


@pytest.mark.parametrize("agent", ["aide", "mcts", "rdloop", "evo"])
def test_every_preset_samples_at_the_originals_temperature(agent: str) -> None:
    from rexmle_agents.harness.agent import make_agent

    assert make_agent(agent, {}).config["temperature"] == 0.5
