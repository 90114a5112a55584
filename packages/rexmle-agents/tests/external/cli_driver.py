"""A scripted model that drives any terminal coding agent (Claude Code, Codex CLI, Gemini CLI, mini-swe-agent,
OpenHands) through one small ML task, whatever dialect the relay translates it from.

It answers like a model would: on each turn it looks at the tools the agent offers, picks the agent's shell tool (a
function whose parameters take a command: ``command``/``cmd`` as a string, or as an argv array), and asks it to run
the next command of :data:`SCRIPT` (list the data, write a training script, run it, try the network, validate).
The turn number is the count of tool results already in the conversation, so every agent (each with its own
system prompt and its own extra calls) walks through the same commands. After the last command it answers with
plain text, which ends a turn-based agent's session. Calls that offer no shell tool (titles, routing, summaries,
quota probes) get a short plain answer, or the JSON object their schema asks for.

The task is the synthetic LDCT-IQA (a CSV submission: ``image_id,quality_score``): the script predicts the mean of
the training scores plus a per-image term from the file size, so the submission validates and grades.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rexmle_agents.models import ModelResponse, ToolCall, Usage
from rexmle_agents.models.types import GenerateConfig, Message, ToolSpec

TRAIN_SCRIPT = r'''
import csv, os, statistics
data = os.environ.get("REXMLE_DATA", "/workspace/data")
with open(f"{data}/train/labels.csv") as handle:
    scores = [float(row["quality_score"]) for row in csv.DictReader(handle)]
mean = statistics.fmean(scores)
with open(f"{data}/sample_submission/submission.csv") as handle:
    ids = [row["image_id"] for row in csv.DictReader(handle)]
out = os.environ.get("REXMLE_SUBMISSION", "/workspace/submission")
os.makedirs(out, exist_ok=True)
with open(f"{out}/submission.csv", "w", newline="") as handle:
    writer = csv.writer(handle)
    writer.writerow(["image_id", "quality_score"])
    for image_id in ids:
        size = os.path.getsize(f"{data}/test/images/{image_id}.tif")
        writer.writerow([image_id, round(mean + (size % 97) / 970.0, 6)])
print(f"trained: mean score {mean:.4f} over {len(scores)} slices; wrote {len(ids)} predictions")
'''

NETWORK_PROBE = ("python3 -c \"import urllib.request as u; u.urlopen('https://pypi.org/simple/', timeout=5)\" "
                 "&& echo NETWORK REACHED || echo network refused")

SCRIPT: tuple[tuple[str, str], ...] = (
    ("I will look at the data first.", "ls /workspace/data /workspace/data/train | head -20"),
    ("I will write a training script.", "mkdir -p /workspace/working && cat > /workspace/working/train.py <<'EOF'"
                                        f"{TRAIN_SCRIPT}EOF"),
    ("Now I run it.", "cd /workspace/working && PYTHON_BIN train.py"),
    ("Can I download pretrained weights?", NETWORK_PROBE),
    ("Validating the submission.", "PYTHON_BIN -m rexmle_agents.validate /workspace/submission"),
)
FINAL_TEXT = "The submission is written and valid. Done."


def _shell_tool(tools: Sequence[ToolSpec]) -> tuple[ToolSpec, str, bool] | None:
    """The agent's shell tool: (tool, the argument that takes the command, whether it takes an argv array)."""
    ranked = sorted(tools, key=lambda t: (not any(w in t.name.lower() for w in ("bash", "shell", "exec", "command",
                                                                                 "terminal")), t.name))
    for tool in ranked:
        properties = (tool.parameters or {}).get("properties") or {}
        for name in ("command", "cmd"):
            kind = (properties.get(name) or {}).get("type")
            if kind == "string":
                return tool, name, False
            if kind == "array":
                return tool, name, True
    return None


def _tool_results(messages: Sequence[Message]) -> int:
    return sum(1 for m in messages if m.role == "tool")


def _json_answer(config: GenerateConfig) -> str | None:
    """A JSON object for a call that asks for one (a response schema or JSON mode), from the schema's fields."""
    extra = config.extra or {}
    schema = None
    for key in ("response_format", "responseSchema", "response_schema", "responseJsonSchema", "text"):
        value = extra.get(key)
        if isinstance(value, dict):
            schema = value.get("json_schema", {}).get("schema") if "json_schema" in value else value
            schema = schema.get("schema", schema) if isinstance(schema, dict) else schema
            break
    if not isinstance(schema, dict):
        return None
    answer: dict[str, Any] = {}
    for name, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type") if isinstance(prop, dict) else None
        enum = prop.get("enum") if isinstance(prop, dict) else None
        answer[name] = enum[0] if enum else {"string": "ok", "number": 0, "integer": 0, "boolean": False,
                                             "array": [], "object": {}}.get(str(kind).lower(), "ok")
    return json.dumps(answer)


@dataclass
class CliDriver:
    """The scripted model; ``python`` is the interpreter the script's commands run with inside the sandbox."""

    python: str = "python3"
    usage: Usage = field(default_factory=lambda: Usage(input_tokens=400, output_tokens=60))
    turns: int = 0  # calls that offered the shell tool
    side_calls: int = 0  # calls that did not
    commands: list[str] = field(default_factory=list)
    # an agent that ends only on a command of its own (mini-swe-agent's completion marker) gets it as the turn after
    # the script; the plain final text still answers any later turn
    finish_command: str | None = None

    def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig
                 ) -> ModelResponse:
        shell = _shell_tool(tools)
        if shell is None:
            self.side_calls += 1
            return ModelResponse(text=_json_answer(config) or "rexmle task", usage=self.usage)
        self.turns += 1
        done = _tool_results(messages)
        if done == len(SCRIPT) and self.finish_command is not None:
            thought, command = FINAL_TEXT, self.finish_command
        elif done >= len(SCRIPT):
            return ModelResponse(text=FINAL_TEXT, usage=self.usage, finish_reason="stop")
        else:
            thought, command = SCRIPT[done]
        command = command.replace("PYTHON_BIN", self.python)
        self.commands.append(command)
        tool, argument, as_argv = shell
        arguments: dict[str, Any] = {argument: ["bash", "-lc", command] if as_argv else command}
        if "description" in ((tool.parameters or {}).get("properties") or {}):
            arguments["description"] = thought
        call = ToolCall(id=f"call_{done}_{self.turns}", name=tool.name, arguments=arguments)
        return ModelResponse(text=thought, tool_calls=(call,), usage=self.usage, finish_reason="tool_calls")
