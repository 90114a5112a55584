"""Agent-written values JSON cannot hold never break a run (issue 31, class 4).

NaN and infinite metrics, lone surrogates in plans and outputs, nesting 10,000 levels deep in what an agent saves
or sends, NaN in a tool call's arguments: each is repaired in its field (``null`` plus a note under ``repaired``,
``\\udXXX`` escape text, a marker where the nesting is cut), so every line of ``journal.jsonl`` and
``cassette.jsonl`` is strict JSON, the run ends and is graded, and its tree is whole. A NaN or infinite metric is no
metric: its node is never compared, never chosen. Real runs: a scaffold with a scripted model (a lone surrogate in
its code too), a test agent saving what its sandboxed code printed, one failing with a lone surrogate in its error
(``status.json``, ``rexmle report``), and an external agent sending raw HTTP to the model relay from inside
bubblewrap.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from rexmle_agents.harness.agent import BaseAgent, register_agent
from rexmle_agents.harness.context import RunContext
from rexmle_agents.harness.journal import Journal
from rexmle_agents.harness.runner import RunOutcome, build_spec, execute_run, run_paths
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import Message, Model, ModelResponse, RetryPolicy, ScriptedBackend, ToolCall, ToolSpec
from rexmle_agents.models._jsonl import DEPTH_MARKER, MAX_DEPTH, clean_json, dumps_strict
from rexmle_agents.models.replay import RecordingBackend
from rexmle_agents.results.loader import load_run
from rexmle_agents.scaffolds.tree import Tree
from rexmle_grade.cli import main
from rexmle_grade.errors import RexmleError

TASK = "ldct-iqa"
FAKES_PATH = Path(__file__).parents[1] / "scaffolds" / "fakes.py"
DEEP = 10_000

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("CI"),
                                 reason="bubblewrap is not installed (apt-get install -y bubblewrap)")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def strict_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSON-lines file, parsed by a strict parser (no NaN/Infinity), as UTF-8."""
    text = path.read_bytes().decode("utf-8")  # raises on bytes that are not UTF-8
    return [json.loads(line, parse_constant=_refuse_constant) for line in text.splitlines() if line.strip()]


def reader_problems(run_dir: Path) -> list[str]:
    """What the results reader (``rexmle report``, ``view``, ``analyse``) could not use in a run folder."""
    record = load_run(run_dir)
    scan = record.journal()
    for key in scan.state_keys:
        scan.states(key)
    return [*record.problems, *scan.problems]


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def depth_of(value: Any) -> int:
    depth = 0
    while isinstance(value, list) and value:
        value, depth = value[0], depth + 1
    return depth


# ---------------------------------------------------------------------------------------------------------------
# the encoder itself, on hand-made values


def test_each_bad_value_costs_its_own_field_only() -> None:
    loop: dict[str, Any] = {"name": "loop"}
    loop["self"] = loop
    event = {"metrics": {"dice": float("nan"), "hd95": float("inf"), "ok": 0.5, "low": -float("inf")},
             "plan": "fit \ud800 a line", "deep": nested(DEEP), "loop": loop, "key\udfff": 1, "tuple": (1, 2)}
    text = dumps_strict(event)
    back = json.loads(text, parse_constant=_refuse_constant)
    assert back["metrics"] == {"dice": None, "hd95": None, "ok": 0.5, "low": None}
    assert back["plan"] == "fit \\ud800 a line" and back["key\\udfff"] == 1 and back["tuple"] == [1, 2]
    assert depth_of(back["deep"]) == MAX_DEPTH - 1 and DEPTH_MARKER in text
    assert back["loop"]["name"] == "loop" and isinstance(back["loop"]["self"], str)
    notes = back["repaired"]
    assert notes["metrics.dice"] == "NaN" and notes["metrics.hd95"] == "Infinity" and notes["metrics.low"] == \
        "-Infinity"
    assert "lone surrogates" in notes["plan"] and "cut" in notes["loop.self"]
    assert any(path.startswith("deep.0.0") for path in notes)
    assert clean_json({"a": [1.5, "x", None, True]}) == ({"a": [1.5, "x", None, True]}, {})  # good data as it was
    many = json.loads(dumps_strict({"values": [float("nan")] * 1000}))["repaired"]
    assert len(many) == 51 and many["..."] == "950 further value(s) repaired"  # a million NaNs: no million notes


