"""The originals' mechanisms added by issue 21 and the AIRA-style ones beyond them: AIDE's data preview (each file
format), ML-Master's adaptive memory, branch termination and debug reward, R&D-Agent's review rounds and feedback
that decides the best, the merge operator, memory summaries, the evolutionary policy, multi-turn nodes."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import Message, Model, ModelResponse, RetryPolicy, ScriptedBackend, ToolCall, ToolSpec
from rexmle_agents.scaffolds.engine import Settings, TaskMetric, Workbench
from rexmle_agents.scaffolds.node import ExecSummary, Node, NodeStatus
from rexmle_agents.scaffolds.operators import Merge
from rexmle_agents.scaffolds.operators.code import NO_TURNS_LEFT, Draft, thinking_of
from rexmle_agents.scaffolds.operators.research import GiveFeedback, knowledge_text
from rexmle_agents.scaffolds.policies import Evolutionary, Mcts, RdLoop
from rexmle_agents.scaffolds.preview import data_preview, preview_file
from rexmle_agents.scaffolds.prompting import adaptive_memory_text
from rexmle_agents.scaffolds.tree import Tree

# ---- helpers -----------------------------------------------------------------------------------------------------


class FakeBench:
    """What operators use of the workbench, around a scripted model (as in test_operators.py)."""

    system_prompt = "system"
    task_metric = TaskMetric("score", lower_is_better=False, description="a correlation")
    choose_best = None  # the metric decides the best (rdloop's feedback_decides_best sets it)

    def __init__(self, script: Sequence[Any], *, explore_turns: int = 0) -> None:
        self.backend = ScriptedBackend(list(script))
        self.model = Model(self.backend, retry=RetryPolicy(max_attempts=1))
        self.tree = Tree()
        self.settings = Settings(explore_turns=explore_turns)
        self.commands: list[str] = []

    def generate(self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> ModelResponse:
        return self.model.generate(list(messages), list(tools))

    def memory(self, node: Node) -> str:
        return "None yet."

    def script_rules(self) -> str:
        return "rules"

    def data_preview(self) -> str:
        return "the data"

    def describe(self, run: ExecSummary) -> str:
        return run.describe(timed=False)

    def best(self) -> Node | None:
        return self.tree.best()

    def best_before(self, node: Node) -> str:
        return "No working solution yet."

    def explore(self, node: Node, command: str) -> str:
        node.turns += 1
        self.commands.append(command)
        return f"exit status 0\noutput of {command}"


def done(tree: Tree, stage: str, parent: int | None = None, *, metric: float | None = None, **values: Any) -> Node:
    node = tree.new_node(stage, parent, **values)
    node.status, node.code, node.plan = NodeStatus.DONE.value, f"print({node.id})\n", f"plan {node.id}"
    if metric is not None:
        node.is_buggy, node.metric, node.lower_is_better, node.submission_valid = False, metric, False, True
        node.snapshot_id = f"snap{node.id}"
    else:
        node.bug_reason = "it crashed"
    return node


def tool_call(name: str, call_id: str = "c1", **arguments: Any) -> ModelResponse:
    return ModelResponse(tool_calls=(ToolCall(id=call_id, name=name, arguments=arguments),))


# ---- AIDE's data preview, one test per file format ---------------------------------------------------------------


def test_the_preview_shows_a_csv_files_columns_types_row_count_and_first_rows(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_text("image_id,quality_score,site\n0001,3.2,A\n0002,1.4,B\n0003,2.0,A\n0004,0.6,A\n")
    text = preview_file(path)
    assert "4 row(s)" in text and "image_id (identifier text like '0001')" in text
    assert "quality_score (float 0.6..3.2)" in text and "site (text, 2 distinct: A, B)" in text
    assert "0001, 3.2, A; 0002, 1.4, B; 0003, 2.0, A" in text and "0004" not in text.split("First rows")[1]


def test_the_preview_shows_a_json_files_structure(tmp_path: Path) -> None:
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"images": [{"id": 1, "file": "a.png"}], "categories": ["tooth"]}))
    assert preview_file(path) == ("JSON {images: list of 1 x {id: int, file: string} (2 keys), categories: list of 1 "
                                  "x string} (2 keys)")


@pytest.mark.parametrize("suffix", [".nii.gz", ".mha"])
def test_the_preview_shows_a_volumes_shape_spacing_dtype_and_range(tmp_path: Path, suffix: str) -> None:
    from rexmle_grade.io import Geometry, write_volume

    array = np.zeros((4, 5, 6), dtype=np.int16)
    array[1, 2, 3] = 700
    path = tmp_path / f"case{suffix}"
    write_volume(path, array, Geometry(size=(6, 5, 4), spacing=(0.8, 0.8, 3.0), origin=(0.0, 0.0, 0.0),
                                       direction=(1, 0, 0, 0, 1, 0, 0, 0, 1)))
    text = preview_file(path)
    assert text.startswith("3-D image, array shape (z, y, x) [4, 5, 6], spacing (x, y, z) 0.8x0.8x3 mm")
    assert "dtype int16, values 0..700" in text and "distinct values [0, 700]" in text


@pytest.mark.parametrize("suffix", [".png", ".tif"])
def test_the_preview_shows_a_2d_images_shape_dtype_and_range(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"image{suffix}"
    if suffix == ".png":
        from PIL import Image

        Image.fromarray(np.arange(12, dtype=np.uint8).reshape(3, 4) * 20).save(path)
        assert preview_file(path) == "2-D image, array shape [3, 4], dtype uint8, values 0..220, mean 110"
    else:
        import tifffile

        tifffile.imwrite(path, np.linspace(0, 1, 20, dtype=np.float32).reshape(4, 5))
        assert preview_file(path) == "2-D image, array shape [4, 5], dtype float32, values 0..1, mean 0.5"


def test_the_preview_lists_the_tree_with_sizes_and_opens_one_file_per_kind_and_folder(tmp_path: Path) -> None:
    images = tmp_path / "train" / "images"
    images.mkdir(parents=True)
    for i in range(6):
        (images / f"{i:04d}.txt").write_text("x" * 2048)
    (tmp_path / "train" / "labels.csv").write_text("id,y\na,1\n")
    (tmp_path / "train" / "more.csv").write_text("id,y\nb,2\n")
    text = data_preview(tmp_path)
    assert "- train/images/ 6 file(s), 12.0 KB" in text and "0000.txt (2.0 KB)" in text and "... and 2 more" in text
    assert text.count("CSV, 1 row(s)") == 1  # one CSV opened in train/
    assert len(data_preview(tmp_path, max_chars=120)) <= 120
    assert data_preview(tmp_path / "missing") == ""


def test_the_draft_and_debug_prompts_carry_the_preview() -> None:
    bench = FakeBench(["Plan.\n```python\nprint(1)\n```"])
    node = bench.tree.new_node("draft")
    assert Draft()(bench, node)
    assert "the data" in bench.backend.requests[0][0][1].content


# ---- ML-Master: adaptive memory, branch termination, debug reward -----------------------------------------------


def test_adaptive_memory_shows_the_branch_the_parents_reasoning_and_the_siblings_only() -> None:
    tree = Tree()
    root = done(tree, "draft", metric=0.4)
    root.thinking = "the noise feature is what matters"
    done(tree, "draft", metric=0.9)  # another branch: not shown
    tried = done(tree, "improve", root.id, metric=0.3)
    new = tree.new_node("improve", root.id)
    text = adaptive_memory_text(tree, new, limit=8)
    assert "node 0 (draft)" in text and "the noise feature is what matters" in text
    assert f"node {tried.id} (improve, child of node 0)" in text and "node 1 " not in text


def test_thinking_is_taken_from_think_blocks_and_left_out_of_the_plan() -> None:
    response = ModelResponse(text="<think>try ridge first</think>Plan: ridge.\n```python\nprint(1)\n```")
    assert thinking_of(response) == "try ridge first"
    bench = FakeBench([response])
    node = bench.tree.new_node("draft")
    assert Draft()(bench, node) and node.thinking == "try ridge first" and node.plan == "Plan: ridge."


def mcts(**params: Any) -> Mcts:
    return Mcts({**Mcts.defaults, **params}, seed=0)


def test_a_branch_whose_last_improvements_all_failed_to_beat_it_is_terminated() -> None:
    policy = mcts(num_drafts=1, max_improve_children=5, stagnation_limit=2)
    tree = Tree()
    draft = done(tree, "draft", metric=0.5)
    done(tree, "improve", draft.id, metric=0.6)  # a gain
    assert policy.action(draft, tree) == ("improve", 5)
    done(tree, "improve", draft.id, metric=0.4)
    assert not policy.stagnant(tree, draft)  # one failure after a gain
    done(tree, "improve", draft.id)  # buggy
    assert policy.stagnant(tree, draft) and policy.action(draft, tree) == (None, 0)
    assert policy.action(draft) == ("improve", 5)  # without the tree, the per-action cap only
    assert not mcts(stagnation_limit=0).stagnant(tree, draft)


def test_selection_leaves_a_stagnant_branch_for_an_open_one() -> None:
    policy = mcts(num_drafts=1, max_improve_children=5, stagnation_limit=2, c_start=0.0, c_end=0.0)
    tree = Tree()
    draft = done(tree, "draft", metric=0.5)
    gain = done(tree, "improve", draft.id, metric=0.7)
    for node in (draft, gain):
        node.visits, node.value_sum = 1, 2.0
    for metric in (0.3, 0.2):
        worse = done(tree, "improve", draft.id, metric=metric)
        worse.visits, worse.value_sum = 1, 1.0
    assert policy.stagnant(tree, draft) and policy.select(tree) == ("improve", gain.id)


def test_a_debug_that_fixes_its_parent_earns_the_debug_reward() -> None:
    policy = mcts(reward_valid=1.0, reward_improved=1.0, reward_debug_fixed=0.5)
    tree = Tree()
    first = done(tree, "draft", metric=0.9)
    policy.backup(tree, first)
    buggy = done(tree, "draft")
    policy.backup(tree, buggy)
    fixed = done(tree, "debug", buggy.id, metric=0.1)
    policy.backup(tree, fixed)
    assert (first.reward, buggy.reward, fixed.reward) == (2.0, -1.0, 1.5)
    assert buggy.value_sum == -1.0 + 1.5


# ---- R&D-Agent: the feedback sees the outcome and decides the best; review rounds ---------------------------------


def test_the_feedback_prompt_carries_the_executed_outcome_before_the_node_is_done() -> None:
    bench = FakeBench([tool_call("submit_feedback", supported=True, observations="ok", lesson="noise matters",
                                 replace_best=True)])
    node = bench.tree.new_node("draft", hypothesis="noise predicts quality")
    node.is_buggy, node.metric, node.lower_is_better, node.submission_valid = False, 0.73, False, True
    node.metric_name, node.analysis = "score", "fits well"
    node.execution = ExecSummary(exit_code=0, stopped_by=None, output_tail="VALIDATION_METRIC: 0.73", seconds=2.0)
    feedback = GiveFeedback()(bench, node)
    assert feedback is not None and feedback.replace_best
    prompt = bench.backend.requests[0][0][1].content
    assert "node 0 (draft): validation metric score 0.73 (higher is better)" in prompt
    assert "full run: exit status 0" in prompt and "VALIDATION_METRIC: 0.73" in prompt and "fits well" in prompt
    assert "not run yet" not in prompt


def test_the_knowledge_log_shows_the_metric_each_round_reached() -> None:
    bench = FakeBench([])
    bench.tree.knowledge = [{"node": 0, "hypothesis": "H0", "outcome": "worked", "metric": 0.73, "lesson": "L0"},
                            {"node": 1, "hypothesis": "H1", "outcome": "failed", "metric": None, "lesson": "L1"}]
    assert knowledge_text(bench) == "- [worked, validation metric 0.73] H0 -> L0\n- [failed] H1 -> L1"


def test_the_feedback_decides_the_best_with_the_metric_as_fallback_before_any_decision() -> None:
    tree = Tree()
    first = done(tree, "draft", metric=0.5)
    second = done(tree, "improve", first.id, metric=0.6)
    assert RdLoop.accepted_best(tree) is second  # no decision yet: the metric
    first.accepted, second.accepted = True, False
    assert RdLoop.accepted_best(tree) is first  # the feedback kept the simpler one although 0.6 > 0.5


def test_an_rdloop_round_is_reviewed_and_revised_before_its_full_run(run_scaffold, fakes) -> None:
    fake = fakes.FakeModel([fakes.CRASH_SCRIPT])
    outcome, fake = run_scaffold("rdloop", fake, config={"max_nodes": 1},
                                 limits=Limits(time_limit_s=120, exec_timeout_s=20))
    assert outcome.state == "finished", outcome.reason
    events = list(Journal(outcome.run_dir / "journal.jsonl").iter_events())
    state = [e for e in events if e["kind"] == "agent_state"][-1]["state"]
    (node,) = state["nodes"]
    assert node["stage"] == "draft" and not node["is_buggy"] and node["accepted"] is True
    assert len(node["revisions"]) == 1 and "the run on a data sample failed" in node["revisions"][0]
    names = [e["name"] for e in events if e["kind"] == "exec_started"]
    assert [n.split("-", 2)[2] for n in names] == ["node0-sample", "node0-sample", "node0"]
    assert fake.counts["critique"] == 2 and fake.counts["feedback"] == 1
    (selected,) = [e for e in events if e["kind"] == "final_selected"]
    assert "node 0: chosen by the feedback" in selected["reason"]  # it accepted the round: its choice, named so


# ---- AIRA: merge, memory summaries, the evolutionary policy -------------------------------------------------------


def test_the_merge_prompt_carries_both_parents_code_and_metrics() -> None:
    bench = FakeBench(["Merged.\n```python\nprint('ab')\n```"])
    a = done(bench.tree, "draft", metric=0.61)
    b = done(bench.tree, "draft", metric=0.58)
    a.code, b.code = "print('model A')\n", "print('features B')\n"
    node = bench.tree.new_node("merge", a.id, merged_with=b.id)
    assert Merge()(bench, node) and node.code == "print('ab')\n"
    prompt = bench.backend.requests[0][0][1].content
    assert prompt.startswith("# Your job: merge two working solutions")
    assert "## Solution A (scored 0.61 (higher is better))" in prompt and "print('model A')" in prompt
    assert "## Solution B (scored 0.58 (higher is better))" in prompt and "print('features B')" in prompt
    assert node.summary() == "node 2 (merge, child of nodes 0 and 1): not run yet"


def test_memory_summaries_are_made_once_per_new_finished_node() -> None:
    calls: list[int] = []

    def summarise(bench: Workbench, node: Node) -> str:
        calls.append(len(bench.tree.done))
        return f"digest of {len(bench.tree.done)}"

    ctx = SimpleNamespace(instructions="rules")
    bench = Workbench(ctx, Settings(memory_summary=True), {"summarise_memory": summarise}, Tree())  # type: ignore[arg-type]
    first = done(bench.tree, "draft", metric=0.5)
    new = bench.tree.new_node("improve", first.id)
    assert bench.memory(new).startswith("digest of 1\n\nThe node this one starts from:\nnode 0 (draft)")
    bench.memory(new)
    done(bench.tree, "draft", metric=0.4)
    assert bench.memory(new).startswith("digest of 2") and calls == [1, 2]


def evolution(**params: Any) -> Evolutionary:
    return Evolutionary({**Evolutionary.defaults, **params}, seed=0)


def test_evolution_seeds_a_population_then_selects_by_tournament() -> None:
    policy = evolution(population_size=3, tournament_size=2, crossover_prob=0.0, debug_prob=0.0)
    tree = Tree()
    assert policy.choose(tree) == ("draft", None, None)
    for metric in (0.2, None, 0.9):
        done(tree, "draft", metric=metric)
    done(tree, "improve", 0, metric=0.5)
    assert [n.id for n in policy.population(tree)] == [2, 3, 0]  # the fittest valid nodes, best first
    stage, parent, _ = policy.choose(tree)
    assert stage == "improve" and parent in {2, 3}  # mutation of a tournament winner
    members = policy.population(tree)
    picks = [policy.tournament(members, random.Random(i)).id for i in range(40)]
    assert set(picks) == {2, 3} and picks.count(2) > picks.count(3)  # the weakest can never win a 2-tournament
    assert policy.tournament(members, random.Random(0), exclude=members[0]).id != 2


def test_evolution_crosses_over_two_distinct_parents_and_debugs_when_asked() -> None:
    tree = Tree()
    for metric in (0.2, 0.9, 0.5):
        done(tree, "draft", metric=metric)
    stage, first, second = evolution(population_size=3, crossover_prob=1.0, debug_prob=0.0).choose(tree)
    assert stage == "merge" and first != second and {first, second} <= {0, 1, 2}
    buggy = done(tree, "improve", 1)
    assert evolution(population_size=3, debug_prob=1.0).choose(tree) == ("debug", buggy.id, None)
    again = evolution(population_size=3, crossover_prob=0.5, debug_prob=0.0)
    assert again.choose(tree) == again.choose(tree)  # seeded by the run seed and the tree size


def test_the_evo_preset_runs_end_to_end_with_merges(run_scaffold, fakes) -> None:
    fake = fakes.FakeModel([fakes.good(1.0), fakes.good(2.0)])
    outcome, fake = run_scaffold("evo", fake, config={"population_size": 2, "crossover_prob": 1.0, "debug_prob": 0.0,
                                                      "max_nodes": 3},
                                 limits=Limits(time_limit_s=120, exec_timeout_s=20))
    assert outcome.state == "finished", outcome.reason
    nodes = Tree.from_journal(Journal(outcome.run_dir / "journal.jsonl").iter_events()).to_state()["nodes"]
    assert [(n["stage"], n["parent"], n["merged_with"]) for n in nodes][2][0] == "merge"
    assert {nodes[2]["parent"], nodes[2]["merged_with"]} == {0, 1}
    log = next(e for e in Journal(outcome.run_dir / "journal.jsonl").iter_events() if e["kind"] == "log")
    assert log["config"]["policy"] == "evolutionary" and log["config"]["operators"]["merge"] == "merge"


def test_any_preset_runs_under_any_agent_name_and_every_slot_is_recorded() -> None:
    from rexmle_agents.harness.agent import make_agent
    from rexmle_grade.errors import UnknownNameError

    config = make_agent("aide", {"preset": "evo"}).config
    assert config["policy"] == "evolutionary" and config["preset"] == "evo"
    assert config["operators"]["summarise_memory"] == "summarise_memory"
    assert make_agent("rdloop", {}).config["operators"]["critique"] == "critique"
    with pytest.raises(UnknownNameError):
        make_agent("aide", {"preset": "evolution"})


# ---- multi-turn nodes -------------------------------------------------------------------------------------------


def test_a_multi_turn_node_runs_commands_before_it_commits_its_script() -> None:
    script = "Plan.\n```python\nprint(1)\n```"
    bench = FakeBench([tool_call("run_command", "a", command="ls ../data"),
                       tool_call("run_command", "b", command="head ../data/train/labels.csv"), script],
                      explore_turns=3)
    node = bench.tree.new_node("draft")
    assert Draft()(bench, node) and node.code == "print(1)\n" and node.turns == 2
    assert bench.commands == ["ls ../data", "head ../data/train/labels.csv"]
    last = bench.backend.requests[-1][0]
    assert [m.role for m in last] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert "output of ls ../data" in last[3].content and bench.backend.requests[-1][1][0].name == "run_command"


def test_a_multi_turn_node_out_of_commands_is_asked_for_its_script() -> None:
    bench = FakeBench([tool_call("run_command", "a", command="ls"), "Plan.\n```python\nprint(2)\n```"],
                      explore_turns=1)
    node = bench.tree.new_node("draft")
    assert Draft()(bench, node) and node.code == "print(2)\n"
    messages, tools = bench.backend.requests[-1][0], bench.backend.requests[-1][1]
    assert messages[-1].content == NO_TURNS_LEFT and not tools


def test_multi_turn_commands_run_in_the_sandbox_and_are_journaled(run_scaffold, fakes) -> None:
    class Exploring(fakes.FakeModel):
        def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: object) -> Any:
            if tools and tools[0].name == "run_command" and messages[-1].role == "user":
                return tool_call("run_command", "t1", command="ls ../data/train && head -2 ../data/train/labels.csv")
            if messages[-1].role == "tool":
                self.seen = messages[-1].content
                return fakes.answer("Now I know the columns.", fakes.good(1.0))
            return super().__call__(messages, tools, config)

    fake = Exploring([fakes.good(1.0)])
    outcome, fake = run_scaffold("aide", fake, config={"num_drafts": 1, "max_nodes": 1, "explore_turns": 2},
                                 limits=Limits(time_limit_s=120, exec_timeout_s=20))
    assert outcome.state == "finished", outcome.reason
    assert "labels.csv" in fake.seen and "image_id,quality_score" in fake.seen
    events = list(Journal(outcome.run_dir / "journal.jsonl").iter_events())
    names = [e["name"] for e in events if e["kind"] == "exec_finished"]
    assert names[0].endswith("node0-turn1") and names[1].endswith("node0")
    state = [e for e in events if e["kind"] == "agent_state"][-1]["state"]
    assert state["nodes"][0]["turns"] == 1 and not state["nodes"][0]["is_buggy"]


# ---- R&D-Agent's round, at the policy level ------------------------------------------------------------------------


class RoundBench:
    """What RdLoop.develop/code use of the workbench: operators that answer as told, a sample run, an evaluation."""

    def __init__(self, *, works: bool = True, replace_best: bool = True, reviews: Sequence[Any] = (),
                 sample_ok: bool = True) -> None:
        self.tree = Tree()
        self.works, self.sample_ok, self.reviews, self.revised = works, sample_ok, list(reviews), 0
        feedback = SimpleNamespace(replace_best=replace_best, observations="seen", lesson="learnt")
        self.operators = {"hypothesise": lambda bench, node: True, "draft": lambda bench, node: True,
                          "improve": lambda bench, node: True, "debug": lambda bench, node: True,
                          "feedback": lambda bench, node: feedback,
                          "critique": lambda bench, node: self.reviews.pop(0), "revise": self.revise}
        self.ctx = SimpleNamespace(spec=SimpleNamespace(limits=SimpleNamespace(exec_timeout_s=60.0)))

    revise_ok = True

    def revise(self, bench: Any, node: Node) -> bool:
        self.revised += 1
        return self.revise_ok

    def run_script(self, node: Node, *, sample: bool, timeout_s: float) -> ExecSummary:
        return ExecSummary(exit_code=0 if self.sample_ok else 1, stopped_by=None, output_tail="", seconds=0.1)

    def evaluate(self, node: Node) -> None:
        node.is_buggy = not self.works
        node.metric, node.lower_is_better, node.submission_valid = (0.7, False, True) if self.works else (None, False,
                                                                                                          False)

    def describe(self, run: ExecSummary) -> str:
        return run.describe(timed=False)


def rdloop(**params: Any) -> RdLoop:
    return RdLoop({**RdLoop.defaults, **params}, seed=0)


@pytest.mark.parametrize(("works", "replace_best", "accepted"),
                         [(True, True, True), (True, False, False), (False, True, False)])
def test_the_feedback_accepts_a_round_only_when_it_works_and_the_feedback_says_replace(works: bool,
                                                                                       replace_best: bool,
                                                                                       accepted: bool) -> None:
    bench = RoundBench(works=works, replace_best=replace_best)
    node = bench.tree.new_node("draft", hypothesis="H")
    rdloop(feedback_decides_best=True, sample_first=False).develop(bench, node)  # type: ignore[arg-type]
    assert node.accepted is accepted and node.lesson == "learnt"
    plain = RoundBench(works=works, replace_best=replace_best)
    other = plain.tree.new_node("draft", hypothesis="H")
    rdloop(sample_first=False).develop(plain, other)  # type: ignore[arg-type]
    assert other.accepted is None  # without the mechanism the metric decides: nothing is accepted or refused


def test_a_review_that_asks_for_changes_revises_the_script_although_the_sample_run_passed() -> None:
    bench = RoundBench(reviews=[SimpleNamespace(ready=False, feedback="normalise the intensities"),
                                SimpleNamespace(ready=True, feedback="")])
    node = bench.tree.new_node("draft", hypothesis="H")
    assert rdloop(coding_rounds=3).code(bench, node)  # type: ignore[arg-type]
    assert node.revisions == ["normalise the intensities"] and bench.revised == 1
    ready = RoundBench(reviews=[SimpleNamespace(ready=True, feedback="")])
    first_time = ready.tree.new_node("draft", hypothesis="H")
    assert rdloop(coding_rounds=3).code(ready, first_time)  # type: ignore[arg-type]
    assert first_time.revisions == [] and ready.revised == 0


def test_the_next_round_improves_the_round_the_feedback_accepted_when_it_decides() -> None:
    tree = Tree()
    first = done(tree, "draft", metric=0.5, hypothesis="simple")
    second = done(tree, "improve", first.id, metric=0.6, hypothesis="complex")
    first.accepted, second.accepted = True, False
    bench = SimpleNamespace(tree=tree)
    assert rdloop(feedback_decides_best=True).next_round(bench) == ("improve", first.id, "")  # type: ignore[arg-type]
    assert rdloop().next_round(bench) == ("improve", second.id, "")  # type: ignore[arg-type]


def test_stagnation_needs_exactly_the_limit_of_failed_improvements_and_a_limit_of_0_turns_it_off() -> None:
    tree = Tree()
    draft = done(tree, "draft", metric=0.5)
    done(tree, "improve", draft.id, metric=0.4)
    assert not mcts(stagnation_limit=2).stagnant(tree, draft)  # one failure of two
    done(tree, "improve", draft.id)  # buggy
    assert mcts(stagnation_limit=2).stagnant(tree, draft)  # exactly two failed improvements
    assert not mcts(stagnation_limit=0).stagnant(tree, draft)  # 0: never terminated
    assert not mcts(stagnation_limit=-1).stagnant(tree, draft)


def test_the_revision_says_why_the_script_was_sent_back() -> None:
    silent = RoundBench(reviews=[SimpleNamespace(ready=False, feedback=""), SimpleNamespace(ready=True, feedback="")])
    node = silent.tree.new_node("draft", hypothesis="H")
    assert rdloop(coding_rounds=2).code(silent, node)  # type: ignore[arg-type]
    assert node.revisions == ["the reviewer asked for changes"]
    unreviewed = RoundBench(reviews=[None, None], sample_ok=False)
    failing = unreviewed.tree.new_node("draft", hypothesis="H")
    assert not rdloop(coding_rounds=2).code(unreviewed, failing)  # type: ignore[arg-type]
    assert len(failing.revisions) == 1 and failing.revisions[0].startswith("the run on a data sample failed")
    assert failing.revisions[0].endswith("; no usable review")


def test_a_sample_run_that_still_fails_makes_the_round_buggy_before_its_full_run() -> None:
    bench = RoundBench(sample_ok=False)
    node = bench.tree.new_node("draft", hypothesis="H")
    assert not rdloop().code(bench, node)  # type: ignore[arg-type]
    assert node.is_buggy and node.bug_reason.startswith("the run on a data sample failed")


def test_a_revision_that_fails_ends_the_round_without_a_full_run() -> None:
    bench = RoundBench(reviews=[SimpleNamespace(ready=False, feedback="use a UNet")])
    bench.revise_ok = False
    node = bench.tree.new_node("draft", hypothesis="H")
    assert not rdloop(coding_rounds=3).code(bench, node)  # type: ignore[arg-type]
    assert bench.revised == 1


def test_with_the_feedback_deciding_the_knowledge_log_says_worked_only_for_accepted_rounds() -> None:
    policy = rdloop(feedback_decides_best=True)
    tree = Tree()
    kept = done(tree, "draft", metric=0.5, hypothesis="simple")
    refused = done(tree, "improve", kept.id, metric=0.9, hypothesis="complex")
    kept.accepted, refused.accepted = True, False
    bench = SimpleNamespace(tree=tree)
    policy.record(bench, kept)  # type: ignore[arg-type]
    policy.record(bench, refused)  # type: ignore[arg-type]
    assert [k["outcome"] for k in tree.knowledge] == ["worked", "no gain"]  # 0.9 > 0.5, but the feedback refused it
