"""The original AIDE (aideml 0.2.2, unchanged, in its own environment) run end to end inside bubblewrap on the
synthetic LDCT-IQA task, its model calls answered by a scripted model behind the relay: every node is imported
into rexmle's node records with a snapshot of its own submission, the best node by AIDE's own metric is graded
(not the last node, which overwrote the file), a network attempt by its code is refused and recorded, no key is
inside, and a spent budget stops it with a 402 it does not retry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from rexmle_agents.external.envs import AgentEnvironment
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import ModelResponse, ToolCall, Usage
from rexmle_agents.results.loader import load_run
from rexmle_agents.results.schemas import load_schema
from rexmle_agents.results.trajectory import trajectory

CODE = '''
import os, urllib.request
import numpy as np, pandas as pd
ids = pd.read_csv("./input/sample_submission/submission.csv", dtype=str)["image_id"]
scores = [os.path.getsize(f"./input/test/images/{i}.tif") * SCALE + k for k, i in enumerate(ids)]
pd.DataFrame({"image_id": ids, "quality_score": scores}).to_csv("./working/submission.csv", index=False)
print("key seen by the code:", os.environ.get("OPENAI_API_KEY"))
if NETWORK:
    try:
        urllib.request.urlopen("https://api.openai.com/v1/models", timeout=5)
        print("NETWORK REACHED")
    except Exception as exc:
        print("network refused:", exc)
print("validation metric:", METRIC)
'''

# (plan, scale, reported metric, review says buggy, tries the network); AIDE: draft, then improve the best
NODES = [("Draft: a score from the file size.", 1.0, 0.7, False, False),
         ("Improve: try the network.", -1.0, None, True, True),
         ("Improve: another scale.", -3.0, 0.4, False, False)]


# Code that uses `random` unseeded (in AIDE's child process and in an interpreter it starts) and writes what it drew
# where the prompts do not see it; WRITE: whether it writes its own submission
RANDOM_CODE = '''
import random, subprocess, sys
import pandas as pd
ids = pd.read_csv("./input/sample_submission/submission.csv", dtype=str)["image_id"]
child = subprocess.run([sys.executable, "-c", "import random; print(random.random())"], capture_output=True,
                       text=True).stdout.strip()
with open("./working/random.txt", "a") as out:
    out.write(f"{random.random()} {child}\\n")
if NETWORK:
    pd.DataFrame({"image_id": ids, "quality_score": [SCALE] * len(ids)}).to_csv("./working/submission.csv", index=False)
print("validation metric:", METRIC)
'''
# a draft that writes its submission, then a better node whose code writes none (NETWORK stands for WRITE here)
REPLAY_NODES = [("Draft: a constant score.", 1.0, 0.7, False, True),
                ("Improve: forgets to write its submission.", 2.0, 0.9, False, False)]


def code_of(index: int, nodes: list[Any] = NODES, template: str = CODE) -> str:
    _, scale, metric, _, network = nodes[index]
    return template.replace("SCALE", str(scale)).replace("METRIC", str(metric)).replace("NETWORK", str(network))


class ScriptedAide:
    """Answers AIDE's prompts: a plan and a code block for draft/improve, a submit_review tool call for reviews."""

    def __init__(self, nodes: list[Any] = NODES, template: str = CODE) -> None:
        self.nodes = nodes
        self.template = template
        self.code_calls = 0
        self.review_calls = 0

    def __call__(self, messages: Any, tools: Any, config: Any) -> ModelResponse:
        if tools:
            forced = config.extra["tool_choice"]["function"]["name"]  # the forced tool reached the model
            assert tools[0].name == forced == "submit_review"
            _, _, metric, buggy, _ = self.nodes[self.review_calls]
            self.review_calls += 1
            review = {"is_bug": buggy, "summary": "looks fine" if not buggy else "it failed",
                      "metric": metric, "lower_is_better": False}
            return ModelResponse(tool_calls=(ToolCall(id="call_review", name="submit_review", arguments=review),),
                                 usage=Usage(input_tokens=120, output_tokens=30), finish_reason="tool_calls")
        index = self.code_calls
        self.code_calls += 1
        plan = self.nodes[index][0]
        return ModelResponse(text=f"{plan}\n\n```python\n{code_of(index, self.nodes, self.template)}\n```",
                             usage=Usage(input_tokens=300, output_tokens=80))


def events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]