def test_a_journal_with_nan_tokens_written_before_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text('{"kind": "snapshot", "time": 1.0, "score": NaN}\n')
    journal = Journal(path)
    journal.append("graded", status="valid", percentile=None, metrics={"dice": float("nan")})
    old, new = journal.events()
    assert math.isnan(old["score"]) and new["metrics"] == {"dice": None} and new["repaired"] == {"metrics.dice": "NaN"}


def test_an_original_agents_nan_metric_is_no_metric() -> None:
    """AIDE writes its tree with Python's json, so a NaN metric arrives as the token NaN."""
    from rexmle_agents.external.trees import parse_aide_journal, to_node

    items = [{"id": key, "step": i, "plan": "p", "code": "c", "metric": {"value": value, "maximize": True},
              "is_buggy": False} for i, (key, value) in enumerate([("a", "NaN"), ("b", "Infinity"), ("c", "0.5")])]
    text = json.dumps({"nodes": items, "node2parent": {}}).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity")
    parsed = parse_aide_journal(text.replace('"0.5"', "0.5").encode())
    assert [n.metric for n in parsed] == [None, None, 0.5]
    tree = Tree()
    for i, node in enumerate(parsed):
        tree.nodes[i] = to_node(node, node_id=i, parent_id=None, parent=None, step=i, snapshot=f"s{i}",
                                snapshot_valid=True)
    assert [n.is_valid for n in tree] == [False, False, True] and tree.best() is tree[2]
    assert tree[0].outcome().startswith("NO METRIC")  # not "validation metric nan", and no crash formatting None


# ---------------------------------------------------------------------------------------------------------------
# a scaffold: nodes whose scripts print NaN and Infinity metrics, plans with lone surrogates, deep tool arguments


def _load_fakes() -> Any:
    spec = importlib.util.spec_from_file_location("journal_values_fakes", FAKES_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FAKES = _load_fakes()
PRINT_LINE = 'print("VALIDATION_METRIC:", round(corr if corr == corr else 0.0, 6))'
# invalid UTF-8 and an encoded surrogate (CESU-8) on stdout, then the metric
RAW_OUTPUT = ('import sys; sys.stdout.flush(); sys.stdout.buffer.write(b"raw \\xed\\xa0\\x80 \\xff\\n"); '
              'sys.stdout.flush()')


def printing(metric: str) -> str:
    script = FAKES.good(1.0)
    assert PRINT_LINE in script
    return script.replace(PRINT_LINE, f"{RAW_OUTPUT}\nprint('VALIDATION_METRIC:', {metric})")


class HostileModel(FAKES.FakeModel):  # type: ignore[misc,name-defined]
    """The scaffold tests' fake model, with plans holding lone surrogates and reviews that report the metric the
    script printed as it is (NaN, inf), with 10,000-deep nesting and a NaN among their arguments."""

    def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: object) -> ModelResponse | str:
        answer = super().__call__(messages, tools, config)
        if isinstance(answer, str):  # the plan, and a comment of the code, with a lone surrogate
            return answer.replace("Draft", "Draft \ud800 (a lone surrogate)", 1).replace(
                "```python\n", "```python\n# written by \udc80 a model\n", 1)
        call = answer.tool_calls[0]
        if call.name != "submit_review":
            return answer
        printed = "\n".join(m.content for m in messages if m.role == "user")
        metric: float | None = call.arguments["metric"]
        if "VALIDATION_METRIC: nan" in printed:
            metric = float("nan")
        elif "VALIDATION_METRIC: inf" in printed:
            metric = float("inf")
        arguments = {**call.arguments, "metric": metric, "is_bug": metric is None, "evidence": nested(DEEP),
                     "confidence": float("nan"), "summary": "reviewed \udc80 by the hostile fake"}
        return answer.model_copy(update={"tool_calls": (ToolCall(id=call.id, name=call.name, arguments=arguments),)})


