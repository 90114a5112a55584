"""A terminal agent's turns become the run's steps (``steps: turn``): each model call through the relay is one
journal step holding the model's text, the tool calls it asked for and, from the next call, their outputs, so
`rexmle runs show`, `rexmle view`, `rexmle report` and `rexmle analyse` read such runs like any other.

The agent here is the smallest tool-calling loop there is (standard library only, inside bubblewrap, chat
completions with one `bash` tool), driven by the same scripted model as the real CLI agents' tests."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jsonschema

from rexmle_agents.results.loader import load_run
from rexmle_agents.results.schemas import load_schema
from rexmle_agents.results.trajectory import trajectory

from .cli_driver import SCRIPT, CliDriver

LOOP = r'''
import json, os, subprocess, sys, urllib.request

url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
tools = [{"type": "function", "function": {"name": "bash", "description": "run a shell command",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
messages = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": open(sys.argv[1]).read()}]
for turn in range(int(sys.argv[2])):
    request = urllib.request.Request(url, data=json.dumps({"model": "rexmle-code", "messages": messages,
                                     "tools": tools}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        message = json.load(answer)["choices"][0]["message"]
    messages.append(message)
    if not message.get("tool_calls"):
        print("agent: done:", message.get("content"))
        break
    for call in message["tool_calls"]:
        command = json.loads(call["function"]["arguments"])["command"]
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": done.stdout + done.stderr})
'''


def test_each_model_call_of_a_terminal_agent_is_a_step_with_its_commands_and_outputs(
        aideml_env: Any, spec_file: Any, run_external: Any) -> None:
    spec = spec_file(name="turn-loop", steps="turn",
                     files={"agent/loop.py": LOOP.replace("{", "{{").replace("}", "}}"),
                            "agent/prompt.md": "{cli_prompt}"},
                     command=["python", "{agent_dir}/loop.py", "{agent_dir}/prompt.md", "{max_steps}"],
                     env={"OPENAI_BASE_URL": "{relay_url}/v1", "OPENAI_API_KEY": "{no_key}"},
                     outputs={"submission": "submission", "snapshot": "at_end"})
    driver = CliDriver(python=sys.executable)
    outcome = run_external("external", driver, config={"spec": str(spec)}, roles=("code",))
    assert outcome.state == "finished", outcome.reason
    assert outcome.grade is not None and outcome.grade.status == "valid"
    journal = [json.loads(line) for line in (outcome.run_dir / "journal.jsonl").read_text().splitlines()]
    schema = load_schema("journal-event")
    checker = jsonschema.validators.validator_for(schema)(schema)
    for event in journal:
        assert not list(checker.iter_errors(event)), event["kind"]

    turns = [e for e in journal if e["kind"] == "agent_turn"]
    assert len(turns) == len(SCRIPT) + 1  # one call per command, then the closing answer
    assert [t["step"] for t in turns] == list(range(1, len(SCRIPT) + 2))  # each call its own step
    assert turns[0]["tool_calls"][0]["arguments"]["command"] == driver.commands[0]
    assert turns[1]["tool_results"][0]["id"] == turns[0]["tool_calls"][0]["id"]  # the output came back next turn
    calls = [e for e in journal if e["kind"] == "model_call"]
    assert [c["step"] for c in calls] == [t["step"] for t in turns] and all(c["usage"]["input_tokens"] for c in calls)

    # the prompt the agent got is the CLI template with the run's own limits
    prompt = (outcome.run_dir / "workspace" / "agent" / "prompt.md").read_text()
    assert "non-interactively" in prompt and "rexmle_agents.validate" in prompt and "10 min" in prompt

    # the trajectory: a chain of turns, each with its commands and, attached to it, their outputs
    run = load_run(outcome.run_dir)
    tree = trajectory(run)
    assert tree.kind == "steps" and [n.stage for n in tree.nodes] == ["turn"] * len(turns)
    first = tree.nodes[0]
    assert first.plan == SCRIPT[0][0] and "ls /workspace/data" in first.code
    assert "train" in first.executions[0].output_tail  # `ls` listed the data
    ran = tree.nodes[2]
    assert "train.py" in ran.code and "trained: mean score" in ran.executions[0].output_tail
    network = tree.nodes[3].executions[0].output_tail
    assert "network refused" in network and "NETWORK REACHED" not in network
    assert tree.nodes[-1].plan.endswith("Done.") and not tree.nodes[-1].code
    assert sum(n.model_calls for n in tree.nodes) == len(calls)

    # the failure analysis: a tool's output has no exit status; a step crashed only when its output shows an error
    from rexmle_agents.analysis.failures import run_failures

    outcomes = run_failures(run).outcomes
    assert [o.outcome for o in outcomes[:3]] == ["ok", "ok", "ok"]  # ls, writing train.py, running it
    assert outcomes[3].outcome == "crashed" and outcomes[3].error_type == "network"  # the refused download

    # `rexmle runs show`, `rexmle view`, `rexmle report` and `rexmle analyse` read the run like any other
    from rexmle_grade.cli import main

    group = outcome.run_dir.parent
    assert main(["runs", "show", str(outcome.run_dir)]) == 0
    assert main(["view", str(outcome.run_dir), "-o", str(group / "page.html")]) == 0
    page = (group / "page.html").read_text()
    assert "trained: mean score" in page and "train.py" in page  # a command's output and the script it ran
    assert main(["report", str(group), "--format", "json", "--out", str(group / "report.json")]) == 0
    row = json.loads((group / "report.json").read_text())["runs"][0]
    assert row["steps"] == len(turns) and row["grade_status"] == "valid" and row["model_calls"] == len(calls)
    assert main(["analyse", str(group), "-o", str(group / "analysis")]) == 0
    analysed = (group / "analysis").rglob("*")
    assert any("train.py" in p.read_text(errors="replace") for p in analysed if p.is_file() and p.suffix in
               (".json", ".csv", ".md", ".html"))  # the analysis read the commands the agent ran


def test_the_turn_steps_option_is_validated(spec_file: Any) -> None:
    import pytest

    from rexmle_agents.external.spec import ExternalSpecError, load_spec

    path = spec_file(name="bad-steps", steps="node")
    with pytest.raises(ExternalSpecError, match="steps"):
        load_spec(Path(path))
