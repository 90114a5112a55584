"""Claude Code 2.1.197 (npm, unchanged, its native binary in its own cached environment) run end to end inside
bubblewrap on the synthetic LDCT-IQA task in its headless print mode, every model call answered through the relay's
Anthropic Messages dialect by the scripted :class:`CliDriver`: the submission it writes is graded, each call is in the
journal with its usage, the web tools are not offered to the model, the network attempt of the code it runs is
refused and is the only one, no key reaches it, the run's step limit is its turn limit, a spent budget stops it with
a 402 it does not retry, a large file is counted by the relay's count_tokens estimate rather than a model call, and a
recorded run replays offline. The end-to-end run is in the default suite (about 5 s once the environment is cached);
the others are marked slow (2-10 s each).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rexmle_agents.external.envs import AgentEnvironment
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import ModelResponse, ToolCall, Usage
from rexmle_agents.models.types import GenerateConfig, Message, ToolSpec

from . import cli_agents
from .cli_driver import FINAL_TEXT, SCRIPT, CliDriver

PACKAGE = "@anthropic-ai/claude-code@2.1.197"


@pytest.fixture(scope="module")
def claude_env() -> AgentEnvironment:
    """Claude Code's environment: about 235 MB (the native binary), built once into the agent-environment cache."""
    return cli_agents.agent_environment("claude-code", "Claude Code", registry="npm", packages=[PACKAGE])


def test_claude_code_end_to_end(claude_env: AgentEnvironment, run_external: Any, monkeypatch: Any) -> None:
    secret = "sk-ant-rexmle-test-secret-0123456789abcdef"
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)
    driver = cli_agents.RecordingDriver()
    outcome = run_external("claude-code", driver, roles=("code",), limits=Limits(time_limit_s=600, max_steps=20))
    cli_agents.assert_graded(outcome)
    run_dir = outcome.run_dir
    journal = cli_agents.journal_events(run_dir)

    # the whole script ran through Claude Code's Bash tool, and the session ended on the final text
    assert driver.turns == len(SCRIPT) + 1, (driver.turns, driver.side_calls)
    assert all("Bash" in names for names in driver.offered if names)
    # the run's step limit is Claude Code's turn limit
    argv = cli_agents.exec_argv(journal)
    assert argv[argv.index("--max-turns") + 1] == "20"
    # the web tools are switched off: never offered to the model
    assert not any({"WebFetch", "WebSearch"} & set(names) for names in driver.offered)

    cli_agents.assert_calls_journalled(journal, driver.turns + driver.side_calls)

    # the streamed JSON transcript is imported: it shows the commands' outputs as Claude Code saw them
    lines = cli_agents.transcript_lines(run_dir)
    init = next(line for line in lines if line.get("type") == "system" and line.get("subtype") == "init")
    assert init["model"] == "rexmle-code" and "WebFetch" not in init["tools"] and "WebSearch" not in init["tools"]
    result = lines[-1]
    assert result["type"] == "result" and result["result"] == FINAL_TEXT and not result["is_error"]
    cli_agents.assert_the_script_ran(json.dumps([line for line in lines if line.get("type") == "user"]))
    # the probe was refused through the relay's proxy variables, which Claude Code honours too: it is the only
    # request for the internet, so telemetry, error reports and update checks made none
    cli_agents.assert_only_the_probe_was_refused(journal)
    cli_agents.assert_no_secret_in(run_dir, secret)


@pytest.mark.slow
def test_claude_code_stops_at_a_spent_budget(claude_env: AgentEnvironment, run_external: Any) -> None:
    """The token budget runs out after the training script ran (three calls of 460 tokens against 1300): the next
    call is answered 402, which Claude Code does not retry (it retries 429 and 5xx); it ends its session, and the
    submission the script wrote is graded, the run naming the limit."""
    driver = cli_agents.RecordingDriver()
    outcome = run_external("claude-code", driver, roles=("code",),
                           limits=Limits(time_limit_s=600, max_steps=20, max_tokens=1300))
    journal = cli_agents.assert_stopped_at_402(outcome, driver, limit="tokens")
    # it exited by itself, before the harness's grace period ended
    assert cli_agents.exec_finished(journal)["stopped_by"] is None
    lines = cli_agents.transcript_lines(outcome.run_dir)
    assert lines[-1]["type"] == "result" and lines[-1]["is_error"] and "402" in lines[-1]["result"]