def test_aideml_end_to_end(aideml_env: AgentEnvironment, run_external: Any, monkeypatch: Any) -> None:
    secret = "sk-rexmle-test-secret-abcdef0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    scripted = ScriptedAide()
    outcome = run_external("aideml", scripted, config={"steps": 3, "num_drafts": 1, "debug_prob": 0.0})
    assert outcome.state == "finished", outcome.reason
    assert outcome.grade is not None and outcome.grade.status == "valid"
    run_dir = outcome.run_dir
    journal = events(run_dir)

    # every model call went through the relay into the journal, one step per AIDE node
    calls = [e for e in journal if e["kind"] == "model_call"]
    assert len(calls) == 6 and scripted.code_calls == 3 and scripted.review_calls == 3
    assert [c["step"] for c in calls] == [1, 1, 2, 2, 3, 3]

    # the run folder is in the published run format (every record validates against the shipped schema)
    schema = load_schema("journal-event")
    checker = jsonschema.validators.validator_for(schema)(schema)
    for event in journal:
        assert not list(checker.iter_errors(event)), event["kind"]

    # the tree, as rexmle node records
    run = load_run(run_dir)
    run.journal()
    assert run.problems == []
    tree = trajectory(run)
    assert tree.kind == "tree"
    nodes = {n.id: n for n in tree.nodes}
    assert [(n.stage, n.parent, n.buggy, n.metric) for n in nodes.values()] == [
        ("draft", None, False, 0.7), ("improve", 0, True, None), ("improve", 0, False, 0.4)]
    # AIDE keeps the code as it extracted it (formatted with black): the scripted code, reformatted
    assert "* 1.0 + k" in nodes[0].code and "* -3.0 + k" in nodes[2].code and nodes[0].plan.startswith("Draft")
    assert "validation metric: 0.7" in nodes[0].executions[0].output_tail
    assert [n.step for n in nodes.values()] == [1, 2, 3]

    # a snapshot per good node, taken before the next node overwrote working/submission.csv; the best is graded
    snapshots = [e for e in journal if e["kind"] == "snapshot"]
    assert [(s["metadata"]["node"], s["valid"], s["score"]) for s in snapshots] == [(0, True, 0.7), (2, True, 0.4)]
    assert nodes[0].final and not nodes[2].final
    final_csv = (run_dir / "final" / "submission" / "submission.csv").read_text()
    last_csv = (run_dir / "workspace" / "agent" / "attempt-1" / "workspaces" / "0-rexmle" / "working"
                / "submission.csv").read_text()
    assert final_csv != last_csv and "-" not in final_csv.splitlines()[1]  # node 0's scale is positive
    assert (run_dir / "final" / "best_solution.py").read_text() == nodes[0].code

    # the agent's own logs and its journal.json are imported
    imported = run_dir / "logs" / "agent" / "attempt-1"
    assert (imported / "logs" / "0-rexmle" / "journal.json").is_file()
    assert (imported / "best_solution.py").read_text() == nodes[0].code  # AIDE's own choice agrees

    # the network attempt of node 1's code was refused (403 through the proxy variables) and recorded
    refused = [e for e in journal if e["kind"] == "log" and e.get("relay") == "network_refused"]
    assert refused and refused[0]["target"] == "api.openai.com:443"
    assert "NETWORK REACHED" not in nodes[1].executions[0].output_tail
    assert "network refused" in nodes[1].executions[0].output_tail

    # no key inside: the code saw the relay's placeholder, and the real key is nowhere in the run folder
    assert "key seen by the code: rexmle-relay-needs-no-key" in nodes[0].executions[0].output_tail
    for path in run_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert secret.encode() not in path.read_bytes(), path


