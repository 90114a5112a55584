"""A plug-in agent for the SLURM tests, installed the way any third-party agent is (an entry point of the
``rexmle.agents`` group, on PYTHONPATH), because SLURM's jobs are fresh processes that only know installed agents.

``slurm-test-steps`` submits the sample submission in its first step, then spends ``seconds`` in a sandboxed
``sleep`` per step, saving its progress inside each step: a resumed run continues after its last finished step."""

from __future__ import annotations

from typing import Any, ClassVar

from rexmle_agents.harness.agent import BaseAgent
from rexmle_agents.harness.context import RunContext

DIST_NAME = "rexmle_slurm_test_agents"
ENTRY_POINTS = "[rexmle.agents]\nslurm-test-steps = plugin_agents:StepsAgent\n"


class StepsAgent(BaseAgent):
    name: ClassVar[str] = "slurm-test-steps"
    version: ClassVar[str] = "1.0.0"
    description: ClassVar[str] = "test agent: the sample submission first, then one sandboxed sleep per step"
    defaults: ClassVar[dict[str, Any]] = {"steps": 3, "seconds": 2.0}

    def run(self, ctx: RunContext) -> None:
        state = ctx.load_state() or {"done": 0}
        for index in range(state["done"], self.config["steps"]):
            with ctx.step("sleep", index=index) as step:
                if index == 0:
                    ws = ctx.workspace
                    ctx.execute(f"cp -R {ws}/data/sample_submission/. {ws}/submission/")
                    ctx.select_final(ctx.snapshot_submission("sample submission"), reason="the only candidate")
                result = ctx.execute(f"sleep {self.config['seconds']}")
                step.result.update(exit_code=result.exit_code, stopped_by=result.stopped_by)
                state["done"] = index + 1
                ctx.save_state(state)