@needs_bwrap
def test_nan_metrics_surrogate_plans_and_deep_tool_arguments_in_a_scaffold_run(data_root: Path,
                                                                                open_runs_dir: Path) -> None:
    spec = build_spec(TASK, agent="aide", agent_config={"num_drafts": 3}, models={"code": "scripted/model"}, seed=0,
                      limits=Limits(time_limit_s=300, max_steps=3, exec_timeout_s=60), sandbox="bwrap",
                      data_root=data_root, group="test")
    paths = run_paths(spec, open_runs_dir)
    fake = HostileModel([printing('float("nan")'), printing('float("inf")'), FAKES.good(1.0)])
    model = Model(RecordingBackend(ScriptedBackend(fake), paths.cassette), retry=RetryPolicy(max_attempts=1))
    outcome = execute_run(spec, open_runs_dir, models={"code": model}, grace_s=5.0)

    assert outcome.state == "finished", outcome.reason
    assert outcome.grade is not None and outcome.grade.status == "valid"
    events = strict_lines(paths.journal)
    cassette = strict_lines(paths.cassette)
    assert len(cassette) >= 6 and any(entry.get("repaired") for entry in cassette)
    assert any("confidence" in path and note == "NaN" for entry in cassette for path, note in
               (entry.get("repaired") or {}).items())
    assert any(DEPTH_MARKER in json.dumps(entry) for entry in cassette)

    tree = Tree.from_journal(events)
    assert [n.id for n in tree] == [0, 1, 2] and all(n.done for n in tree)
    nan_node, inf_node, good_node = tree[0], tree[1], tree[2]
    assert "\\ud800" in nan_node.plan and "\ud800" not in nan_node.plan
    assert "raw \ufffd" in nan_node.execution.output_tail  # undecodable output is replaced where it is read
    assert good_node.code.startswith("# written by \\udc80 a model\n")  # the script ran with it as \u text
    solution = paths.snapshots / good_node.snapshot_id / "solution.py"
    assert solution.read_text(encoding="utf-8").startswith("# written by \\udc80 a model\n")
    assert "no usable review" in nan_node.bug_reason  # a NaN metric is refused as the review's argument
    assert "no validation metric" in inf_node.bug_reason  # an infinite one is taken as no metric
    for node in (nan_node, inf_node):  # a NaN or infinite metric is no metric: never valid, never compared
        assert node.metric is None and not node.is_valid and node.score is None
    assert good_node.is_valid and tree.best() is good_node
    chosen = [e for e in events if e["kind"] == "final_selected"]
    assert chosen and chosen[-1]["snapshot"] == good_node.snapshot_id
    assert not reader_problems(paths.run_dir)  # the results reader takes every line


# ---------------------------------------------------------------------------------------------------------------
# an agent that journals what its sandboxed code printed


REPORTING_SCRIPT = r'''
import sys
out = sys.stdout.buffer
out.write(b"metric nan\nscore inf\nloss -inf\ndepth 10000\n")
out.write(b"plan \xed\xa0\x80 =HYPERLINK(1) \xff\n")  # a surrogate encoded as UTF-8 (CESU-8) and a stray byte
'''


@register_agent
class ReportingAgent(BaseAgent):
    """Runs a script in the sandbox and keeps what it printed, read as an agent might: numbers with float(), the
    text decoded with ``surrogateescape`` (so undecodable bytes become lone surrogates), nesting built from it."""

    name: ClassVar[str] = "test-journal-values"
    description: ClassVar[str] = "test agent: journals NaN, lone surrogates and deep nesting its code printed"

    def run(self, ctx: RunContext) -> None:
        with ctx.step("report") as step:
            result = ctx.execute(["python", "-c", REPORTING_SCRIPT])
            raw = result.stdout_path.read_bytes()
            words = dict(line.split(b" ", 1) for line in raw.splitlines())
            report = {"metric": float(words[b"metric"]), "score": float(words[b"score"]),
                      "loss": float(words[b"loss"]), "plan": words[b"plan"].decode("utf-8", "surrogateescape"),
                      "nested": nested(int(words[b"depth"]))}
            step.result.update(exit_code=result.exit_code, **report)
            ctx.save_state(report)
            ctx.log(f"reported {report['plan']}", **report)
            ctx.execute(f"cp -R {ctx.workspace}/data/sample_submission/. {ctx.workspace}/submission/")
            ctx.select_final(ctx.snapshot_submission("sample", score=report["metric"]), reason="the sample")


