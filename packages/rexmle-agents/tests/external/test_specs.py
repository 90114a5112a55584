"""External-agent specs as data, and bad input: built-in specs load and register as agents; an invalid spec names
its file and field; a failing environment build quotes pip and names the spec; a path that is not an ML-Master
checkout is refused before anything runs; an agent that exits without a submission makes an invalid run with its
log tail, never a harness crash; the relay's embeddings and the ML-Master validator answer inside the sandbox."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from rexmle_agents.external.envs import CACHE_VARIABLE, EnvironmentBuildError, ensure_environment
from rexmle_agents.external.spec import ExternalSpecError, builtin_spec_names, load_spec, parse_spec
from rexmle_agents.harness.agent import all_agents, make_agent
from rexmle_agents.models import ModelResponse
from rexmle_grade.errors import UserInputError


def test_builtin_specs_load_and_register_as_agents() -> None:
    assert {"aideml", "ml-master", "rdagent"} <= set(builtin_spec_names())  # and any spec added beside them
    agents = all_agents()
    for name in ("aideml", "rdagent", "ml-master", "external"):
        assert name in agents
    assert agents["aideml"].roles == ("code", "feedback") and agents["aideml"].version == "0.2.2"
    aide = load_spec("aideml")
    assert set(aide.aliases) == {"rexmle-code", "rexmle-feedback"}
    assert "aideml==0.2.2" in aide.environment.no_deps and "numpy==1.26.2" in aide.environment.requirements


@pytest.mark.parametrize(("change", "message"), [
    ({"command": []}, "field command: Tuple should have at least 1 item"),
    ({"aliases": {"gpt-4o": "code"}, "provider_hosts": False},
     "field aliases: Value error, alias 'gpt-4o' looks like a provider's"),
    ({"aliases": {"rexmle-x": "critic"}}, "aliases map to role(s) ['critic']"),
    ({"outputs": {"submission": "out", "snapshot": "per_node"}}, "per_node needs a tree"),
    ({"command": ["aide", "data_dir={nowhere}"]}, "field command[1]: unknown placeholder {nowhere}"),
    ({"files": {"../escape.md": "x"}}, "must be a path relative to the workspace"),
    ({"surprise": 1}, "field surprise: Extra inputs are not permitted"),
])
def test_an_invalid_spec_names_the_file_and_the_field(tmp_path: Path, aideml_raw: dict[str, Any],
                                                      change: dict[str, Any], message: str) -> None:
    raw = {**aideml_raw, **change}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ExternalSpecError) as caught:
        load_spec(path)
    assert str(path) in caught.value.message and message in caught.value.message


def test_a_spec_that_is_not_yaml_or_not_a_mapping(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ExternalSpecError, match="is not valid YAML"):
        load_spec(bad)
    with pytest.raises(ExternalSpecError, match="must be a YAML mapping"):
        parse_spec(["a"], "list.yaml")
    with pytest.raises(ExternalSpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")


def test_a_failing_environment_build_quotes_pip_and_names_the_spec(tmp_path: Path, aideml_raw: dict[str, Any],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "envs"))
    raw = {**aideml_raw, "name": "broken-env"}
    raw["environment"] = {"requirements": ["rexmle-test-package-that-is-not-there==1.0"],
                          "pip_args": ["--no-index"]}  # offline: no index is asked
    spec = parse_spec(raw, "broken-env.yaml")
    with pytest.raises(EnvironmentBuildError) as caught:
        ensure_environment(spec, source="broken-env.yaml")
    text = caught.value.message
    assert "external agent 'broken-env' (spec broken-env.yaml) failed" in text
    assert "No matching distribution found for rexmle-test-package-that-is-not-there==1.0" in text
    assert not any(p.is_dir() for p in (tmp_path / "envs").iterdir())  # the half-built environment is removed
    assert caught.value.hint and "build.log" in caught.value.hint


def test_a_path_that_is_not_an_ml_master_checkout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="runs from your checkout"):
        make_agent("ml-master", {})
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "main.py").write_text("")
    with pytest.raises(UserInputError) as caught:
        make_agent("ml-master", {"checkout": str(tmp_path / "other")})
    assert "is not a checkout of ml-master" in caught.value.message and "main_mcts.py" in caught.value.message
    with pytest.raises(UserInputError, match="does not exist"):
        make_agent("ml-master", {"checkout": str(tmp_path / "nowhere")})
    checkout = tmp_path / "ML-Master"
    for rel in ("main_mcts.py", "agent/mcts_agent.py", "utils/config_mcts.yaml", "requirements.txt"):
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        (checkout / rel).write_text("")
    agent = make_agent("ml-master", {"checkout": str(checkout), "steps": 10})
    assert agent.checkout == checkout.resolve()


def test_unknown_settings_and_extras_are_refused() -> None:
    with pytest.raises(UserInputError, match="has no setting"):
        make_agent("aideml", {"stepz": 3})
    with pytest.raises(UserInputError, match="has no environment extra"):
        make_agent("aideml", {"extras": ["gpu"]})
    with pytest.raises(UserInputError, match="needs the spec file"):
        make_agent("external", {})


EXIT_WITHOUT_SUBMISSION = "import sys; print('working hard'); print('something broke', file=sys.stderr); sys.exit(3)"


def test_an_agent_that_exits_without_a_submission_is_an_invalid_run(aideml_env: Any, run_external: Any,
                                                                     spec_file: Any) -> None:
    path = spec_file(command=["{python}", "-c", EXIT_WITHOUT_SUBMISSION],
                     outputs={"submission": "agent/out", "snapshot": "at_end"})
    outcome = run_external("external", lambda *a: "unused", config={"spec": str(path)}, roles=("code",))
    assert outcome.state == "failed"
    assert "exited with status 3 without leaving a submission" in outcome.reason
    # one bounded line that ends with the output's last meaningful lines, not the tail's first (issue 34, item 9)
    assert "something broke" in outcome.reason and "\n" not in outcome.reason and len(outcome.reason) < 700
    assert outcome.grade is not None and outcome.grade.status in ("invalid", "missing")
    journal = [json.loads(line) for line in (outcome.run_dir / "journal.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "agent_error" for e in journal)


PROBE = r'''
import json, os, urllib.request
base = os.environ["REXMLE_RELAY_URL"]
def post(url, body, headers=None):
    request = urllib.request.Request(url, data=body, headers=headers or {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())
vectors = post(base + "/v1/embeddings", json.dumps({"model": "openai/rexmle-embedding",
                                                     "input": ["a noisy slice", "a noisy slice", "bone"]}).encode())
health = json.loads(urllib.request.urlopen("http://127.0.0.1:5000/health", timeout=10).read())
def validate(table):
    boundary = "rexmle"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"s.csv\"\r\n"
            f"Content-Type: text/csv\r\n\r\n{table}\r\n--{boundary}--\r\n").encode()
    return post("http://127.0.0.1:5000/validate", body,
                {"Content-Type": f"multipart/form-data; boundary={boundary}", "exp-id": "ldct-iqa"})
sample = open("/workspace/data/sample_submission/submission.csv").read()
good, bad = validate(sample), validate("image_id,quality_score\n0001,1.0\n")
os.makedirs("out", exist_ok=True)
open("out/report.json", "w").write(json.dumps({"vectors": [v["embedding"] for v in vectors["data"]],
    "health": health, "good": good, "bad": bad}))
'''


def test_embeddings_and_the_validator_service_inside_the_sandbox(aideml_env: Any, run_external: Any,
                                                                  spec_file: Any) -> None:
    path = spec_file(
        embeddings="local-hashing",
        files={"agent/probe.py": PROBE.replace("{", "{{").replace("}", "}}")},
        command=["{python}", "{agent_dir}/probe.py"],
        services=[{"name": "validator", "port": 5000,
                   "command": ["{harness_python}", "-m", "rexmle_agents.external.validator", "--port", "5000",
                               "--files-dir", "{agent_dir}/out", "--task", "{task_id}"]}],
        outputs={"submission": "agent/out", "snapshot": "at_end"})
    outcome = run_external("external", lambda *a: ModelResponse(text="unused"), config={"spec": str(path)},
                           roles=("code",))
    report = json.loads((outcome.run_dir / "workspace" / "agent" / "out" / "report.json").read_text())
    first, same, other = report["vectors"]
    assert first == same and first != other and len(first) == 256
    assert report["health"] == {"status": "running"}
    assert report["good"]["is_valid"] is True, report["good"]
    assert report["bad"]["is_valid"] is False and "missing" in report["bad"]["result"].lower()
    assert outcome.state == "failed" and "without leaving a submission" in outcome.reason  # it wrote no CSV


def test_the_cache_location_is_configurable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rexmle_agents.external.envs import cache_root

    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x"
    monkeypatch.delenv(CACHE_VARIABLE)
    assert cache_root().name == "agent-envs" and os.fspath(cache_root()).startswith(os.path.expanduser("~"))


def test_the_plans_of_the_original_agents_expand_to_the_papers_settings() -> None:
    from rexmle_agents.cli import select_tasks
    from rexmle_agents.plans import expand, load_plan, refusals

    def runs(name: str) -> list[Any]:
        return expand(load_plan(name), select_tasks=select_tasks, read_config=lambda ref: {})

    main = runs("original-main")
    assert len(main) == 2 * 3 * 20 * 3 and {r.agent for r in main} == {"aideml", "rdagent"}
    assert {r.options.time_limit for r in main} == {"12h"} and "ravir" not in {r.task_id for r in main}
    aide = next(r for r in main if r.agent == "aideml")
    assert (aide.agent_config["steps"], aide.agent_config["debug_prob"], aide.agent_config["max_debug_depth"]) == \
        (2000, 1.0, 20)
    make_agent("aideml", aide.agent_config)  # the settings are the spec's
    budgets = runs("original-ablation-time-budget")
    assert {(r.options.time_limit, r.agent_config["steps"]) for r in budgets} == {("12h", 2000), ("72h", 10000)}
    master = runs("original-ml-master")
    assert len(master) == 3 * 20 * 3 and master[0].agent_config["checkout"] == "/path/to/ML-Master"
    # the dry run flags the placeholder checkout (issue 34, item 9); the other plans' settings are all accepted
    flagged = refusals(master)
    assert len(flagged) == 1 and flagged[0][:2] == ("ml-master", 180) and "is not a checkout" in flagged[0][2]
    assert refusals(main) == [] and refusals(budgets) == []
    with pytest.raises(UserInputError, match="is not a checkout of ml-master"):
        make_agent("ml-master", master[0].agent_config)


def test_a_tree_with_a_virtual_root_imports_its_children_as_drafts() -> None:
    """ML-Master's journal layout: AIDE's, plus a virtual root (stage `root`) that drafts hang from."""
    from rexmle_agents.external.trees import parse_aide_journal, to_node

    journal = {"nodes": [
        {"id": "root", "stage": "root", "step": 0, "code": "# virtual", "metric": {"value": None}},
        {"id": "a", "step": 1, "plan": "p", "code": "c", "_term_out": ["ok\n"], "exec_time": 1.5, "exc_type": None,
         "analysis": "fine", "metric": {"value": 0.3, "maximize": False}, "is_buggy": False, "ctime": 10.0},
        {"id": "b", "step": 2, "code": "c2", "_term_out": ["Traceback\n"], "exec_time": 0.2,
         "exc_type": "ValueError", "metric": {"value": None, "maximize": None}, "is_buggy": True},
        {"id": "c", "step": 3, "code": "c3", "_term_out": [], "exc_type": None, "metric": {"value": 0.2,
                                                                                      "maximize": False},
         "is_buggy": False}],
        "node2parent": {"a": "root", "b": "a", "c": "b"}}
    nodes = parse_aide_journal(json.dumps(journal).encode())
    assert [(n.key, n.parent) for n in nodes] == [("a", None), ("b", "a"), ("c", "b")]
    first = to_node(nodes[0], node_id=0, parent_id=None, parent=None, step=1, snapshot="s", snapshot_valid=True)
    second = to_node(nodes[1], node_id=1, parent_id=0, parent=first, step=2, snapshot=None, snapshot_valid=False)
    third = to_node(nodes[2], node_id=2, parent_id=1, parent=second, step=3, snapshot=None, snapshot_valid=False)
    assert (first.stage, first.lower_is_better, first.metric, first.is_valid) == ("draft", True, 0.3, True)
    assert (second.stage, second.bug_reason, second.execution.exit_code) == ("improve", "the script raised "
                                                                               "ValueError", 1)
    assert (third.stage, third.debug_depth) == ("debug", 1)


# an agent that keeps its answer to itself until it ends (as R&D-Agent does): it writes a draft, then works on
# past any deadline; only its `after` step, run by the forwarder once the agent has exited, exports the answer
NEVER_ENDS = r'''
import csv, os, time
data, out = "/workspace/data", "/workspace/agent/draft"
os.makedirs(out, exist_ok=True)
with open(f"{data}/sample_submission/submission.csv") as handle:
    rows = list(csv.reader(handle))
with open(f"{out}/submission.csv", "w", newline="") as handle:
    csv.writer(handle).writerows(rows)
print("draft written; working on", flush=True)
while True:
    time.sleep(1)
'''
EXPORT = "import shutil; shutil.copytree('/workspace/agent/draft', '/workspace/agent/final'); print('exported')"


@pytest.mark.parametrize("margin", [8.0, 0.0])
def test_an_agent_asked_to_stop_before_the_deadline_exports_its_answer_in_time(
        aideml_env: Any, run_external: Any, spec_file: Any, margin: float) -> None:
    """Issue 34 item 1: with `stop_margin_s` the agent gets SIGTERM that long before the run's deadline, the
    forwarder passes it on, the agent ends, its `after` export runs, and the run is graded from the exported
    answer; without a margin the sandbox is ended at the deadline before the export (graded missing)."""
    from rexmle_agents.harness.spec import Limits

    escaped = NEVER_ENDS.replace("{", "{{").replace("}", "}}")  # spec strings are templates
    path = spec_file(command=["{python}", "-c", escaped], after=[["{python}", "-c", EXPORT]],
                     stop_margin_s=margin, outputs={"submission": "agent/final", "snapshot": "at_end"})
    outcome = run_external("external", lambda *a: "unused", config={"spec": str(path)}, roles=("code",),
                           limits=Limits(time_limit_s=25, exec_timeout_s=25))
    journal = [json.loads(line) for line in (outcome.run_dir / "journal.jsonl").read_text().splitlines()]
    asked = [e for e in journal if e["kind"] == "log" and "asked the agent to stop" in e["message"]]
    stdout = next((outcome.run_dir / "logs" / "exec").glob("*-agent-attempt1.stdout")).read_text()
    if margin:
        assert asked and asked[0]["signalled"] == 1
        assert "exported" in stdout and outcome.grade is not None and outcome.grade.status == "valid", stdout
    else:
        assert not asked and "exported" not in stdout
        assert outcome.grade is None or outcome.grade.status in ("invalid", "missing")
