"""The original R&D-Agent (rdagent 1.0.0, data_science scenario) as far as it runs offline: its environment
builds (~8 min once: `slow`), it starts inside bubblewrap on rexmle's task with local code execution (the conda
shim, no Docker), its runtime check runs code there, it calls the relay through LiteLLM with the alias, streaming,
and a reply in the wrong format is retried by rdagent itself until it gives up: an invalid run with its log tail.
A whole R&D loop needs answers in rdagent's own schemas and is not scripted here."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rexmle_agents.external.envs import ensure_environment
from rexmle_agents.external.spec import load_spec
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import ModelResponse, Usage

SCENARIO = {"Task Type": "Regression", "Data Type": "Image", "Brief Description": "CT quality scores",
            "Dataset Description": "tif slices", "Submission Specifications": "image_id,quality_score",
            "Submission channel number to each sample": 1, "Metric Evaluation": "correlations", "Metric Name": "score",
            "Metric Direction": True, "Longer time limit required": False}


@pytest.mark.slow
def test_rdagent_as_far_as_it_runs_offline(run_external: Any) -> None:
    ensure_environment(load_spec("rdagent"), source="rdagent")
    prompts: list[str] = []

    def answer(messages: Any, tools: Any, config: Any) -> ModelResponse:
        prompts.append("\n".join(m.content for m in messages))
        text = json.dumps(SCENARIO) if len(prompts) == 1 else "not the JSON rdagent wants"
        return ModelResponse(text=text, usage=Usage(input_tokens=10, output_tokens=10))

    outcome = run_external("rdagent", answer, roles=("code",), limits=Limits(time_limit_s=600))
    assert outcome.state == "failed" and "rdagent exited with status 1 without leaving a submission" in outcome.reason
    assert "Failed to create chat completion after 10 retries" in outcome.reason
    assert outcome.grade is not None and outcome.grade.status in ("invalid", "missing")
    # its first call analysed rexmle's task (read from DS_LOCAL_DATA_PATH), then its own retry loop ran out
    assert "LDCT-IQA" in prompts[0] and len(prompts) == 11
    run_dir = outcome.run_dir
    journal = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    assert sum(e["kind"] == "model_call" for e in journal) == 11
    exited = next(e for e in journal if e["kind"] == "log" and e["message"] == "rdagent exited")
    assert exited["streamed"] == 11  # LiteLLM streams by default; the relay answered with events
    # the local data folder holds the task and nothing else (never an eval/ folder)
    data = run_dir / "workspace" / "agent" / "attempt-1" / "data"
    assert [p.name for p in data.iterdir()] == ["ldct-iqa"]
    # its runtime check ran `python -m coverage --version` in its local (conda-shim) environment, in the sandbox
    stdout = next((run_dir / "logs" / "exec").glob("*-agent-attempt1.stdout")).read_text()
    assert "coverage" in stdout.lower() and "LocalEnv" in stdout
    assert (run_dir / "logs" / "agent" / "attempt-1").is_dir()