def test_aideml_stops_at_a_spent_budget(aideml_env: AgentEnvironment, run_external: Any) -> None:
    """The token budget runs out after the first node: the next call is answered 402, which AIDE does not retry
    (one refusal in the grace period, where a 429 would have been retried with back-off). AIDE then raises, but
    its process does not exit (its code-execution child keeps it alive), so the harness stops it after the grace
    period; the first node's submission is graded and the run names the limit."""
    from rexmle_agents.external.agent import AidemlAgent

    scripted = ScriptedAide()
    original = AidemlAgent.stop_grace_s
    AidemlAgent.stop_grace_s = 6.0
    try:
        outcome = run_external("aideml", scripted, config={"steps": 3, "num_drafts": 1, "debug_prob": 0.0},
                               limits=Limits(time_limit_s=600, max_tokens=530))
    finally:
        AidemlAgent.stop_grace_s = original
    assert (outcome.state, outcome.limit) == ("finished", "tokens"), outcome.reason
    assert outcome.seconds < 120
    journal = events(outcome.run_dir)
    assert sum(e["kind"] == "model_call" for e in journal) == 2
    refused = [e for e in journal if e["kind"] == "log" and e.get("relay") == "budget_exhausted"]
    assert len(refused) == 1 and refused[0]["status"] == 402
    stderr = next((outcome.run_dir / "logs" / "exec").glob("*-agent-attempt1.stderr")).read_text()
    assert "openai.APIStatusError: Error code: 402" in stderr
    exec_finished = next(e for e in journal if e["kind"] == "exec_finished")
    assert exec_finished["stopped_by"] == "cancelled"  # the harness's stop, after the grace period
    assert outcome.grade is not None and outcome.grade.status == "valid"
    assert scripted.code_calls == 1


def test_a_recorded_aideml_run_replays(aideml_env: AgentEnvironment, data_root: Path, tmp_path: Path) -> None:
    """AIDE's calls are recorded through the relay like any model call; with Python's random seeded by the run's
    seed in AIDE's own process (AIDE shuffles its prompts), the same run asks the same questions again and replays
    from the cassette, while the code AIDE runs draws different numbers each time, as it does outside rexmle
    (issue 34, item 8). The second node reports a better metric but writes no submission: it owns none, so neither
    run snapshots or grades it, and the replay grades the recording's files (issue 34, item 6). (Its review prompts
    quote the code's run time in words, "a moment": code whose run time crosses a word boundary between recording
    and replay diverges.)"""
    from rexmle_agents.harness.runner import build_spec, execute_run
    from rexmle_agents.models import Model, RecordingBackend, ReplayBackend, RetryPolicy, ScriptedBackend

    cassette = tmp_path / "cassette.jsonl"
    spec = build_spec("ldct-iqa", agent="aideml", agent_config={"steps": 2, "num_drafts": 1, "debug_prob": 0.0},
                      models={"code": "scripted/model", "feedback": "scripted/model"}, seed=3,
                      limits=Limits(time_limit_s=600), sandbox="bwrap", data_root=data_root, group="test")
    scripted = ScriptedAide(REPLAY_NODES, RANDOM_CODE)
    recorder = Model(RecordingBackend(ScriptedBackend(scripted), cassette), retry=RetryPolicy(max_attempts=1))
    first = execute_run(spec, tmp_path / "recorded", models={"code": recorder, "feedback": recorder}, grace_s=5.0)
    player = Model(ReplayBackend(cassette, "scripted/model"), retry=RetryPolicy(max_attempts=1))
    second = execute_run(spec, tmp_path / "replayed", models={"code": player, "feedback": player}, grace_s=5.0)
    assert (first.state, second.state) == ("finished", "finished"), second.reason
    assert first.grade is not None and second.grade is not None and first.grade.score == second.grade.score
    replayed = [json.loads(line) for line in (second.run_dir / "journal.jsonl").read_text().splitlines()]
    assert sum(e["kind"] == "model_call" for e in replayed) == 4
    assert not [e for e in replayed if e["kind"] == "log" and e.get("relay") == "upstream_error"]

    # only the draft owns a submission: the better node wrote none and inherits nothing, in both runs
    for run in (first, second):
        snapshots = [e for e in events(run.run_dir) if e["kind"] == "snapshot"]
        assert [s["metadata"]["node"] for s in snapshots] == [0], run.run_dir
        final = (run.run_dir / "final" / "submission" / "submission.csv").read_text().splitlines()
        assert final[1].endswith(",1.0")
        tree = trajectory(load_run(run.run_dir))
        assert [(n.metric, n.snapshot is not None, n.final) for n in tree.nodes] == [(0.7, True, True),
                                                                                     (0.9, False, False)]

    # the code's own random numbers (in AIDE's child, and in an interpreter it started) differ between the runs
    def drawn(run: Any) -> list[list[str]]:
        path = run.run_dir / "workspace" / "agent" / "attempt-1" / "workspaces" / "0-rexmle" / "working" / "random.txt"
        return [line.split() for line in path.read_text().splitlines()]

    recorded, again = drawn(first), drawn(second)
    assert len(recorded) == len(again) == 2 and all(len(row) == 2 for row in recorded + again)
    assert all(a[0] != b[0] and a[1] != b[1] for a, b in zip(recorded, again, strict=True)), (recorded, again)