@pytest.mark.slow
def test_a_recorded_claude_code_run_replays(claude_env: AgentEnvironment, data_root: Path, tmp_path: Path) -> None:
    """Claude Code's calls are recorded through the relay like any model call; the same run asks the same
    questions again (its prompts hold the date and the sandbox's paths, the same in both runs) and replays from the
    cassette offline, graded the same."""
    cli_agents.replay_grades_the_same("claude-code", CliDriver(python=sys.executable), data_root, tmp_path)


class ClaudeScript:
    """Claude Code's own tools, called in order (one per turn), then a final text."""

    def __init__(self, *calls: tuple[str, dict[str, Any]]) -> None:
        self.calls = calls
        self.seen = 0

    def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig
                 ) -> ModelResponse:
        self.seen += 1
        done = sum(1 for m in messages if m.role == "tool")
        usage = Usage(input_tokens=100, output_tokens=10)
        if done >= len(self.calls):
            return ModelResponse(text="Done.", usage=usage, finish_reason="stop")
        name, arguments = self.calls[done]
        return ModelResponse(tool_calls=(ToolCall(id=f"call_{done}", name=name, arguments=arguments),), usage=usage,
                             finish_reason="tool_calls")


@pytest.mark.slow
def test_claude_code_counts_a_large_file_through_the_relay(claude_env: AgentEnvironment, run_external: Any) -> None:
    """Reading a file too large to keep whole, Claude Code asks POST /v1/messages/count_tokens: the relay's estimate
    (UTF-8 bytes / 3) answers it, with no model call (Claude Code would otherwise count with a paid one)."""
    make = "python3 -c \"open('/workspace/big.txt', 'w').write('word ' * 40000)\""
    script = ClaudeScript(("Bash", {"command": make, "description": "Write a large file"}),
                          ("Read", {"file_path": "/workspace/big.txt"}))
    outcome = run_external("claude-code", script, roles=("code",), limits=Limits(time_limit_s=600, max_steps=10))
    journal = cli_agents.journal_events(outcome.run_dir)
    assert cli_agents.model_calls(journal) == script.seen == 3
    assert not cli_agents.relay_refusals(journal)  # nothing refused
    read = json.dumps([line for line in cli_agents.transcript_lines(outcome.run_dir) if line.get("type") == "user"])
    counted = re.search(r"\((\d+) tokens, cap \d+\)", read)
    assert counted is not None, read[:2000]
    # 200,000 bytes of the file (plus line numbers and the message's keys) / 3; a model call would have said 100
    assert 66_600 <= int(counted.group(1)) <= 67_000


@pytest.mark.slow
def test_the_step_limit_is_claude_codes_turn_limit(claude_env: AgentEnvironment, run_external: Any) -> None:
    driver = CliDriver(python=sys.executable)
    outcome = run_external("claude-code", driver, roles=("code",), limits=Limits(time_limit_s=600, max_steps=2))
    assert driver.turns == 2
    result = cli_agents.transcript_lines(outcome.run_dir)[-1]
    assert result["type"] == "result" and result["subtype"] == "error_max_turns"
    assert outcome.state == "failed" and "without leaving a submission" in str(outcome.reason)


# an 8x8 grey PNG, written by the agent's own shell
PNG_WRITER = ("import struct, zlib\n"
              "def chunk(kind, data):\n"
              "    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))\n"
              "rows = b''.join(b'\\x00' + b'\\x80' * 8 for _ in range(8))\n"
              "open('/workspace/slice.png', 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack("
              "'>IIBBBBB', 8, 8, 8, 0, 0, 0, 0)) + chunk(b'IDAT', zlib.compress(rows)) + chunk(b'IEND', b''))\n")


@pytest.mark.slow
def test_claude_code_reading_an_image_goes_on(claude_env: AgentEnvironment, run_external: Any) -> None:
    """Its Read tool returns an image as an image block; the relay passes text only, so the model gets a note
    instead, and the session goes on (a refusal would have ended it with an API error)."""
    write = f"python3 - <<'EOF'\n{PNG_WRITER}EOF"
    script = ClaudeScript(("Bash", {"command": write, "description": "Write a PNG"}),
                          ("Read", {"file_path": "/workspace/slice.png"}))
    seen: list[str] = []

    def answer(messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig) -> ModelResponse:
        seen.extend(m.content for m in messages if m.role == "tool")
        return script(messages, tools, config)

    outcome = run_external("claude-code", answer, roles=("code",), limits=Limits(time_limit_s=600, max_steps=10))
    assert script.seen == 3
    assert any(text.startswith("[image omitted: the model relay of this run passes text only") for text in seen)
    result = cli_agents.transcript_lines(outcome.run_dir)[-1]
    assert result["type"] == "result" and not result["is_error"] and result["result"] == "Done."
