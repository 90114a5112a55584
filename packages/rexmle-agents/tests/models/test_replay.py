"""Record a run against the loopback server, then replay it offline."""

from __future__ import annotations

import json

import pytest

from rexmle_agents.models import GenerateConfig, Message, ReplayBackend, ToolSpec, UsageLedger, get_model
from rexmle_agents.models.replay import normalised_request, request_key
from rexmle_grade.errors import ModelAPIError, UserInputError

TOOLS = [ToolSpec(name="run", parameters={"type": "object"})]


def conversation(step: int) -> list[Message]:
    return [Message.system("agent"), Message.user(f"step {step}")]


def test_recorded_run_replays_exactly_offline(server, wire, fast_retry, tmp_path):
    cassette = tmp_path / "calls.jsonl"
    server.error(500)  # a failed attempt is retried and not recorded
    server.json(wire.chat_completion("first", usage=(100, 10, 40)))
    server.sse(
        wire.chat_stream(
            ["sec", "ond"], tool_calls=[("c1", "run", ['{"x": 1}'])], usage=(200, 20, 0), finish_reason="tool_calls"
        )
    )
    live = get_model("openai/gpt-5", api_key="sk-test", base_url=server.url, retry=fast_retry, record_to=cassette)
    recorded = [
        live.generate(conversation(1), tools=TOOLS),
        live.generate(conversation(2), tools=TOOLS, config=GenerateConfig(stream=True)),
    ]
    server.stop()
    assert len(cassette.read_text().splitlines()) == 2

    ledger = UsageLedger()
    replay = get_model("openai/gpt-5", replay_from=cassette, ledger=ledger)  # no key, no server
    replayed = [
        replay.generate(conversation(1), tools=TOOLS),
        replay.generate(conversation(2), tools=TOOLS),  # a streamed recording replays unstreamed
    ]
    strip = {"retry_time_s"}
    assert [r.model_dump(exclude=strip) for r in replayed] == [r.model_dump(exclude=strip) for r in recorded]
    assert replayed[1].tool_calls[0].arguments == {"x": 1}
    assert ledger.totals().usage.input_tokens == 300
    assert ledger.totals().cost_usd == pytest.approx(sum(r.cost_usd for r in recorded))


def test_missing_request_is_a_clear_error(tmp_path, server, wire):
    cassette = tmp_path / "calls.jsonl"
    server.json(wire.chat_completion("hi"))
    get_model("openai/gpt-5", api_key="k", base_url=server.url, record_to=cassette).generate(conversation(1))
    replay = get_model("openai/gpt-5", replay_from=cassette)
    with pytest.raises(ModelAPIError, match=r"no response for this request.*'step 9'.*never recorded") as info:
        replay.generate(conversation(9))
    assert "diverged" in info.value.hint
    replay.generate(conversation(1))
    with pytest.raises(ModelAPIError, match="recorded 1 time"):
        replay.generate(conversation(1))


def test_identical_requests_replay_in_recorded_order(tmp_path, server, wire):
    cassette = tmp_path / "calls.jsonl"
    for text in ("one", "two"):
        server.json(wire.chat_completion(text))
    live = get_model("openai/gpt-5", api_key="k", base_url=server.url, record_to=cassette)
    assert [live.generate("same").text for _ in range(2)] == ["one", "two"]
    replay = get_model("openai/gpt-5", replay_from=cassette)
    assert [replay.generate("same").text for _ in range(2)] == ["one", "two"]


def test_replay_key_covers_the_model_and_the_config(tmp_path, server, wire):
    cassette = tmp_path / "calls.jsonl"
    server.json(wire.chat_completion("hot"))
    get_model("openai/gpt-5", api_key="k", base_url=server.url, record_to=cassette).generate(
        "q", config=GenerateConfig(temperature=1.0)
    )
    with pytest.raises(ModelAPIError, match="never recorded"):
        get_model("openai/gpt-5", replay_from=cassette).generate("q", config=GenerateConfig(temperature=0.0))
    with pytest.raises(ModelAPIError, match="never recorded"):
        get_model("openai/gpt-5-mini", replay_from=cassette).generate("q", config=GenerateConfig(temperature=1.0))
    # timeouts do not change the answer, so they are not part of the key
    replay = get_model("openai/gpt-5", replay_from=cassette)
    assert replay.generate("q", config=GenerateConfig(temperature=1.0, timeout_s=3)).text == "hot"


def test_unreadable_cassettes_are_user_errors(tmp_path):
    with pytest.raises(UserInputError, match="cannot read the cassette"):
        ReplayBackend(tmp_path / "missing.jsonl", "openai/gpt-5")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"key": "k"}) + "\n")
    with pytest.raises(UserInputError, match=r"line 1 of the cassette .* is not a recorded call"):
        ReplayBackend(bad, "openai/gpt-5")


def test_record_and_replay_exclude_each_other(tmp_path):
    with pytest.raises(UserInputError, match="exclude each other"):
        get_model("openai/gpt-5", record_to=tmp_path / "a", replay_from=tmp_path / "b")


def test_cassettes_from_before_usage_known_replay_unchanged(tmp_path):
    request = normalised_request("openai/gpt-5", [Message.user("hi")], [], GenerateConfig())
    old_response = {"text": "old", "usage": {"input_tokens": 3, "output_tokens": 1}, "model": "gpt-5"}
    cassette = tmp_path / "old.jsonl"
    cassette.write_text(json.dumps({"key": request_key(request), "request": request, "response": old_response}) + "\n")
    reply = get_model("openai/gpt-5", replay_from=cassette).generate("hi")
    assert reply.text == "old" and reply.usage_known is True and reply.cost_usd is not None
