"""The attack of issue 31 (class 2), planted from inside a real bubblewrap sandbox: an external agent fires 40
chat-completions calls at the relay at once, with a small token budget. Budgets are reserved before a call is sent,
so what the journal records spent stays within the budget plus one call's reservation, and every other call is
answered 402 (before reservations, all 40 were answered: over 20x the budget)."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rexmle_agents.harness.runner import build_spec, execute_run
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import GenerateConfig, Message, Model, ModelResponse, RetryPolicy, ScriptedBackend, ToolSpec
from rexmle_agents.models import Usage as TokenUsage
from rexmle_agents.models.accounting import estimate_input_tokens

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

CALLS = 40
MAX_TOKENS = 40
BUDGET = 1000

FLOOD = r'''
import json, os, threading, urllib.error, urllib.request
base = os.environ["REXMLE_RELAY_URL"]
calls, max_tokens = int(os.environ["FLOOD_CALLS"]), int(os.environ["FLOOD_MAX_TOKENS"])
start = threading.Barrier(calls)
statuses = []
def call(i):
    body = json.dumps({"model": "rexmle-code", "max_tokens": max_tokens, "messages": [
        {"role": "user", "content": f"call {i:03d}: " + "spend the whole budget before the ledger notices. " * 6}]})
    request = urllib.request.Request(base + "/v1/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    start.wait()
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            statuses.append(answer.status)
    except urllib.error.HTTPError as exc:
        statuses.append(exc.code)
threads = [threading.Thread(target=call, args=(i,)) for i in range(calls)]
for t in threads:
    t.start()
for t in threads:
    t.join()
os.makedirs("out", exist_ok=True)
open("out/statuses.json", "w").write(json.dumps(statuses))
'''


class Answers:
    """A slow model whose usage stays inside each call's worst case: input a quarter of the prompt's bytes (what
    English costs), output the whole length limit. Keeps the largest reservation a call made."""

    def __init__(self) -> None:
        self.largest_reservation = 0
        self.lock = threading.Lock()

    def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig) -> ModelResponse:
        with self.lock:
            self.largest_reservation = max(self.largest_reservation,
                                           estimate_input_tokens(messages, tools) + (config.max_tokens or 0))
        threading.Event().wait(0.05)
        prompt = sum(len(m.content.encode()) for m in messages)
        return ModelResponse(text="spent", usage=TokenUsage(input_tokens=prompt // 4,
                                                            output_tokens=config.max_tokens or 0), model="scripted")


def test_forty_calls_at_once_through_the_relay_spend_at_most_the_budget_plus_one_reservation(
        aideml_env: Any, spec_file: Any, data_root: Path, tmp_path: Path) -> None:
    path = spec_file(files={"agent/flood.py": FLOOD.replace("{", "{{").replace("}", "}}")},
                     command=["{python}", "{agent_dir}/flood.py"],
                     env={"FLOOD_CALLS": str(CALLS), "FLOOD_MAX_TOKENS": str(MAX_TOKENS)},
                     outputs={"submission": "agent/out", "snapshot": "at_end"})
    spec = build_spec("ldct-iqa", agent="external", agent_config={"spec": str(path)},
                      models={"code": "scripted/model"}, seed=0,
                      limits=Limits(time_limit_s=600, max_tokens=BUDGET), sandbox="bwrap", data_root=data_root,
                      group="test")
    answers = Answers()
    model = Model(ScriptedBackend(answers), retry=RetryPolicy(max_attempts=1))
    outcome = execute_run(spec, tmp_path / "runs", models={"code": model}, grace_s=5.0)

    statuses = json.loads((outcome.run_dir / "workspace" / "agent" / "out" / "statuses.json").read_text())
    journal = [json.loads(line) for line in (outcome.run_dir / "journal.jsonl").read_text().splitlines()]
    calls = [e for e in journal if e["kind"] == "model_call"]
    spent = sum(c["usage"]["input_tokens"] + c["usage"]["output_tokens"] for c in calls)
    print(f"{statuses.count(200)} of {CALLS} calls answered, {spent} tokens spent of a {BUDGET}-token budget "
          f"(largest reservation {answers.largest_reservation})")
    assert len(statuses) == CALLS and set(statuses) <= {200, 402}, statuses
    assert statuses.count(200) == len(calls) >= 1
    assert BUDGET <= spent <= BUDGET + answers.largest_reservation, (spent, answers.largest_reservation)
    assert statuses.count(402) == CALLS - len(calls) > CALLS // 2
    refused = [e for e in journal if e["kind"] == "log" and e.get("relay") == "budget_exhausted"]
    assert refused  # journaled (the relay rate-limits its refusal records, so not necessarily one per call)
    assert outcome.limit == "tokens", (outcome.state, outcome.reason)