@needs_bwrap
def test_an_agent_journaling_nan_surrogates_and_deep_nesting_from_its_code_is_graded(data_root: Path,
                                                                                     open_runs_dir: Path) -> None:
    spec = build_spec(TASK, agent="test-journal-values", seed=0, limits=Limits(time_limit_s=120), sandbox="bwrap",
                      data_root=data_root, group="test")
    outcome = execute_run(spec, open_runs_dir, grace_s=5.0)

    assert outcome.state == "finished", outcome.reason
    assert outcome.grade is not None and outcome.grade.status == "valid"
    paths = run_paths(spec, open_runs_dir)
    events = strict_lines(paths.journal)
    state = next(e for e in events if e["kind"] == "agent_state")
    assert state["state"]["metric"] is None and state["state"]["score"] is None and state["state"]["loss"] is None
    assert state["repaired"]["state.metric"] == "NaN" and state["repaired"]["state.score"] == "Infinity"
    assert state["state"]["plan"] == "\\udced\\udca0\\udc80 =HYPERLINK(1) \\udcff"
    assert depth_of(state["state"]["nested"]) == MAX_DEPTH - 2  # the event and "state" are two of the levels
    finished = next(e for e in events if e["kind"] == "step_finished")
    assert finished["status"] == "ok" and finished["result"]["exit_code"] == 0
    assert finished["repaired"]["result.metric"] == "NaN"
    snapshot = next(e for e in events if e["kind"] == "snapshot")
    assert snapshot["score"] is None and snapshot["repaired"] == {"score": "NaN"}
    assert any(e["kind"] == "log" and e["message"].startswith("reported \\udced") for e in events)
    assert events[-1]["kind"] == "graded"
    assert not reader_problems(paths.run_dir)
    assert load_run(paths.run_dir).journal().state("agent")["loss"] is None


@register_agent
class SurrogateErrorAgent(BaseAgent):
    """Submits the sample, then fails with an error quoting text that holds a lone surrogate (as a model's answer,
    parsed from JSON, can)."""

    name: ClassVar[str] = "test-surrogate-error"
    description: ClassVar[str] = "test agent: fails with a lone surrogate in its error message"

    def run(self, ctx: RunContext) -> None:
        ctx.execute(f"cp -R {ctx.workspace}/data/sample_submission/. {ctx.workspace}/submission/")
        ctx.select_final(ctx.snapshot_submission("sample"), reason="the sample \ud800")
        raise RexmleError("the model answered 'fit \ud800 a line' instead of a tool call")


