"""Cost forecasts: a plan's dry run against a figure computed by hand, the caps (--max-steps, --max-cost), the
runs an agent without a model makes, and the history of recorded runs replacing the stated assumption."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rexmle_agents.forecast import ASSUMED_USAGE, PlannedRun, forecast, load_history
from rexmle_grade.cli import main

TASK = "ldct-iqa"
# the shipped price table's openai/gpt-5 and anthropic/claude-sonnet-4-5, USD per million tokens (input, output)
GPT5 = (1.25, 10.00)
SONNET = (3.00, 15.00)


def test_a_plans_dry_run_prints_the_hand_computed_cost(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "tiny.yaml"
    plan.write_text("""format: 1
name: tiny
group: tiny
seeds: 2
options: {time_limit: 3h, gpus_per_run: 2, max_steps: 10}
runs:
  - agent: aide
    models: [openai/gpt-5]
    tasks: ldct-iqa,seg_a
  - agent: sample
    tasks: ldct-iqa
""")
    # by hand: an aide run holds 2 GPUs for 3 h = 6 GPU-h and makes min(4 steps/h x 3 h, 10) = 10 steps of 20,000
    # input and 2,000 output tokens: 200,000 x $1.25/M + 20,000 x $10/M = $0.45. A sample run: 6 GPU-h, $0.
    # Per seed: 2 aide runs + 1 sample run = 18 GPU-h, $0.90; two seeds: 36 GPU-h, $1.80.
    steps = min(ASSUMED_USAGE.steps_per_hour * 3, 10)
    per_run = steps * (ASSUMED_USAGE.input_tokens_per_step * GPT5[0]
                       + ASSUMED_USAGE.output_tokens_per_step * GPT5[1]) / 1e6
    assert per_run == pytest.approx(0.45)
    runs = tmp_path / "runs"
    assert main(["run", "--plan", str(plan), "--dry-run", "--runs-dir", str(runs)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "seed 0: 18.0 GPU-h, API $0.90" in out and "seed 1: 18.0 GPU-h, API $0.90" in out
    assert "total: 6 run(s), 36.0 GPU-h, API $1.80" in out
    assert not runs.exists()  # a dry run writes nothing


def test_a_runs_dry_run_caps_dollars_at_max_cost_and_writes_nothing(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # uncapped, a 1 h run of 4 steps costs 80,000 x $3/M + 8,000 x $15/M = $0.36; --max-cost 0.3 stops it at $0.30
    uncapped = 4 * (ASSUMED_USAGE.input_tokens_per_step * SONNET[0]
                    + ASSUMED_USAGE.output_tokens_per_step * SONNET[1]) / 1e6
    assert uncapped == pytest.approx(0.36)
    runs = tmp_path / "runs"
    assert main(["run", "--agent", "aide", "--tasks", "lite", "--model", "anthropic/claude-sonnet-4-5", "--seeds", "2",
                 "--time-limit", "1h", "--max-cost", "0.3", "--gpus-per-run", "1", "--dry-run",
                 "--runs-dir", str(runs)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # 12 lite tasks x 2 seeds; each run 1 GPU-h and $0.30
    assert "seed 0: 12.0 GPU-h, API $3.60" in out and "total: 24 run(s), 24.0 GPU-h, API $7.20" in out
    assert not runs.exists()
    capped = forecast([PlannedRun(task_id=TASK, agent="aide", models={"default": "anthropic/claude-sonnet-4-5"},
                                  seed=0, time_limit_s=3600, max_cost_usd=0.3)]).runs[0]
    assert capped.api_usd == pytest.approx(0.3) and capped.basis.endswith("capped by --max-cost")


def test_a_model_without_a_price_leaves_the_dollars_unknown_not_zero() -> None:
    run = PlannedRun(task_id=TASK, agent="aide", models={"default": "openai/no-such-model"}, seed=0,
                     time_limit_s=3600)
    result = forecast([run])
    assert result.runs[0].api_usd is None and "no price for openai/no-such-model" in result.runs[0].basis
    assert result.total() == (0.0, None)


def test_a_multi_model_run_spreads_its_calls_over_its_models() -> None:
    run = PlannedRun(task_id=TASK, agent="aide", models={"code": "openai/gpt-5",
                                                         "feedback": "anthropic/claude-sonnet-4-5"},
                     seed=0, time_limit_s=3600, gpus=1)
    steps = ASSUMED_USAGE.steps_per_hour
    tokens = (steps * ASSUMED_USAGE.input_tokens_per_step, steps * ASSUMED_USAGE.output_tokens_per_step)
    expected = sum((tokens[0] * p[0] + tokens[1] * p[1]) / 1e6 / 2 for p in (GPT5, SONNET))
    assert forecast([run]).runs[0].api_usd == pytest.approx(expected)


@pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("CI"),
                    reason="bubblewrap is not installed (apt-get install -y bubblewrap)")
def test_recorded_runs_of_the_same_agent_replace_the_assumption(tmp_path: Path) -> None:
    from rexmle_agents.harness.runner import build_spec, execute_run
    from rexmle_agents.harness.spec import Limits
    from rexmle_agents.models import Model, RetryPolicy, ScriptedBackend
    from rexmle_agents.models.types import ModelResponse, Usage
    from rexmle_tasks.pipeline import prepare_task, task_dirs
    from rexmle_tasks.registry import get_task

    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o755)
    task = get_task(TASK)
    prepare_task(task, task_dirs(task, data), synthetic=True, cases=10, seed=0, force=False)
    script = ("import csv, os\n"
              "rows = list(csv.DictReader(open('data/sample_submission/submission.csv')))\n"
              "os.makedirs('submission', exist_ok=True)\n"
              "w = csv.DictWriter(open('submission/submission.csv', 'w', newline=''), fieldnames=list(rows[0]))\n"
              "w.writeheader(); w.writerows(rows)\n")

    def reply(messages: object, tools: object, config: object) -> ModelResponse:
        # every call reports its usage, as a provider does
        return ModelResponse(text=f"A plan.\n```python\n{script}```", usage=Usage(input_tokens=3000,
                                                                                   output_tokens=300))

    runs = tmp_path / "runs"
    spec = build_spec(TASK, agent="aide", agent_config={"num_drafts": 2}, models={"code": "scripted/model"},
                      limits=Limits(time_limit_s=300, max_steps=2, exec_timeout_s=60), data_root=data, group="h")
    outcome = execute_run(spec, runs, models={"code": Model(ScriptedBackend(reply),
                                                             retry=RetryPolicy(max_attempts=1))})
    assert outcome.state in ("finished", "timed_out"), outcome.reason
    status = json.loads((outcome.run_dir / "status.json").read_text())
    assert status["steps"] >= 1 and status["input_tokens"] > 0
    history = load_history(runs)
    usage = history["aide"]
    # by hand, from the run's own record: tokens per step and steps per hour used
    assert usage.input_tokens_per_step == pytest.approx(status["input_tokens"] / status["steps"])
    assert usage.output_tokens_per_step == pytest.approx(status["output_tokens"] / status["steps"])
    assert usage.steps_per_hour == pytest.approx(status["steps"] / (status["elapsed_s"] / 3600))
    assert usage.basis.startswith("history: 1 run(s) of aide")
    planned = PlannedRun(task_id=TASK, agent="aide", models={"default": "openai/gpt-5"}, seed=0, time_limit_s=7200,
                         max_steps=5)
    priced = forecast([planned], history=history).runs[0]
    steps = min(usage.steps_per_hour * 2, 5)
    assert priced.steps == pytest.approx(steps)
    assert priced.api_usd == pytest.approx(steps * (usage.input_tokens_per_step * GPT5[0]
                                                    + usage.output_tokens_per_step * GPT5[1]) / 1e6)
    # after the run, the report shows its actual cost per seed beside the score: GPU-hours are the GPUs it held
    # times the time it used (none on a machine without GPUs: 0, not unknown)
    from rexmle_agents.results.loader import load_runs
    from rexmle_agents.results.report import build_group_report

    report = build_group_report(load_runs([runs]))
    overall = next(r for r in report.rows if r.scope == "all" and r.reference is None)
    held = status["hardware"]["gpus"] * status["elapsed_s"] / 3600
    assert overall.gpu_hours_per_seed == pytest.approx(held)
    assert overall.cost_per_seed is None  # the scripted model has no price: unknown, never $0
    # an agent without recorded runs keeps the stated assumption
    other = forecast([PlannedRun(task_id=TASK, agent="mcts", models={"default": "openai/gpt-5"}, seed=0,
                                 time_limit_s=7200)], history=history).runs[0]
    assert other.basis == ASSUMED_USAGE.basis
