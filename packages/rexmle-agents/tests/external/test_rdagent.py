"""The original R&D-Agent (rdagent 1.0.0, data_science scenario) offline: its environment builds (~8 min once:
`slow`), it starts inside bubblewrap on rexmle's task with local code execution (the conda shim, no Docker), its
runtime check runs code there, it calls the relay through LiteLLM with the alias, streaming, and a reply in the
wrong format is retried by rdagent itself until it gives up: an invalid run with its log tail. A scripted capable
model (rdagent_driver.py) drives its whole R&D loop to an accepted experiment: a run that ends at its deadline is
graded from that experiment (issue 34)."""

from __future__ import annotations

import json
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from rexmle_agents.external.envs import ensure_environment
from rexmle_agents.external.spec import SPEC_PACKAGE, load_spec
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import ModelResponse, Usage

from .rdagent_driver import BASELINE_MARK, LONG_MARK, SCENARIO, RDAgentScript

# The run's time limit in the deadline test: rdagent's import takes ~15 s here and its first experiment is accepted
# ~19 s after its start; the spec asks it to stop 120 s before the end, so this leaves ~100 s for a slower machine.
DEADLINE_RUN_S = 240


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


@pytest.mark.slow
@pytest.mark.parametrize("margin", ["spec", "none"])
def test_an_rdagent_run_that_ends_at_its_deadline_is_graded_from_its_best_experiment(
        run_external: Any, tmp_path: Path, margin: str) -> None:
    """Issue 34 item 1. A scripted capable model drives rdagent's whole data_science loop: its first experiment
    (a small baseline that writes a valid submission) is accepted as its SOTA, its second trains for an hour, so
    rdagent is still busy when the run's deadline nears. With the spec's stop margin rdagent is asked to stop (it
    dies of the SIGTERM, status -15), the forwarder runs the export of its last ``sota_exp_to_submit``, and the run
    is graded valid from exactly that experiment's submission. Without the margin (the spec with
    ``stop_margin_s: 0``) the sandbox is ended at the deadline with rdagent still running: graded missing."""
    env = ensure_environment(load_spec("rdagent"), source="rdagent")
    raw = yaml.safe_load(resources.files(SPEC_PACKAGE).joinpath("rdagent.yaml").read_text())
    assert raw["stop_margin_s"] == 120  # what the shipped spec promises, and what this test exercises
    if margin == "spec":
        agent, config = "rdagent", {}
    else:
        raw["stop_margin_s"] = 0
        (tmp_path / "rdagent-no-margin.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        agent, config = "external", {"spec": str(tmp_path / "rdagent-no-margin.yaml")}
    script = RDAgentScript()
    outcome = run_external(agent, script, config=config, roles=("code",),
                           limits=Limits(time_limit_s=DEADLINE_RUN_S))
    run_dir = outcome.run_dir
    journal = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    stdout = next((run_dir / "logs" / "exec").glob("*-agent-attempt1.stdout")).read_text()
    asked = [e for e in journal if e["kind"] == "log" and e["message"].startswith("asked the agent to stop")]
    print(f"{margin}: {outcome.state} after {outcome.seconds:.0f} s, {sum(script.calls.values())} model calls "
          f"{dict(script.calls)}; grade {outcome.grade.status if outcome.grade else None}")
    print("\n".join(line for line in stdout.splitlines() if line.startswith("rexmle ")))

    # rdagent's first experiment was accepted as its best, and it had moved on to a second one that still trained
    assert script.sota_accepted and not script.unknown, script.unknown
    assert script.calls["exp_feedback"] == 1 and script.calls["pipeline_coder"] >= 2
    assert sum(e["kind"] == "model_call" for e in journal) == sum(script.calls.values())
    workspaces = run_dir / "workspace" / "agent" / "attempt-1" / "workspace"
    codes = {p.parent.name: p.read_text() for p in workspaces.glob("*/main.py")}
    assert sum(BASELINE_MARK in code for code in codes.values()) == 1
    assert any(LONG_MARK in code for code in codes.values())

    if margin == "none":
        assert not asked and "rexmle forwarder: after the agent" not in stdout
        assert outcome.limit == "time"
        assert outcome.grade is not None and outcome.grade.status == "missing"
        # the answer was there: the same export, run late on the imported log, finds the baseline experiment. Its
        # pickles are signed with a key rdagent made in the sandbox's home, hence HOME; this run's own scripted log
        late = tmp_path / "late-export"
        late.mkdir()
        home = run_dir / "workspace" / ".home"
        done = subprocess.run([str(env.python), str(run_dir / "workspace" / "agent" / "attempt-1" / "export_final.py"),
                               str(run_dir / "logs" / "agent" / "attempt-1" / "log"), str(late / "final")],
                              cwd=late, capture_output=True, text=True, timeout=300, check=False,
                              env={"HOME": str(home), "PATH": "/usr/bin:/bin", "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
        assert done.returncode == 0, done.stderr[-3000:]
        lost = json.loads((late / "final" / "final.json").read_text())["workspace"]
        assert BASELINE_MARK in codes[Path(lost).name]
        return
    # asked once, 120 s before the deadline, while rdagent still ran; it died of the signal and the export ran
    assert len(asked) == 1 and asked[0]["signalled"] == 1 and asked[0]["margin_s"] == 120
    assert "rexmle forwarder: after the agent (exit status -15)" in stdout
    assert "rexmle export: the chosen experiment's files are in" in stdout
    assert outcome.grade is not None and outcome.grade.status == "valid", outcome.grade
    # graded from rdagent's best experiment: the submission and code of the workspace the export's final.json names
    exported = run_dir / "workspace" / "agent" / "attempt-1" / "final"
    chosen = json.loads((exported / "final.json").read_text())
    best = run_dir / "workspace" / Path(chosen["workspace"]).relative_to("/workspace")
    assert BASELINE_MARK in (best / "main.py").read_text() and chosen["messages"] >= 1
    graded = Path(outcome.grade.submission_path) / "submission.csv"
    assert graded.read_bytes() == (best / "submission.csv").read_bytes()
    assert (run_dir / "final" / "best_solution.py").read_bytes() == (best / "main.py").read_bytes()