@needs_bwrap
def test_a_lone_surrogate_in_the_end_reason_reaches_status_json_and_reports_repaired(
        data_root: Path, open_runs_dir: Path, tmp_path: Path, capsys: Any) -> None:
    spec = build_spec(TASK, agent="test-surrogate-error", seed=0, limits=Limits(time_limit_s=120), sandbox="bwrap",
                      data_root=data_root, group="test")
    outcome = execute_run(spec, open_runs_dir, grace_s=5.0)

    assert outcome.state == "failed" and "instead of a tool call" in outcome.reason
    assert outcome.grade is not None and outcome.grade.status == "valid"
    paths = run_paths(spec, open_runs_dir)
    strict_lines(paths.journal)
    status = json.loads(paths.status.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    assert "fit \\ud800 a line" in status["reason"]
    assert not reader_problems(paths.run_dir)
    report = tmp_path / "report.json"
    assert main(["report", str(paths.run_dir), "--format", "json", "-o", str(report), "--bootstrap", "0"]) == 0
    capsys.readouterr()
    assert json.loads(report.read_text(encoding="utf-8"))["rows"]


# ---------------------------------------------------------------------------------------------------------------
# an external agent sending raw HTTP to the model relay


RELAY_CLIENT = r'''
import http.client, json, os, shutil, urllib.parse

def post(body: bytes) -> object:
    port = urllib.parse.urlsplit(os.environ["REXMLE_RELAY_URL"]).port
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        answer = connection.getresponse()
        return answer.status
    except Exception as exc:  # no answer at all: what the attack used to cause
        return f"no answer: {type(exc).__name__}: {exc}"
    finally:
        connection.close()

def deep(depth):
    return "[" * depth + "]" * depth

def chat(messages, **extra):
    return json.dumps({"model": "rexmle-code", "messages": messages, **extra}).encode()

answers = {
    # text with lone surrogates (valid JSON escapes) and 10,000-deep nesting among the tool parameters
    "surrogate_and_deep": post(chat([{"role": "user", "content": "plan \ud800 and \udfff alone"}])[:-1]
                               + b', "tools": [{"type": "function", "function": {"name": "t", "parameters": '
                               + deep(10000).encode() + b'}}]}'),
    "surrogate_text": post(chat([{"role": "user", "content": "plan \ud800 alone"}])),
    "surrogate_model": post(json.dumps({"model": "rexmle-\udc80",
                                        "messages": [{"role": "user", "content": "x"}]}).encode()),
    "deep_body": post(deep(10000).encode()),
    # an earlier tool call whose arguments hold NaN (JSON text inside the body, as the OpenAI API sends it)
    "nan_tool_arguments": post(chat([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "submit", "arguments": '{"metric": NaN, "note": "\\ud800"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "user", "content": "again"}])),
    "nan_in_body": post(b'{"model": "rexmle-code", "temperature": NaN, '
                        b'"messages": [{"role": "user", "content": "x"}]}'),
    "plain": post(chat([{"role": "user", "content": "a plain question"}])),
}
os.makedirs("out", exist_ok=True)
shutil.copy("/workspace/data/sample_submission/submission.csv", "out/submission.csv")
json.dump(answers, open("out/answers.json", "w"))
'''


def _aideml_spec() -> dict[str, Any]:
    from importlib import resources

    from rexmle_agents.external.spec import SPEC_PACKAGE

    return yaml.safe_load(resources.files(SPEC_PACKAGE).joinpath("aideml.yaml").read_text())


@pytest.fixture(scope="module")
def aideml_env() -> Any:
    """aideml's environment (built once into the agent-environment cache, then reused; see tests/external)."""
    from rexmle_agents.external.envs import ensure_environment
    from rexmle_agents.external.spec import load_spec

    return ensure_environment(load_spec("aideml"), source="aideml")


def _relay_client_spec(folder: Path) -> Path:
    raw = _aideml_spec()  # the spec of aideml's environment (its cache entry is shared), with our own command
    raw.update(name="test-journal-values-relay", settings={}, env={}, roles=["code"],
               aliases={"rexmle-code": "code"}, files={"agent/client.py": RELAY_CLIENT.replace("{", "{{")
                                                       .replace("}", "}}")},
               command=["{python}", "{agent_dir}/client.py"], outputs={"submission": "agent/out",
                                                                       "snapshot": "at_end"})
    path = folder / "relay-client.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@needs_bwrap
def test_relayed_requests_with_surrogates_deep_nesting_and_nan_are_answered_and_journaled(
        aideml_env: Any, data_root: Path, open_runs_dir: Path, tmp_path: Path) -> None:
    spec = build_spec(TASK, agent="external", agent_config={"spec": str(_relay_client_spec(tmp_path))},
                      models={"code": "scripted/model"}, seed=0, limits=Limits(time_limit_s=300), sandbox="bwrap",
                      data_root=data_root, group="test")
    paths = run_paths(spec, open_runs_dir)
    backend = ScriptedBackend(lambda messages, tools, config: ModelResponse(
        text="an answer", model="scripted/model", tool_calls=(ToolCall(id="r1", name="t", arguments={
            "score": float("nan"), "text": "back \ud800", "deep": nested(200)}),)))
    model = Model(RecordingBackend(backend, paths.cassette), retry=RetryPolicy(max_attempts=1))
    outcome: RunOutcome = execute_run(spec, open_runs_dir, models={"code": model}, grace_s=5.0)

    answers = json.loads((paths.workspace / "agent" / "out" / "answers.json").read_text())
    assert all(isinstance(status, int) for status in answers.values()), answers  # every request was answered
    assert answers["plain"] == 200 and answers["nan_tool_arguments"] == 200
    assert outcome.state == "finished", outcome.reason
    assert outcome.grade is not None and outcome.grade.status == "valid"
    events = strict_lines(paths.journal)
    assert events[-1]["kind"] == "graded"
    cassette = strict_lines(paths.cassette)
    answered = sum(status == 200 for status in answers.values())
    assert len(cassette) == answered and all(entry["repaired"] for entry in cassette)
    assert all(entry["response"]["tool_calls"][0]["arguments"]["score"] is None for entry in cassette)
    notes = {path: note for entry in cassette for path, note in entry["repaired"].items()}
    assert notes["request.messages.1.tool_calls.0.arguments.metric"] == "NaN"  # the agent's NaN, relayed
    assert "lone surrogates" in notes["request.messages.1.tool_calls.0.arguments.note"]
    assert "lone surrogates" in notes["response.tool_calls.0.arguments.text"]
    calls = [e for e in events if e["kind"] == "model_call"]
    assert len(calls) == answered
    assert not reader_problems(paths.run_dir)
